"""Tracers and emitters writing into a real store: in process (SQLite), through the client to a served
Postgres store, and over OTLP/HTTP to a served store."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from opentelemetry import trace

from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout
from lightning_store.spans import Span
from tests.conftest import serving
from tracers import Tracer, emit_exception, emit_message, emit_object, emit_reward, operation

pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("http-postgres", marks=pytest.mark.postgres)], indirect=True
)


async def spans_of(store: LightningStore, rollout: AttemptedRollout) -> list[Span]:
    return list(await store.query_spans(rollout.rollout_id, rollout.attempt.attempt_id))


async def test_every_kind_of_span_lands_on_its_attempt_in_order(store: LightningStore) -> None:
    tracer = Tracer(store)
    rollout = await store.start_rollout({"q": 1})
    with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
        emit_message("thinking")
        with operation("plan") as op:
            op.record_input({"goal": "paris"})
            emit_object({"steps": [1, 2]})
            op.record_output("done")
        with trace.get_tracer("my.agent").start_as_current_span("custom"):
            pass
        emit_reward({"task": 1.0, "speed": 0.5}, primary="task")
    assert await tracer.flush()

    spans = await spans_of(store, rollout)
    assert [s.name for s in spans] == [
        "agentlightning.message",
        "agentlightning.object",
        "agentlightning.operation",
        "custom",
        "agentlightning.annotation",
    ]
    assert [s.sequence_id for s in spans] == sorted(s.sequence_id for s in spans)
    message, obj, plan, _, reward = spans
    assert message.attributes["agentlightning.message.body"] == "thinking"
    assert json.loads(obj.attributes["agentlightning.object.json"]) == {"steps": [1, 2]}
    assert obj.parent_id == plan.span_id  # emitted inside the operation
    assert json.loads(plan.attributes["agentlightning.operation.input"]) == {"goal": "paris"}
    assert plan.status.status_code == "OK"
    assert reward.attributes["agentlightning.reward.0.name"] == "task"
    assert reward.attributes["agentlightning.reward.0.value"] == 1.0
    assert reward.attributes["agentlightning.reward.1.name"] == "speed"
    await tracer.shutdown()


async def test_concurrent_attempts_and_threads_keep_their_own_spans(store: LightningStore) -> None:
    tracer = Tracer(store)
    rollouts = [await store.start_rollout({"q": i}) for i in range(4)]

    def sync_tool(i: int) -> None:
        emit_message(f"from thread {threading.get_ident()} for {i}")

    async def agent(i: int, rollout: AttemptedRollout) -> None:
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            for step in range(5):
                emit_object({"agent": i, "step": step})
                await asyncio.sleep(0)
            await asyncio.to_thread(sync_tool, i)
            emit_reward(float(i))

    await asyncio.gather(*(agent(i, r) for i, r in enumerate(rollouts)))
    assert await tracer.flush()

    for i, rollout in enumerate(rollouts):
        spans = await spans_of(store, rollout)
        objects = [json.loads(s.attributes["agentlightning.object.json"]) for s in spans if s.name.endswith("object")]
        assert objects == [{"agent": i, "step": step} for step in range(5)]
        assert spans[-2].attributes["agentlightning.message.body"].endswith(f"for {i}")
        assert spans[-1].attributes["agentlightning.reward.0.value"] == float(i)
    await tracer.shutdown()


async def test_spans_outside_an_attempt_are_not_written(store: LightningStore) -> None:
    tracer = Tracer(store)
    emit_message("nobody's")
    assert await tracer.flush()
    assert (await store.search_spans()).total == 0
    await tracer.shutdown()


async def test_tool_operations_record_their_status(store: LightningStore) -> None:
    tracer = Tracer(store)
    rollout = await store.start_rollout({"q": 1})

    @operation("calculator", tool=True)
    def calculator(expression: str) -> float:
        return float(eval(expression, {"__builtins__": {}}))  # a test tool on a constant

    @operation("search", tool=True)
    async def search(query: str) -> str:
        raise LookupError(f"nothing for {query}")

    with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
        assert calculator("2*21") == 42.0
        with pytest.raises(LookupError):
            await search("paris")
        with operation("memory", tool=True, call_id="call-7") as memory:
            memory.fail("no itinerary stored")
        try:
            raise RuntimeError("boom")
        except RuntimeError as error:
            emit_exception(error)
    assert await tracer.flush()

    calc, failed_search, memory_span, exception = await spans_of(store, rollout)
    assert calc.name == "execute_tool calculator"
    assert calc.attributes["gen_ai.tool.name"] == "calculator"
    assert calc.status.status_code == "OK"
    assert json.loads(calc.attributes["agentlightning.operation.input"]) == {"expression": "2*21"}
    assert json.loads(calc.attributes["agentlightning.operation.output"]) == 42.0
    assert failed_search.status.status_code == "ERROR"
    assert failed_search.attributes["error.type"] == "LookupError"
    assert failed_search.events[0].name == "exception"
    assert memory_span.status.status_code == "ERROR"
    assert memory_span.status.description == "no itinerary stored"
    assert memory_span.attributes["gen_ai.tool.call.id"] == "call-7"
    assert exception.name == "agentlightning.exception"
    assert exception.attributes["error.type"] == "RuntimeError"
    await tracer.shutdown()


async def test_spans_of_an_unknown_attempt_are_counted_and_do_not_sink_the_others(store: LightningStore) -> None:
    tracer = Tracer(store, schedule_delay=30)  # one batch, written at flush
    rollout = await store.start_rollout({"q": 1})
    with tracer.attempt(rollout.rollout_id, "at-missing"):
        emit_message("lost")
    with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
        emit_message("kept")
    assert await tracer.flush()

    assert [s.attributes["agentlightning.message.body"] for s in await spans_of(store, rollout)] == ["kept"]
    assert tracer.lost_spans("at-missing") == 1
    assert tracer.lost_spans("at-missing") == 0
    await tracer.shutdown()


async def test_flushes_called_together_share_runs_and_each_sees_its_spans_written(
    store: LightningStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = Tracer(store, schedule_delay=30)  # nothing is written but by a flush
    runs = 0
    force_flush = tracer._processor.force_flush

    def counted(timeout_millis: int = 30000) -> bool:
        nonlocal runs
        runs += 1
        return force_flush(timeout_millis)

    monkeypatch.setattr(tracer._processor, "force_flush", counted)
    rollouts = [await store.start_rollout({"q": i}) for i in range(24)]

    async def attempt(rollout: AttemptedRollout, delay: float) -> None:
        await asyncio.sleep(delay)
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            emit_message(f"done {rollout.rollout_id}")
        assert await tracer.flush()
        assert [s.name for s in await spans_of(store, rollout)] == ["agentlightning.message"]

    # Two waves: the second ends its spans while the first wave's flush runs, so it needs a run of its own.
    await asyncio.gather(*(attempt(r, 0.0 if i < 12 else 0.002) for i, r in enumerate(rollouts)))
    assert 1 <= runs <= 3, runs  # one flush per call would be 24 runs
    await tracer.shutdown()


def test_reward_arguments_are_checked(backend: str) -> None:
    with pytest.raises(ValueError, match="primary"):
        emit_reward({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="finite"):
        emit_reward(float("nan"))
    with pytest.raises(ValueError, match="number"):
        emit_reward("high")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single number"):
        emit_reward(1.0, primary="a")


async def test_otlp_tracer_sends_to_a_served_store(store: LightningStore, backend: str) -> None:
    if backend.startswith("http-"):
        pytest.skip("serves the in-process store; the http backend is covered by the other tests")
    rollout = await store.start_rollout({"q": 1})
    async with serving(store) as url:
        tracer = Tracer.otlp(url)
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            emit_message("over otlp")
            emit_reward(1.0)
        assert await tracer.flush()
        await tracer.shutdown()

    spans = await spans_of(store, rollout)
    assert [s.name for s in spans] == ["agentlightning.message", "agentlightning.annotation"]
    assert spans[1].attributes["agentlightning.reward.0.value"] == 1.0
