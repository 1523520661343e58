"""Printing a transcript (:mod:`lightning_store.transcript` events) for ``store rollouts transcript``: indented
text for a terminal, or one JSON object per event line."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from lightning_store.cli.common import out
from lightning_store.transcript import Event, text_of

INDENT = 8


def print_json_lines(events: Sequence[Event]) -> None:
    """One JSON object per line, in order."""
    for event in events:
        sys.stdout.write(json.dumps(event, default=str) + "\n")


def print_transcript(header: Event, events: Sequence[Event]) -> None:
    """The ``attempt`` header, each event at its offset from the attempt's start, and the ``totals`` last."""
    out.print(_header(header), soft_wrap=True)
    origin = header.get("start_time")
    for event in events:
        if event["event"] == "totals":
            out.print(_totals(event), soft_wrap=True)
        else:
            out.print(_event(event, origin))


def clock(seconds: float | None, *, short: bool = False) -> str:
    """Local date and time of day, to the second (``short``: without the year)."""
    if seconds is None:
        return ""
    return datetime.fromtimestamp(seconds).strftime("%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M:%S")


def _header(h: Event) -> Text:
    where = f"attempt {h['attempt_id']} (#{h['sequence_id']}, {h['status']})"
    parts = [
        f"rollout {h['rollout_id']}",
        where,
        f"worker {h['worker_id'] or '-'}",
        f"started {clock(h['start_time'])}",
    ]
    text = Text(" · ".join(parts), style="bold")
    if h.get("error"):
        text.append(f"\nerror: {h['error']}", style="red")
    return text.append("\n")


def _event(event: Event, origin: float | None) -> RenderableType:
    at = "" if event["time"] is None or origin is None else f"+{event['time'] - origin:.2f}s"
    title, style, body = _describe(event)
    line = Text.assemble((f"{at:>{INDENT - 1}} ", "dim"), (title, style))
    if not body:
        return line
    return Group(line, *(Padding(text, (0, 0, 0, INDENT), expand=False) for text in body))


def _describe(event: Event) -> tuple[str, str, list[Text]]:
    """The event's title line, its style, and the lines under it."""
    kind = event["event"]
    if kind == "llm_call":
        return _llm_call(event)
    if kind == "llm_error":
        return f"LLM call failed · {event['model'] or ''}", "red", [Text(str(event["error"]))]
    if kind in ("tool", "operation"):
        call = f" ({event['call_id']})" if event.get("call_id") else ""
        ok = event["status"] != "ERROR"
        body = [_field("input", event["input"]), _field("output", event["output"])]
        if event["error"]:
            body.append(_field("error", event["error"]))
        title = f"{kind} {event['name']}{call} {event['status']}"
        return title, "cyan" if ok else "red", [line for line in body if line is not None]
    if kind == "reward":
        others = {name: value for name, value in event["dimensions"].items() if name != event["name"]}
        extra = f" ({event['name']})" if event["name"] else ""
        body = [_field(name, value) for name, value in {**others, **event["attributes"]}.items()]
        return f"reward {event['value']:g}{extra}", "bold green", [line for line in body if line is not None]
    if kind == "exception":
        return f"exception {event['type'] or ''}", "bold red", [Text(str(event["message"] or ""))]
    if kind == "error":
        return f"error in {event['name']}", "red", [Text(str(event["error"] or ""))]
    if kind == "message":
        return "message", "", [Text(str(event["text"]))]
    return f"object {event.get('type') or ''}", "", [Text(_compact(event.get("value")))]


def _llm_call(event: Event) -> tuple[str, str, list[Text]]:
    who = " · ".join(str(x) for x in (event["model"], event["agent"]) if x)
    tokens = f"{event['prompt_tokens']} prompt + {event['completion_tokens']} completion tokens"
    latency = f" · {event['latency_seconds']:.2f} s" if event.get("latency_seconds") is not None else ""
    body: list[Text] = []
    if event["earlier_messages"]:
        body.append(Text(f"({event['earlier_messages']} earlier messages)", style="dim"))
    body += [_message(message) for message in event["messages"]]
    if event["response"]:
        body.append(Text.assemble(("→ assistant: ", "bold magenta"), event["response"]))
    for call in event["tool_calls"]:
        ident = f" ({call['id']})" if call.get("id") else ""
        body.append(
            Text.assemble(("→ tool call: ", "bold magenta"), f"{call['name']} {call['arguments'] or ''}{ident}")
        )
    if "prompt_token_ids" in event:
        body.append(Text(f"prompt ids: {event['prompt_token_ids']}", style="dim"))
        body.append(Text(f"response ids: {event['response_token_ids']}", style="dim"))
    return f"LLM call · {who} · {tokens}{latency}", "bold yellow", body


def _message(message: dict[str, Any]) -> Text:
    role = str(message.get("role", "?"))
    parts = [text_of(message.get("content")) or ""]
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        parts.append(f"[tool call {function.get('name')} {function.get('arguments') or ''}]")
    return Text.assemble((f"{role}: ", "bold"), " ".join(p for p in parts if p))


def _field(name: str, value: Any) -> Text | None:
    return None if value is None else Text.assemble((f"{name}: ", "dim"), _compact(value))


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _totals(t: Event) -> Text:
    reward = "none" if t["reward"] is None else f"{t['reward']:g}"
    parts = [
        _count(t["llm_calls"], "LLM call"),
        f"{t['prompt_tokens']} prompt tokens",
        f"{t['completion_tokens']} completion tokens",
        f"{_count(t['tool_calls'], 'tool call')} ({t['tool_errors']} failed)",
        _count(t["exceptions"], "exception"),
        f"reward {reward}",
    ]
    return Text("\ntotal: " + " · ".join(parts), style="bold")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
