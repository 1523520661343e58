"""A store filled like a long training run, for the dashboard benchmark (``bench/dashboard.py``).

Everything goes through the store contract in batches (``enqueue_many_rollouts``, ``dequeue_many_rollouts``,
``add_many_spans``, ``add_llm_calls``, ``end_attempts``), so the rows are exactly what a real run leaves. Per
rollout, on average: one attempt (a failed attempt of a rollout allowed two is retried), an agent span, one to
three LLM calls through the proxy (a span and a typed record with ~120 prompt and ~40 response token ids and
their logprobs), half of them with an OpenInference LLM span carrying the text (~1 KB), a tool span now and
then, and a reward span (an exception span for a failed attempt). Modes: 80% ``train``, 15% ``val``, 5% none;
``metadata`` holds ``step`` and ``task_id`` as ``store train`` writes them; the ``policy`` resources version
grows every ``per_version`` rollouts. The last batch is left partly unfinished (queuing, running).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from lightning_store.contract import LightningStore
from lightning_store.llm_calls import LlmCall
from lightning_store.models import AttemptedRollout, AttemptEnd, EnqueueRolloutRequest, RolloutConfig
from lightning_store.spans import Event, Span, TraceStatus

QUESTION = "Natalia sold clips to {n} of her friends in April, and then she sold half as many clips in May. "
SYSTEM = "You are a careful assistant. Solve the task step by step; call the calculator when needed."
ANSWER = "She sold {n} clips in April and {h} in May, so {t} altogether. #### {t}"


@dataclass
class FillSummary:
    """What :func:`fill` wrote."""

    rollouts: int = 0
    attempts: int = 0
    spans: int = 0
    llm_calls: int = 0
    versions: int = 0
    seconds: float = 0.0
    by_status: dict[str, int] = field(default_factory=dict)


def _span(target: AttemptedRollout, sid: str, name: str, start: float, end: float, **fields: object) -> Span:
    return Span.model_validate(
        {
            "rollout_id": target.rollout_id,
            "attempt_id": target.attempt.attempt_id,
            "sequence_id": 0,
            "trace_id": target.attempt.attempt_id.ljust(32, "0")[:32],
            "span_id": sid,
            "name": name,
            "start_time": start,
            "end_time": end,
            **fields,
        }
    )


def attempt_records(
    target: AttemptedRollout, rng: random.Random, version: int, outcome: str
) -> tuple[list[Span], list[LlmCall]]:
    """The spans and LLM-call records of one attempt that ends with ``outcome`` (succeeded or failed)."""
    t0 = target.attempt.start_time
    root = f"{rng.getrandbits(64):016x}"
    spans = [
        _span(target, root, "agentlightning.operation", t0, t0 + 3.0, parent_id=None)
    ]  # closed last in reality; order does not matter for the views
    calls: list[LlmCall] = []
    n = rng.randint(2, 90)
    clock = t0 + 0.01
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        sid = f"{rng.getrandbits(64):016x}"
        latency = rng.uniform(0.2, 0.9)
        prompt = [rng.randrange(151_000) for _ in range(rng.randint(90, 150))]
        response = [rng.randrange(151_000) for _ in range(rng.randint(20, 60))]
        text = ANSWER.format(n=n, h=n // 2, t=n + n // 2)
        spans.append(
            _span(
                target,
                sid,
                "chat policy",
                clock,
                clock + latency,
                parent_id=root,
                status=TraceStatus(status_code="OK"),
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "policy",
                    "gen_ai.response.model": "policy",
                    "gen_ai.usage.input_tokens": len(prompt),
                    "gen_ai.usage.output_tokens": len(response),
                    "lightning_store.llm_call": True,
                    "gen_ai.response.finish_reasons": ["stop"],
                },
            )
        )
        if rng.random() < 0.5:  # an OpenInference LLM span with the text, as an instrumented framework adds
            spans.append(
                _span(
                    target,
                    f"{rng.getrandbits(64):016x}",
                    "ChatOpenAI",
                    clock,
                    clock + latency + 0.01,
                    parent_id=root,
                    attributes={
                        "openinference.span.kind": "LLM",
                        "llm.model_name": "policy",
                        "llm.input_messages.0.message.role": "system",
                        "llm.input_messages.0.message.content": SYSTEM,
                        "llm.input_messages.1.message.role": "user",
                        "llm.input_messages.1.message.content": QUESTION.format(n=n) * 4,
                        "llm.output_messages.0.message.content": text,
                        "llm.token_count.prompt": len(prompt),
                        "llm.token_count.completion": len(response),
                    },
                )
            )
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION.format(n=n)}]
        calls.append(
            LlmCall(
                rollout_id=target.rollout_id,
                attempt_id=target.attempt.attempt_id,
                span_id=sid,
                agent_name="solver",
                model="policy",
                resources_id="policy",
                resources_version=version,
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[round(-rng.expovariate(4.0), 4) for _ in response],
                request={"model": "policy", "messages": messages, "temperature": 1.0},
                response={
                    "id": f"chatcmpl-{sid}",
                    "model": "policy",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(response)},
                },
                finish_reason="stop",
                start_time=clock,
                end_time=clock + latency,
                latency_seconds=latency,
            )
        )
        clock += latency + 0.02
        if rng.random() < 0.3:
            spans.append(
                _span(
                    target,
                    f"{rng.getrandbits(64):016x}",
                    "execute_tool calculator",
                    clock,
                    clock + 0.005,
                    parent_id=root,
                    status=TraceStatus(status_code="OK"),
                    attributes={"gen_ai.tool.name": "calculator", "agentlightning.operation.input": '{"x": 1}'},
                )
            )
            clock += 0.01
    if outcome == "succeeded":
        reward = 1.0 if rng.random() < 0.55 else rng.choice((0.0, 0.0, 0.5))
        spans.append(
            _span(
                target,
                f"{rng.getrandbits(64):016x}",
                "agentlightning.annotation",
                clock,
                clock,
                parent_id=root,
                attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": reward},
            )
        )
    else:
        spans.append(
            _span(
                target,
                f"{rng.getrandbits(64):016x}",
                "agentlightning.exception",
                clock,
                clock,
                parent_id=root,
                status=TraceStatus(status_code="ERROR", description="ValueError: no answer in the response"),
                attributes={"error.type": "ValueError"},
                events=[
                    Event(
                        name="exception",
                        attributes={
                            "exception.type": "ValueError",
                            "exception.message": "no answer in the response",
                            "exception.stacktrace": "Traceback (most recent call last):\n  ...\nValueError",
                        },
                    )
                ],
            )
        )
    return spans, calls


async def fill(
    store: LightningStore,
    rollouts: int,
    *,
    seed: int = 0,
    batch: int = 1000,
    per_version: int = 2000,
    progress: Callable[[int], None] | None = None,
) -> FillSummary:
    """Writes ``rollouts`` rollouts (see the module docstring) to ``store``; returns what it wrote."""
    rng = random.Random(seed)
    summary = FillSummary()
    started = time.perf_counter()
    version = (await store.update_resources("policy", {})).version
    done = 0
    while done < rollouts:
        size = min(batch, rollouts - done)
        step = done // per_version
        while version < step + 1:
            version = (await store.update_resources("policy", {})).version
        requests = []
        for i in range(size):
            mode: Literal["train", "val"] | None = rng.choices(("train", "val", None), weights=(80, 15, 5))[0]
            retry = rng.random() < 0.5
            requests.append(
                EnqueueRolloutRequest(
                    input={"question": QUESTION.format(n=i % 90 + 2), "answer": str(i)},
                    mode=mode,
                    resources_id="policy",
                    config=RolloutConfig(max_attempts=2, retry_condition=["failed"]) if retry else None,
                    metadata={"step": step, "task_id": f"task-{rng.randrange(500)}", "split": mode or "none"},
                )
            )
        await store.enqueue_many_rollouts(requests)
        last = done + size >= rollouts
        for round_ in range(2):  # a failed attempt of a rollout that may retry is requeued: its second attempt
            claimed = list(await store.dequeue_many_rollouts(limit=size, worker_id=f"worker-{rng.randrange(8)}"))
            if not claimed:
                break
            if last and round_ == 0:
                claimed = claimed[: len(claimed) * 9 // 10]  # the rest stays running
            spans: list[Span] = []
            calls: list[LlmCall] = []
            ends = []
            for target in claimed:
                outcome: Literal["failed", "succeeded"] = "failed" if rng.random() < 0.12 else "succeeded"
                s, c = attempt_records(target, rng, version, outcome)
                spans += s
                calls += c
                ends.append(
                    AttemptEnd(rollout_id=target.rollout_id, attempt_id=target.attempt.attempt_id, status=outcome)
                )
            for i in range(0, len(spans), 2000):
                await store.add_many_spans(spans[i : i + 2000], allocate_sequence_ids=True)
            for i in range(0, len(calls), 1000):
                await store.add_llm_calls(calls[i : i + 1000])
            if last and round_ == 0:
                # Unfinished work at the end: a few rollouts enqueued and never claimed.
                await store.enqueue_many_rollouts(requests[: size // 20])
            for i in range(0, len(ends), 1000):
                await store.end_attempts(ends[i : i + 1000])
            summary.attempts += len(claimed)
            summary.spans += len(spans)
            summary.llm_calls += len(calls)
            if last:
                break
        done += size
        if progress is not None:
            progress(done)
    stats = await store.statistics()
    summary.rollouts = int(stats.get("total_rollouts", 0))
    summary.by_status = dict(stats.get("rollouts_by_status", {}))
    summary.versions = version
    summary.seconds = time.perf_counter() - started
    return summary
