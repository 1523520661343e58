"""A store for the rollouts pages' tests, written through the store contract as runners and the LLM proxy write
it: four batches of rollouts enqueued a moment apart (train, val and no mode; ``metadata.step`` and
``task_id``), claimed by four workers, each attempt with an agent span, an LLM call (a proxy span and its typed
record with token ids and logprobs), a tool span under it, and a reward span (a few with rewards tied, one with
two reward spans) or, for a failed attempt, an exception span with its event. Failed rollouts allowed a retry
get a second attempt that succeeds; the last batch stays in the queue. Resources versions: 1 for the first
batch's calls, 2 after."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

import httpx
import sqlalchemy as sa

from lightning_store import semconv as sc
from lightning_store.llm_calls import LlmCall
from lightning_store.models import AttemptedRollout, AttemptEnd, EnqueueRolloutRequest, RolloutConfig
from lightning_store.spans import Event, Span, TraceStatus
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving
from tests.integration.dashboard_html import Element, parse

HOSTILE_ID = "ro-\"q'é漢%?#&=+ ;x"
"""A rollout id with quotes, non-ASCII, and characters that mean something in a URL."""
QUOTED_TASK = 'it\'s "quoted" — ü'
ERROR_TEXT = "no answer in the response"
UPSTREAM_ERROR = "upstream answered 502: Bad Gateway"
"""How the proxy describes a call that got no answer (the failed rollout's calls)."""
TOOLS = ("calculator", "search")
"""The tools every recorded call offered."""
TOKEN_TEXTS = ("It", "Ġis", ".")
"""The response tokens' text, as the answer's logprobs carry it."""
ROWS = """SELECT v.*, r.pk FROM rollouts_v v JOIN rollouts r ON r.rollout_id = v.rollout_id"""


@dataclass
class RolloutsFilled:
    ids: list[str] = field(default_factory=list)
    retried: str = ""
    """Failed once, then succeeded on its second attempt."""
    failed: str = ""
    """Failed for good (no retry allowed)."""
    two_rewards: str = ""
    queued: list[str] = field(default_factory=list)


def _reward_of(i: int) -> float:
    return [0.0, 0.25, 0.5, 1.0, 1.0, 0.75, -1.5][i % 7]  # ties on purpose


def attempt_spans(
    target: AttemptedRollout, i: int, version: int, *, fail: bool, rewards: int = 1, call_fails: bool = False
) -> tuple[list[Span], LlmCall | None]:
    """The spans and the LLM-call record of one attempt (``i`` varies the numbers). ``call_fails``: its LLM call
    got no answer, as the proxy records an upstream's error (the span, with the error; no call record)."""
    attempt = target.attempt.attempt_id
    t0 = target.attempt.start_time
    ids = {name: f"{name}-{attempt}"[:64] for name in ("root", "call", "tool", "reward", "reward2", "error")}

    def span(key: str, name: str, start: float, end: float, parent: str | None, **fields: object) -> Span:
        return Span.model_validate(
            {
                "rollout_id": target.rollout_id,
                "attempt_id": attempt,
                "sequence_id": 0,
                "trace_id": "ab" * 16,
                "span_id": ids[key],
                "parent_id": parent,
                "name": name,
                "start_time": start,
                "end_time": end,
                **fields,
            }
        )

    spans = [
        span("root", sc.OPERATION, t0, t0 + 2.0, None, attributes={sc.OPERATION_NAME: "solve"}),
        span(
            "call",
            "chat policy",
            t0 + 0.1,
            t0 + 0.6,
            ids["root"],
            status=TraceStatus(status_code="ERROR", description=UPSTREAM_ERROR)
            if call_fails
            else TraceStatus(status_code="OK"),
            attributes={
                "gen_ai.operation.name": "chat",
                "lightning_store.llm_call": True,
                "gen_ai.request.model": "policy",
                **({"error.type": "upstream_error"} if call_fails else {}),
            },
        ),
        span(
            "tool", "execute_tool calculator", t0 + 0.7, t0 + 0.8, ids["call"], attributes={"gen_ai.tool.name": "calc"}
        ),
    ]
    if fail:
        event = Event(
            name="exception",
            attributes={
                "exception.type": "ValueError",
                "exception.message": ERROR_TEXT,
                "exception.stacktrace": "Traceback (most recent call last):\nValueError: " + ERROR_TEXT,
            },
        )
        status = TraceStatus(status_code="ERROR", description=f"ValueError: {ERROR_TEXT}")
        spans.append(
            span(
                "error",
                sc.EXCEPTION,
                t0 + 1.0,
                t0 + 1.0,
                ids["root"],
                status=status,
                events=[event],
                attributes={sc.ERROR_TYPE: "ValueError"},
            )
        )
    else:
        for n, key in enumerate(("reward", "reward2")[:rewards]):
            value = _reward_of(i) + n * 0.125
            attributes = {sc.reward_name(0): "primary", sc.reward_value(0): value}
            spans.append(span(key, sc.ANNOTATION, t0 + 1.5 + n, t0 + 1.5 + n, ids["root"], attributes=attributes))
    if call_fails:
        return spans, None
    prompt = [100 + i, 7, 8, 9, i % 5]
    response = [200 + i, 3, 1]
    logprobs = [-0.5, -0.25 - i / 1000, -0.125]
    call = LlmCall(
        rollout_id=target.rollout_id,
        attempt_id=attempt,
        span_id=ids["call"],
        agent_name="solver" if i % 2 else "checker",
        model="policy-model",
        resources_id="policy",
        resources_version=version,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,
        request={
            "model": "policy-model",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
            "tools": [{"type": "function", "function": {"name": name, "parameters": {}}} for name in TOOLS],
        },
        response={
            "choices": [
                {
                    "message": {"role": "assistant", "content": f"It is {i + 1}."},
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [
                            {"token": text, "logprob": lp} for text, lp in zip(TOKEN_TEXTS, logprobs, strict=True)
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": len(prompt) + 10, "completion_tokens": len(response) + 1},
        },
        sampling_parameters={"temperature": 0.7, "max_tokens": 64},
        finish_reason="stop",
        start_time=t0 + 0.1,
        end_time=t0 + 0.6,
        latency_seconds=0.5 + i / 1000,
    )
    return spans, call


async def _run(
    store: SqlStore, claimed: list[AttemptedRollout], filled: RolloutsFilled, version: int, base: int
) -> None:
    spans: list[Span] = []
    calls: list[LlmCall] = []
    ends: list[AttemptEnd] = []
    for n, target in enumerate(claimed):
        i = base + n
        singled = target.rollout_id in (filled.retried, filled.failed, filled.two_rewards)
        first = target.attempt.sequence_id == 1
        fail = (target.rollout_id in (filled.retried, filled.failed) and first) or (not singled and i % 11 == 5)
        rewards = 2 if target.rollout_id == filled.two_rewards else 1
        call_fails = target.rollout_id == filled.failed  # it failed at its model: the upstream answered 502
        s, c = attempt_spans(target, i, version, fail=fail, rewards=rewards, call_fails=call_fails)
        spans += s
        calls += [c] if c is not None else []
        ends.append(
            AttemptEnd(
                rollout_id=target.rollout_id,
                attempt_id=target.attempt.attempt_id,
                status="failed" if fail else "succeeded",
            )
        )
    await store.add_many_spans(spans, allocate_sequence_ids=True)
    await store.add_llm_calls(calls)
    await store.end_attempts(ends)


async def fill_rollouts(store: SqlStore) -> RolloutsFilled:
    """Writes the store described in the module docstring; returns the ids the tests single out."""
    filled = RolloutsFilled()
    await store.update_resources("policy", {})
    batches: list[list[EnqueueRolloutRequest]] = []
    modes: list[tuple[Literal["train", "val"] | None, int]] = [("train", 60), ("val", 25), (None, 25), ("train", 20)]
    for b, (mode, size) in enumerate(modes):
        batch = []
        for k in range(size):
            metadata: dict[str, Any] = {"step": b, "task_id": f"task-{k % 7}", "split": mode or "none"}
            metadata["flag"] = k % 3 == 0  # a JSON boolean: reads as true/false on both backends
            if b == 2 and k == 3:
                metadata["task_id"] = QUOTED_TASK
            retry = RolloutConfig(max_attempts=2, retry_condition=["failed"]) if k % 2 == 0 else None
            rollout_id = HOSTILE_ID if (b, k) == (2, 4) else None
            batch.append(
                EnqueueRolloutRequest(
                    input={"question": f"q{b}-{k}"},
                    mode=mode,
                    resources_id="policy",
                    config=retry,
                    metadata=metadata,
                    rollout_id=rollout_id,
                )
            )
        batches.append(batch)
    version = 1
    for b, batch in enumerate(batches):
        if b == 1:
            version = (await store.update_resources("policy", {})).version
        enqueued = await store.enqueue_many_rollouts(batch)
        filled.ids += [r.rollout_id for r in enqueued]
        if b == 0:
            filled.retried, filled.failed, filled.two_rewards = (
                enqueued[2].rollout_id,
                enqueued[3].rollout_id,
                enqueued[6].rollout_id,
            )
        if b == len(batches) - 1:
            filled.queued = [r.rollout_id for r in enqueued]
            break
        claimed: list[AttemptedRollout] = []
        for w in range(4):
            claimed += await store.dequeue_many_rollouts(limit=(len(batch) + 3) // 4, worker_id=f"worker-{w}")
        await _run(store, claimed, filled, version, base=b * 100)
        requeued = await store.dequeue_many_rollouts(limit=100, worker_id="worker-retry")
        await _run(store, list(requeued), filled, version, base=b * 100 + 50)
        await asyncio.sleep(0.05)  # the batches' start times differ
    return filled


@dataclass
class Site:
    store: SqlStore
    http: httpx.AsyncClient
    filled: RolloutsFilled

    async def sql(self, statement: str, **params: Any) -> list[dict[str, Any]]:
        async with self.store.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(sa.text(statement), params)).mappings()]

    async def page(self, path: str, status: int = 200) -> Element:
        response = await self.http.get(path)
        assert response.status_code == status, (path, response.status_code, response.text[:800])
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["server-timing"].startswith("db;dur=")
        return parse(response.text)

    async def listed(self, **params: Any) -> list[str]:
        """The rollout ids of every page of the list with these parameters, following the next-page links."""
        path: str | None = "/dashboard/rollouts?" + urlencode(params, doseq=True)
        ids: list[str] = []
        while path is not None:
            page = await self.page(path)
            ids += [row.attrs["data-rollout-id"] for row in page.testids("rollout-row")]
            links = page.testids("next-page")
            path = links[0].attrs["href"] if links else None
            assert len(ids) < 1000
        assert len(ids) == len(set(ids)), "a rollout listed twice"
        return ids

    async def expected(self) -> dict[str, dict[str, Any]]:
        """Every rollout as ``rollouts_v`` has it, with its ``pk``, ``reward`` and ``reward_time`` (the last reward
        span of its latest attempt, from ``rewards_v``), ``ran`` (that attempt's ``attempts_v.duration_seconds``)
        and ``rank``: the database's order of its id."""
        rows = {r["rollout_id"]: {**r, "reward": None, "reward_time": None} for r in await self.sql(ROWS)}
        for row in rows.values():
            row["metadata"] = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]
        ranked = await self.sql("SELECT rollout_id FROM rollouts ORDER BY rollout_id")
        for rank, r in enumerate(ranked):
            rows[r["rollout_id"]]["rank"] = rank
        last: dict[str, int] = {}
        for w in await self.sql("SELECT rollout_id, attempt_id, sequence_id, reward, time FROM rewards_v"):
            row = rows[w["rollout_id"]]
            if w["attempt_id"] == row["latest_attempt_id"] and w["sequence_id"] > last.get(w["rollout_id"], -1):
                last[w["rollout_id"]] = w["sequence_id"]
                row["reward"], row["reward_time"] = w["reward"], w["time"]
        for row in rows.values():
            row["ran"] = None
        for a in await self.sql("SELECT rollout_id, attempt_id, duration_seconds FROM attempts_v"):
            if a["attempt_id"] == rows[a["rollout_id"]]["latest_attempt_id"]:
                rows[a["rollout_id"]]["ran"] = a["duration_seconds"]  # every attempt of the fill has ended
        return rows


@contextlib.asynccontextmanager
async def site_for(database_url: str) -> AsyncIterator[Site]:
    """A store on ``database_url`` filled by :func:`fill_rollouts`, served by a real ``store serve``."""
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    try:
        filled = await fill_rollouts(store)
        async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            yield Site(store, http, filled)
    finally:
        await store.close()
