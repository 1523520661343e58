"""What one attempt did, read back from its spans and LLM-call records: its reward, why it failed, and its
transcript (LLM calls, tool calls, rewards, messages, exceptions) as events in time order.

Pure functions over what the store returned (no store access), so that ``store rollouts`` reads the same thing
from a server or a database, and so that the rules are easy to test. The rules agree with the SQL views
(docs/reference/sql.md): a reward is the numeric ``agentlightning.reward.0.value`` of an annotation span (or
the legacy numeric ``reward`` of a span named ``agentlightning.reward``); an attempt's reward is its last one,
as the adapters read it.

An event is a JSON-able dict with ``event`` (its kind), ``time`` (seconds since the epoch, or None) and
``sequence_id``, plus the fields of its kind:

* ``llm_call``: ``model``, ``agent``, ``messages`` (the prompt's messages that no earlier call of the attempt
  sent, unless ``full``), ``earlier_messages`` (how many were left out), ``response`` (the reply's text),
  ``tool_calls`` (``id``, ``name``, ``arguments``), ``finish_reason``, ``prompt_tokens``,
  ``completion_tokens``, ``latency_seconds``; with ``tokens``, ``prompt_token_ids`` and ``response_token_ids``;
* ``llm_error``: an LLM call the proxy could not complete: ``model``, ``error``;
* ``tool`` and ``operation``: ``name``, ``call_id`` (tools), ``input``, ``output``, ``status`` (OK, ERROR,
  UNSET), ``error``;
* ``reward``: ``value`` (the primary reward), ``name``, ``dimensions`` (every dimension by name),
  ``attributes`` (the span's other attributes: feedback text and the like);
* ``message``: ``text``; ``object``: ``type``, ``value``;
* ``exception``: ``type``, ``message``, ``stacktrace``; ``error``: another span that ended in ERROR (``name``,
  ``error``).

Spans of other kinds (agent and chain spans, OpenInference LLM spans, which repeat the proxy's records) are
left out; ``query_spans`` has them all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from lightning_store import semconv
from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt
from lightning_store.spans import Span

Event = dict[str, Any]

LEGACY_REWARD = "agentlightning.reward"
"""Older emitters' reward span name (a numeric ``reward`` attribute), which the ``rewards_v`` view reads too."""
OUTCOME_SPANS = (semconv.ANNOTATION, LEGACY_REWARD, semconv.EXCEPTION)
"""The span names that decide an attempt's reward and error: what to ask ``search_spans`` for."""
LLM_CALL_ATTRIBUTE = "lightning_store.llm_call"
"""Set on the span the LLM proxy writes for each call (its span id is the call record's)."""
OPENINFERENCE_KIND = "openinference.span.kind"
_BINDING = (semconv.ROLLOUT_ID, semconv.ATTEMPT_ID, semconv.SPAN_SEQUENCE_ID)
QUIET_STATUSES = {"timeout": "the attempt timed out", "unresponsive": "the attempt stopped sending heartbeats"}


def reward_of(span: Span) -> float | None:
    """The span's primary reward, read as the ``rewards_v`` view reads it; None when it carries none."""
    value = span.attributes.get(semconv.reward_value(0))
    if value is None and span.name == LEGACY_REWARD:
        value = span.attributes.get("reward")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def error_of(span: Span) -> str | None:
    """The error a span records: its status description (``"ValueError: bad input"``), else its ``exception``
    event's type and message, else its ``error.type``; None for a span without an error."""
    if span.status.description:
        return span.status.description
    for event in span.events:
        if event.name == "exception":
            kind, message = event.attributes.get("exception.type"), event.attributes.get("exception.message")
            return ": ".join(str(part) for part in (kind, message) if part) or None
    if span.status.status_code == "ERROR" or span.name == semconv.EXCEPTION:
        kind = span.attributes.get(semconv.ERROR_TYPE)
        return str(kind) if kind else None
    return None


def last_reward(spans: Iterable[Span]) -> float | None:
    """The reward of the last reward span (by sequence id) among ``spans``; None when there is none."""
    rewards = [(s.sequence_id, r) for s in spans if (r := reward_of(s)) is not None]
    return max(rewards, key=lambda pair: pair[0])[1] if rewards else None


def attempt_error(attempt: Attempt, spans: Iterable[Span]) -> str | None:
    """Why ``attempt`` did not succeed: the last exception span's error among ``spans`` (the attempt's), else the
    reason it was released with (``metadata["released"]``), else what its status says (timed out,
    unresponsive). None for an attempt that succeeded or is still preparing or running."""
    if attempt.status not in ("failed", "timeout", "unresponsive"):
        return None
    exceptions = [s for s in spans if s.name == semconv.EXCEPTION and s.attempt_id == attempt.attempt_id]
    for span in sorted(exceptions, key=lambda s: s.sequence_id, reverse=True):
        if (error := error_of(span)) is not None:
            return error
    released = (attempt.metadata or {}).get("released")
    if released:
        return f"released: {released}"
    return QUIET_STATUSES.get(attempt.status)


def first_line(text: str | None, width: int | None = None) -> str | None:
    """The first line of ``text``, cut to ``width`` characters (ending in …) when given."""
    if text is None:
        return None
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if width is None or len(line) <= width else line[: width - 1] + "…"


def build_transcript(
    spans: Sequence[Span], calls: Sequence[LlmCall], *, full: bool = False, tokens: bool = False
) -> list[Event]:
    """The events of one attempt (``spans`` and ``calls`` are its spans and LLM-call records) in time order
    (start time, then sequence id), followed by one ``totals`` event: ``llm_calls``, ``prompt_tokens``,
    ``completion_tokens`` (sums over the calls), ``tool_calls``, ``tool_errors``, ``exceptions`` and
    ``reward`` (the last one). ``full`` keeps every prompt message of every call; ``tokens`` adds token ids."""
    recorded = {call.span_id for call in calls if call.span_id}
    events = [_call_event(call, tokens) for call in calls]
    for span in spans:
        if span.span_id in recorded:
            continue  # the proxy's span of a recorded call: the call event says more
        if (event := _span_event(span)) is not None:
            events.append(event)
    events.sort(key=lambda e: (e["time"] if e["time"] is not None else float("inf"), e["sequence_id"] or 0))
    _trim_messages([e for e in events if e["event"] == "llm_call"], full)
    events.append(_totals(events, last_reward(spans)))
    return events


def _totals(events: list[Event], reward: float | None) -> Event:
    calls = [e for e in events if e["event"] == "llm_call"]
    tools = [e for e in events if e["event"] == "tool"]
    return {
        "event": "totals",
        "time": None,
        "sequence_id": None,
        "llm_calls": len(calls),
        "prompt_tokens": sum(e["prompt_tokens"] for e in calls),
        "completion_tokens": sum(e["completion_tokens"] for e in calls),
        "tool_calls": len(tools),
        "tool_errors": sum(1 for e in tools if e["status"] == "ERROR"),
        "exceptions": sum(1 for e in events if e["event"] == "exception"),
        "reward": reward,
    }


def _call_event(call: LlmCall, tokens: bool) -> Event:
    request = call.request or {}
    choice = _first_choice(call.response)
    raw = choice.get("message")
    message: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if isinstance(request.get("messages"), list):
        messages = [m for m in request["messages"] if isinstance(m, dict)]
    elif "prompt" in request:
        messages = [{"role": "prompt", "content": request["prompt"]}]
    else:
        messages = []
    event: Event = {
        "event": "llm_call",
        "time": call.start_time,
        "sequence_id": call.sequence_id,
        "span_id": call.span_id,
        "model": call.model,
        "agent": call.agent_name,
        "messages": messages,
        "earlier_messages": 0,
        "response": text_of(message.get("content")) if message else choice.get("text"),
        "tool_calls": [_tool_call(c) for c in message.get("tool_calls") or [] if isinstance(c, dict)],
        "finish_reason": call.finish_reason,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.response_token_ids),
        "latency_seconds": call.latency_seconds,
    }
    if tokens:
        event["prompt_token_ids"] = list(call.prompt_token_ids)
        event["response_token_ids"] = list(call.response_token_ids)
    return event


def _first_choice(response: dict[str, Any] | None) -> dict[str, Any]:
    choices = (response or {}).get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else {}


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    raw = call.get("function")
    function: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return {"id": call.get("id"), "name": function.get("name"), "arguments": function.get("arguments")}


def text_of(content: Any) -> str | None:
    """A message's content as text: a string as it is, a list of content parts as their texts joined."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content, default=str)


def _trim_messages(calls: list[Event], full: bool) -> None:
    """Leave in each call only the messages no earlier call sent: when an earlier call's prompt is a proper
    prefix of this one's, drop it, and the assistant message after it (that call's reply, shown there)."""
    if full:
        return
    sent: list[list[str]] = []
    for event in calls:
        keys = [json.dumps(m, sort_keys=True, default=str) for m in event["messages"]]
        shown = max((len(p) for p in sent if len(p) < len(keys) and keys[: len(p)] == p), default=0)
        sent.append(keys)
        if shown and event["messages"][shown].get("role") == "assistant" and shown + 1 < len(keys):
            shown += 1
        event["earlier_messages"] = shown
        event["messages"] = event["messages"][shown:]


def _span_event(span: Span) -> Event | None:
    base: Event = {"time": span.start_time or span.end_time, "sequence_id": span.sequence_id}
    attributes = span.attributes
    status = span.status.status_code
    if attributes.get(LLM_CALL_ATTRIBUTE) is True:
        if status != "ERROR":
            return None  # an answered call whose record was not written: nothing more to show than its span
        return {"event": "llm_error", **base, "model": attributes.get("gen_ai.request.model"), "error": error_of(span)}
    if (reward := reward_of(span)) is not None:
        dimensions = _dimensions(attributes)
        others = {k: v for k, v in attributes.items() if not k.startswith(semconv.REWARD_PREFIX)}
        others = {k: v for k, v in others.items() if k not in _BINDING}
        name = attributes.get(semconv.reward_name(0))
        return {
            "event": "reward",
            **base,
            "value": reward,
            "name": name,
            "dimensions": dimensions,
            "attributes": others,
        }
    if span.name == semconv.EXCEPTION:
        exception = next((e.attributes for e in span.events if e.name == "exception"), {})
        return {
            "event": "exception",
            **base,
            "type": exception.get("exception.type") or attributes.get(semconv.ERROR_TYPE),
            "message": exception.get("exception.message") or error_of(span),
            "stacktrace": exception.get("exception.stacktrace"),
        }
    is_tool = span.name.startswith("execute_tool") or attributes.get(OPENINFERENCE_KIND) == "TOOL"
    if is_tool or span.name == semconv.OPERATION:
        name = (
            attributes.get(semconv.TOOL_NAME) or attributes.get("tool.name") or attributes.get(semconv.OPERATION_NAME)
        )
        return {
            "event": "tool" if is_tool else "operation",
            **base,
            "name": str(name or span.name.removeprefix("execute_tool ")),
            "call_id": attributes.get(semconv.TOOL_CALL_ID),
            "input": _decoded(attributes.get(semconv.OPERATION_INPUT, attributes.get("input.value"))),
            "output": _decoded(attributes.get(semconv.OPERATION_OUTPUT, attributes.get("output.value"))),
            "status": status,
            "error": error_of(span) if status == "ERROR" else None,
        }
    if span.name == semconv.MESSAGE:
        return {"event": "message", **base, "text": attributes.get(semconv.MESSAGE_BODY)}
    if span.name == semconv.OBJECT:
        value = attributes.get(semconv.OBJECT_LITERAL, _decoded(attributes.get(semconv.OBJECT_JSON)))
        return {"event": "object", **base, "type": attributes.get(semconv.OBJECT_TYPE), "value": value}
    if status == "ERROR":
        return {"event": "error", **base, "name": span.name, "error": error_of(span)}
    return None


def _dimensions(attributes: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    index = 0
    while semconv.reward_value(index) in attributes:
        found[str(attributes.get(semconv.reward_name(index), index))] = attributes[semconv.reward_value(index)]
        index += 1
    return found


def _decoded(value: Any) -> Any:
    """A JSON-encoded attribute as the value it encodes; anything else (plain text) as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value
