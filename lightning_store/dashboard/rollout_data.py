"""What the rollout page shows, read for one rollout: the rollout, its attempts, rewards, errors, the span
waterfall of each attempt, and its LLM calls with their text.

Numbers come from the documented views (``rollouts_v``, ``attempts_v``, ``rewards_v``, ``llm_calls_v``), so the
page says what SQL says. Spans come from the store contract (``query_spans``: the views leave out span events,
where exceptions are), and the text of LLM calls from ``query_llm_calls`` turned into messages by
:func:`lightning_store.transcript.build_transcript`, as ``store rollouts show`` reads them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from lightning_store import semconv
from lightning_store.contract import LightningStore
from lightning_store.dashboard.timing import TimedReader
from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt
from lightning_store.spans import Span
from lightning_store.transcript import (
    LLM_CALL_ATTRIBUTE,
    OPENINFERENCE_KIND,
    attempt_error,
    build_transcript,
    error_of,
    reward_of,
    text_of,
)

MAX_SPANS = 2000
"""Spans the waterfall shows at most (the first ones, in sequence order); the page says when it left some out."""
ROLLOUT = """SELECT rollout_id, status, mode, resources_id, resources_version, step, task_id, start_time, end_time,
    duration_seconds, num_attempts, latest_attempt_id, latest_attempt_status, latest_worker_id, input, metadata,
    config FROM rollouts_v WHERE rollout_id = :rollout_id"""
ATTEMPTS = """SELECT rollout_id, attempt_id, sequence_id, status, worker_id, start_time, end_time, duration_seconds,
    last_heartbeat_time, metadata FROM attempts_v WHERE rollout_id = :rollout_id ORDER BY sequence_id"""
REWARDS = """SELECT attempt_id, sequence_id, span_id, reward_name, reward, time FROM rewards_v
    WHERE rollout_id = :rollout_id ORDER BY sequence_id"""
CALLS = """SELECT attempt_id, span_id, sequence_id, agent_name, model, resources_id, resources_version, prompt_tokens,
    response_tokens, finish_reason, start_time, end_time, latency_seconds, usage_prompt_tokens,
    usage_completion_tokens, error FROM llm_calls_v WHERE rollout_id = :rollout_id ORDER BY sequence_id"""
TOKENS = """SELECT prompt_token_ids, response_token_ids, response_logprobs FROM llm_calls_v
    WHERE rollout_id = :rollout_id AND span_id = :span_id"""


@dataclass
class SpanRow:
    """One row of the waterfall: the span, its depth in the parent/child tree, its bar (left and width in
    percent of the attempt's time span) and its colour (``llm``, ``reward``, ``error`` or empty)."""

    span: Span
    depth: int
    left: float
    width: float
    kind: str
    seconds: float | None
    attributes: str


@dataclass
class AttemptView:
    """An attempt (an ``attempts_v`` row) with its waterfall, LLM calls and why it did not succeed."""

    row: dict[str, Any]
    waterfall: list[SpanRow] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    failed_calls: list[dict[str, Any]] = field(default_factory=list)
    """LLM calls the proxy made that got no answer to record (an upstream error): their spans, with why."""
    unproxied_calls: int = 0
    """LLM spans of the agent's own instrumentation with no call through the proxy (no token ids)."""
    error: str | None = None


@dataclass
class RolloutView:
    rollout: dict[str, Any]
    attempts: list[AttemptView]
    rewards: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    spans_total: int
    spans_shown: int


async def rollout_view(reader: TimedReader, store: LightningStore, rollout_id: str) -> RolloutView | None:
    """Everything the page shows of ``rollout_id``; None when the store has no such rollout."""
    params = {"rollout_id": rollout_id}
    found = await reader.rows(ROLLOUT, params)
    if not found:
        return None
    rollout = {**found[0], **{k: _json(found[0][k]) for k in ("input", "metadata", "config")}}
    attempts = [AttemptView({**row, "metadata": _json(row["metadata"])}) for row in await reader.rows(ATTEMPTS, params)]
    rewards = await reader.rows(REWARDS, params)
    call_rows = await reader.rows(CALLS, params)
    page = await reader.timed(store.query_spans(rollout_id, None, limit=MAX_SPANS))
    spans, total = list(page.items), page.total if page.total is not None else len(page.items)
    records = await reader.timed(store.query_llm_calls([rollout_id]))
    sequence = {a.row["attempt_id"]: a.row["sequence_id"] for a in attempts}
    by_attempt: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_attempt[span.attempt_id].append(span)
    errors = []
    for view in attempts:
        attempt_id = view.row["attempt_id"]
        mine = by_attempt.get(attempt_id, [])
        view.waterfall = waterfall(mine)
        view.error = attempt_error(Attempt.model_validate(view.row), mine)
        recorded = [c for c in records if c.attempt_id == attempt_id]
        texts = _call_texts(mine, recorded)
        offered = {c.span_id: _offered(c) for c in recorded}
        view.calls = [
            {**row, **texts.get(row["span_id"], {}), **offered.get(row["span_id"], {})}
            for row in call_rows
            if row["attempt_id"] == attempt_id
        ]
        _calls_without_records(view, mine)
        errors += [_error(span, view.row["sequence_id"]) for span in mine if _is_error(span)]
    for reward in rewards:
        reward["attempt_sequence_id"] = sequence.get(reward["attempt_id"])
    return RolloutView(rollout, attempts, rewards, errors, total, len(spans))


def waterfall(spans: list[Span]) -> list[SpanRow]:
    """The rows of one attempt's waterfall: depth-first by parent, siblings by start time then sequence id; a
    span whose parent is not among ``spans`` is a root. Bars are placed relative to the earliest start."""
    starts = [s.start_time for s in spans if s.start_time is not None]
    ends = [t for s in spans for t in (s.end_time, s.start_time) if t is not None]
    t0 = min(starts, default=0.0)
    length = max(max(ends, default=t0) - t0, 1e-9)
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = defaultdict(list)
    for span in spans:
        children[span.parent_id if span.parent_id in ids and span.parent_id != span.span_id else None].append(span)
    for siblings in children.values():
        siblings.sort(key=lambda s: (s.start_time if s.start_time is not None else float("inf"), s.sequence_id))
    rows: list[SpanRow] = []
    seen: set[str] = set()
    stack: list[tuple[Span, int]] = [(s, 0) for s in reversed(children[None])]
    while stack:
        span, depth = stack.pop()
        if span.span_id in seen:
            continue
        seen.add(span.span_id)
        rows.append(_row(span, depth, t0, length))
        stack += [(child, depth + 1) for child in reversed(children.get(span.span_id, []))]
    # Spans only reachable through a cycle of parents (malformed input) are shown as roots.
    rows += [_row(s, 0, t0, length) for s in spans if s.span_id not in seen]
    return rows


def _row(span: Span, depth: int, t0: float, length: float) -> SpanRow:
    start = span.start_time if span.start_time is not None else t0
    end = span.end_time if span.end_time is not None else start
    seconds = end - start if span.start_time is not None and span.end_time is not None else None
    attributes = json.dumps(span.attributes, indent=2, ensure_ascii=False, default=str)
    return SpanRow(
        span=span,
        depth=depth,
        left=round(max(0.0, (start - t0) / length * 100), 3),
        width=round(max(0.0, min((end - start) / length * 100, 100.0)), 3),
        kind=_kind(span),
        seconds=seconds,
        attributes=attributes,
    )


def _kind(span: Span) -> str:
    if _is_error(span):
        return "error"
    if reward_of(span) is not None:
        return "reward"
    attributes = span.attributes
    if attributes.get(LLM_CALL_ATTRIBUTE) is True or attributes.get(OPENINFERENCE_KIND) == "LLM":
        return "llm"
    return "llm" if attributes.get("gen_ai.operation.name") in ("chat", "text_completion") else ""


def _is_error(span: Span) -> bool:
    return span.status.status_code == "ERROR" or span.name == semconv.EXCEPTION


def _error(span: Span, attempt_sequence_id: int) -> dict[str, Any]:
    exception = next((e.attributes for e in span.events if e.name == "exception"), {})
    return {
        "span_id": span.span_id,
        "name": span.name,
        "attempt_sequence_id": attempt_sequence_id,
        "message": error_of(span),
        "status_message": span.status.description,
        "type": exception.get("exception.type") or span.attributes.get(semconv.ERROR_TYPE),
        "exception_message": exception.get("exception.message"),
        "stacktrace": exception.get("exception.stacktrace"),
        "time": span.end_time or span.start_time,
    }


def _offered(call: LlmCall) -> dict[str, Any]:
    """What the agent asked for beside the messages: the tools it offered (their names) and the sampling
    parameters the proxy sent."""
    tools = call.request.get("tools") if isinstance(call.request, dict) else None
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        names.append(str(name) if name is not None else "(unnamed)")
    return {"tools_offered": names, "sampling": dict(call.sampling_parameters or {})}


def _calls_without_records(view: AttemptView, spans: list[Span]) -> None:
    """The attempt's LLM spans that have no call record: the proxy's failed calls (an error status, no answer to
    record), and the spans of an instrumentation whose calls did not go through the proxy."""
    recorded = {call["span_id"] for call in view.calls}
    for span in spans:
        if span.span_id in recorded or _kind(span) not in ("llm", "error"):
            continue
        proxied = span.attributes.get(LLM_CALL_ATTRIBUTE) is True
        if proxied and span.status.status_code == "ERROR":
            seconds = span.end_time - span.start_time if span.end_time and span.start_time else None
            view.failed_calls.append(
                {
                    "span_id": span.span_id,
                    "name": span.name,
                    "message": span.status.description or error_of(span) or "failed",
                    "seconds": seconds,
                }
            )
        elif not proxied and _kind(span) == "llm":
            view.unproxied_calls += 1


def _call_texts(spans: list[Span], calls: list[LlmCall]) -> dict[str, dict[str, Any]]:
    """Per LLM call (by span id): its prompt messages (role and text) and its response, from the transcript."""
    found: dict[str, dict[str, Any]] = {}
    for event in build_transcript(spans, calls, full=True):
        if event["event"] != "llm_call" or not event.get("span_id"):
            continue
        messages = [
            {"role": str(m.get("role", "")), "text": text_of(m.get("content")) or "", "tool_calls": m.get("tool_calls")}
            for m in event["messages"]
        ]
        found[event["span_id"]] = {
            "messages": messages,
            "response": event["response"],
            "tool_calls": event["tool_calls"],
        }
    return found


async def call_tokens(
    reader: TimedReader, store: LightningStore, rollout_id: str, span_id: str
) -> dict[str, list[Any]] | None:
    """The token ids and logprobs of one LLM call, and the text of each response token where the answer carried
    it (``logprobs.content[i].token``, as vLLM and the built-in policy server send it; the store keeps no
    tokenizer); None when the rollout has no call with that span id."""
    rows = await reader.rows(TOKENS, {"rollout_id": rollout_id, "span_id": span_id})
    if not rows:
        return None
    found: dict[str, list[Any]] = {
        name: list(_json(rows[0][name]) or [])
        for name in ("prompt_token_ids", "response_token_ids", "response_logprobs")
    }
    records = await reader.timed(store.query_llm_calls([rollout_id]))
    record = next((c for c in records if c.span_id == span_id), None)
    texts = _token_texts(record.response if record is not None else None)
    found["response_token_texts"] = texts if len(texts) == len(found["response_token_ids"]) else []
    return found


def _token_texts(response: dict[str, Any] | None) -> list[str]:
    """The response's tokens as text, from its logprobs (empty when it carried none)."""
    choices = response.get("choices") if isinstance(response, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return []
    return [str(item.get("token", "")) if isinstance(item, dict) else "" for item in content]


def _json(value: Any) -> Any:
    """A JSON column's value: parsed when the driver returned its text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
