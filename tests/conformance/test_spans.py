"""Span ingest, span sequence ids and span queries, on every backend."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link as OtelLink
from opentelemetry.trace import Status, StatusCode

from lightning_store.contract import LightningStore
from lightning_store.errors import ConflictError, InvalidRequestError, NotFoundError
from lightning_store.limits import MAX_SEQUENCE_ID, MAX_SPAN_NAME_LENGTH
from lightning_store.models import AttemptedRollout, RolloutConfig
from lightning_store.spans import Event, Link, OtelResource, Span, SpanContext, TraceStatus
from tests.conftest import StoreFactory

TRACE = "0af7651916cd43dd8448eb211c80319c"


def make_span(
    rollout: AttemptedRollout,
    span_id: str,
    *,
    sequence_id: int = 1,
    name: str = "step",
    trace_id: str = TRACE,
    parent_id: str | None = None,
    start_time: float | None = None,
    attempt_id: str | None = None,
) -> Span:
    return Span(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id or rollout.attempt.attempt_id,
        sequence_id=sequence_id,
        trace_id=trace_id,
        span_id=span_id,
        parent_id=parent_id,
        name=name,
        start_time=start_time,
    )


async def spans_of(store: LightningStore, rollout_id: str) -> list[Span]:
    return list(await store.query_spans(rollout_id))


# Ingest --------------------------------------------------------------------------------------------------


async def test_add_span_round_trips_every_field_including_unknown_extras(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    data: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "attempt_id": rollout.attempt.attempt_id,
        "sequence_id": 7,
        "trace_id": TRACE,
        "span_id": "b7ad6b7169203331",
        "parent_id": "00f067aa0ba902b7",
        "name": "llm.call",
        "status": TraceStatus(status_code="ERROR", description="boom").model_dump(),
        "attributes": {"gen_ai.model": "qwen", "tokens": [1, 2, 3], "nested": {"ok": True}, "score": 0.5},
        "events": [Event(name="retry", attributes={"n": 2}, timestamp=1700000000.25).model_dump()],
        "links": [
            Link(context=SpanContext(trace_id=TRACE, span_id="1111111111111111"), attributes={"k": "v"}).model_dump()
        ],
        "start_time": 1700000000.125,
        "end_time": 1700000001.5,
        "context": SpanContext(trace_id=TRACE, span_id="b7ad6b7169203331", trace_state={"a": "b"}).model_dump(),
        "parent": SpanContext(trace_id=TRACE, span_id="00f067aa0ba902b7", is_remote=True).model_dump(),
        "resource": OtelResource(attributes={"service.name": "agent"}, schema_url="https://x").model_dump(),
        "future_field": {"added": ["by", "a", "newer", "client"]},
        "another_extra": 3,
    }
    span = Span.model_validate(data)

    added = await store.add_span(span)

    assert added is not None
    [stored] = await spans_of(store, rollout.rollout_id)
    assert stored.model_dump() == data
    assert stored.model_extra == {"future_field": data["future_field"], "another_extra": 3}


async def test_add_span_returns_the_span_then_none_for_a_duplicate(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    span = make_span(rollout, "s1")

    assert await store.add_span(span) == span
    assert await store.add_span(span.model_copy(update={"name": "changed"})) is None

    [stored] = await spans_of(store, rollout.rollout_id)
    assert stored.name == "step"


async def test_add_many_spans_ignores_duplicates_within_one_batch(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    first, second = make_span(rollout, "s1", name="first"), make_span(rollout, "s2", sequence_id=2)
    again = make_span(rollout, "s1", name="again", sequence_id=3)

    added = await store.add_many_spans([first, second, again])

    assert [s.span_id for s in added] == ["s1", "s2"]
    assert added[0].name == "first"
    stored = await spans_of(store, rollout.rollout_id)
    assert [(s.span_id, s.name) for s in stored] == [("s1", "first"), ("s2", "step")]


async def test_add_many_spans_returns_only_spans_new_across_calls(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_many_spans([make_span(rollout, "s1"), make_span(rollout, "s2", sequence_id=2)])

    added = await store.add_many_spans(
        [make_span(rollout, "s2", sequence_id=2), make_span(rollout, "s3", sequence_id=3)]
    )

    assert [s.span_id for s in added] == ["s3"]
    assert (await store.query_spans(rollout.rollout_id)).total == 3


async def test_add_many_spans_of_only_duplicates_returns_empty(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_span(make_span(rollout, "s1"))

    assert list(await store.add_many_spans([make_span(rollout, "s1"), make_span(rollout, "s1")])) == []


async def test_same_span_id_in_another_attempt_is_not_a_duplicate(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    second = await store.start_attempt(rollout.rollout_id)

    await store.add_span(make_span(rollout, "s1"))
    added = await store.add_span(make_span(second, "s1", sequence_id=2))

    assert added is not None
    assert (await store.query_spans(rollout.rollout_id)).total == 2


async def test_add_many_spans_of_an_empty_batch_returns_empty(store: LightningStore) -> None:
    assert list(await store.add_many_spans([])) == []


async def test_span_of_unknown_rollout_raises_and_writes_nothing_of_the_batch(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    good = make_span(rollout, "s1", sequence_id=50)
    bad = good.model_copy(update={"rollout_id": "ro-missing", "span_id": "s2"})

    with pytest.raises(NotFoundError) as caught:
        await store.add_many_spans([good, bad])

    assert caught.value.field == "spans.1.rollout_id"
    assert await spans_of(store, rollout.rollout_id) == []
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None
    assert attempt.status == "preparing"
    assert attempt.last_heartbeat_time is None
    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) < 50


async def test_span_naming_an_attempt_of_another_rollout_raises_and_writes_nothing(store: LightningStore) -> None:
    mine = await store.start_rollout({"q": 1})
    other = await store.start_rollout({"q": 2})
    good = make_span(mine, "s1")
    foreign = make_span(mine, "s2", attempt_id=other.attempt.attempt_id)

    with pytest.raises(NotFoundError) as caught:
        await store.add_many_spans([good, foreign])

    assert caught.value.field == "spans.1.attempt_id"
    assert await spans_of(store, mine.rollout_id) == []
    assert await spans_of(store, other.rollout_id) == []
    rollout = await store.get_rollout_by_id(mine.rollout_id)
    assert rollout is not None
    assert rollout.status == "preparing"


async def test_span_of_unknown_attempt_raises_not_found(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    with pytest.raises(NotFoundError) as caught:
        await store.add_span(make_span(rollout, "s1", attempt_id="at-missing"))

    assert caught.value.field == "spans.0.attempt_id"


async def test_malformed_span_raises_invalid_request_naming_the_field(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    bad: Any = {**make_span(rollout, "s1").model_dump(), "sequence_id": -1}

    with pytest.raises(InvalidRequestError) as caught:
        await store.add_many_spans([make_span(rollout, "s0"), bad])

    assert caught.value.field == "spans.1.sequence_id"
    assert await spans_of(store, rollout.rollout_id) == []


async def test_a_span_name_up_to_the_stated_limit_is_stored_and_a_longer_one_refused(store: LightningStore) -> None:
    """512 characters of incompressible 4-byte text (2 KB, where a Postgres index entry holds about 2.7 KB) are
    stored and read back on every backend; one more is a 4xx naming the field, and nothing is written."""
    rollout = await store.start_rollout({"q": 1})
    rng = random.Random(0)
    longest = "".join(chr(rng.randrange(0x10000, 0x110000)) for _ in range(MAX_SPAN_NAME_LENGTH))  # 4 bytes each
    await store.add_span(make_span(rollout, "s1", name=longest))
    assert [s.name for s in await spans_of(store, rollout.rollout_id)] == [longest]
    too_long: Any = {**make_span(rollout, "s2", sequence_id=2).model_dump(), "name": longest + "x"}
    with pytest.raises(InvalidRequestError) as caught:
        await store.add_many_spans([too_long])
    assert caught.value.field == "spans.0.name"
    assert len(await spans_of(store, rollout.rollout_id)) == 1


# A span is a heartbeat -----------------------------------------------------------------------------------


async def test_span_marks_preparing_attempt_and_rollout_running(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    before = time.time()

    await store.add_span(make_span(rollout, "s1"))

    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None
    assert attempt.status == "running"
    assert attempt.last_heartbeat_time is not None
    assert before <= attempt.last_heartbeat_time <= time.time()
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None
    assert stored.status == "running"


async def test_duplicate_span_still_counts_as_a_heartbeat(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_span(make_span(rollout, "s1"))
    first = await store.get_latest_attempt(rollout.rollout_id)
    assert first is not None and first.last_heartbeat_time is not None

    await store.add_span(make_span(rollout, "s1"))

    second = await store.get_latest_attempt(rollout.rollout_id)
    assert second is not None and second.last_heartbeat_time is not None
    assert second.last_heartbeat_time >= first.last_heartbeat_time


async def test_span_revives_unresponsive_attempt_and_its_requeuing_rollout(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=2, retry_condition=["unresponsive"])
    rollout = await store.start_rollout({"q": 1}, config=config)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="unresponsive")
    requeued = await store.get_rollout_by_id(rollout.rollout_id)
    assert requeued is not None and requeued.status == "requeuing"

    await store.add_span(make_span(rollout, "s1"))

    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "running"
    revived = await store.get_rollout_by_id(rollout.rollout_id)
    assert revived is not None and revived.status == "running"
    assert await store.dequeue_rollout() is None


async def test_span_leaves_a_finished_attempt_and_rollout_as_they_are(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")

    await store.add_span(make_span(rollout, "late"))

    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "succeeded"
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "succeeded"


async def test_span_of_an_older_attempt_does_not_change_the_rollout(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.start_attempt(rollout.rollout_id)

    await store.add_span(make_span(rollout, "s1"))

    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "preparing"
    attempts = await store.query_attempts(rollout.rollout_id)
    assert [a.status for a in attempts] == ["running", "preparing"]


# Sequence ids --------------------------------------------------------------------------------------------


async def test_next_span_sequence_id_strictly_increases(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    ids = [await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) for _ in range(5)]

    assert all(a < b for a, b in itertools.pairwise(ids))
    assert ids[0] >= 1


async def test_span_sequence_counters_are_per_rollout(store: LightningStore) -> None:
    first = await store.start_rollout({"q": 1})
    second = await store.start_rollout({"q": 2})
    drawn = [await store.get_next_span_sequence_id(first.rollout_id, first.attempt.attempt_id) for _ in range(5)]

    other = await store.get_next_span_sequence_id(second.rollout_id, second.attempt.attempt_id)

    assert other == drawn[0]


async def test_span_sequence_counter_spans_the_attempts_of_a_rollout(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    first = await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id)
    second_attempt = await store.start_attempt(rollout.rollout_id)

    second = await store.get_next_span_sequence_id(rollout.rollout_id, second_attempt.attempt.attempt_id)

    assert second > first


async def test_concurrent_span_sequence_ids_are_all_distinct(
    store: LightningStore, store_factory: StoreFactory
) -> None:
    rollout = await store.start_rollout({"q": 1})
    other = await store_factory()

    async def draw(s: LightningStore, n: int) -> list[int]:
        return [await s.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) for _ in range(n)]

    results = await asyncio.gather(*(draw(store, 50) for _ in range(8)), *(draw(other, 50) for _ in range(4)))

    drawn = [n for task in results for n in task]
    assert len(drawn) == 600
    assert len(set(drawn)) == len(drawn)
    for task in results:
        assert task == sorted(task)
    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) > max(drawn)


async def test_get_many_span_sequence_ids_hands_out_distinct_increasing_numbers(store: LightningStore) -> None:
    first = await store.start_rollout({"q": 1})
    second = await store.start_rollout({"q": 2})
    a1, a2 = first.attempt.attempt_id, second.attempt.attempt_id

    ids = await store.get_many_span_sequence_ids(
        [(first.rollout_id, a1), (second.rollout_id, a2), (first.rollout_id, a1)]
    )

    assert len(ids) == 3
    assert ids[0] < ids[2]
    assert await store.get_next_span_sequence_id(first.rollout_id, a1) > ids[2]
    assert await store.get_next_span_sequence_id(second.rollout_id, a2) > ids[1]


async def test_get_many_span_sequence_ids_of_nothing_is_empty(store: LightningStore) -> None:
    assert list(await store.get_many_span_sequence_ids([])) == []


async def test_span_sequence_id_of_unknown_attempt_raises_not_found(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    other = await store.start_rollout({"q": 2})
    before = await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id)

    with pytest.raises(NotFoundError):
        await store.get_next_span_sequence_id(rollout.rollout_id, "at-missing")
    with pytest.raises(NotFoundError):
        await store.get_many_span_sequence_ids(
            [(rollout.rollout_id, rollout.attempt.attempt_id), (rollout.rollout_id, other.attempt.attempt_id)]
        )
    # Nothing was drawn by the failed batch.
    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) == before + 1


async def test_span_with_explicit_high_sequence_id_advances_the_counter(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    await store.add_span(make_span(rollout, "s1", sequence_id=100))

    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) > 100


async def test_no_sequence_id_is_handed_out_past_2_to_the_53_minus_1(store: LightningStore) -> None:
    """A span may take the largest sequence id itself; then none is left to hand out, and asking for one is a
    conflict that writes nothing (it was once 2^53, which a JavaScript client cannot hold exactly)."""
    rollout = await store.start_rollout({"q": 1})
    ids = (rollout.rollout_id, rollout.attempt.attempt_id)
    await store.add_span(make_span(rollout, "top", sequence_id=MAX_SEQUENCE_ID))
    for ask in (
        lambda: store.get_next_span_sequence_id(*ids),
        lambda: store.get_many_span_sequence_ids([ids]),
        lambda: store.add_many_spans([make_span(rollout, "numbered")], allocate_sequence_ids=True),
    ):
        with pytest.raises(ConflictError) as refused:
            await ask()
        assert refused.value.field == "rollout_id" and str(MAX_SEQUENCE_ID) in str(refused.value)
    await store.add_span(make_span(rollout, "low", sequence_id=7))  # spans that bring their own still go in
    assert [s.span_id for s in await store.query_spans(rollout.rollout_id)] == ["low", "top"]


async def test_span_with_lower_sequence_id_does_not_move_the_counter_back(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_span(make_span(rollout, "s1", sequence_id=100))

    await store.add_span(make_span(rollout, "s2", sequence_id=3))

    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) > 100


async def test_add_many_spans_allocating_numbers_each_rollouts_spans_in_order(store: LightningStore) -> None:
    first = await store.start_rollout({"q": 1})
    second = await store.start_rollout({"q": 2})
    before = await store.get_next_span_sequence_id(first.rollout_id, first.attempt.attempt_id)
    batch = [make_span(first, "a"), make_span(second, "b"), make_span(first, "c"), make_span(first, "d")]

    added = await store.add_many_spans(batch, allocate_sequence_ids=True)

    numbers = {span.span_id: span.sequence_id for span in added}
    assert [span.span_id for span in added] == ["a", "b", "c", "d"]
    assert before < numbers["a"] < numbers["c"] < numbers["d"]
    stored = {span.span_id: span.sequence_id for span in await spans_of(store, first.rollout_id)}
    assert stored == {"a": numbers["a"], "c": numbers["c"], "d": numbers["d"]}
    assert [span.span_id for span in await spans_of(store, second.rollout_id)] == ["b"]
    # The counter moved past the numbers taken: the next draw and the next allocating write come after them.
    assert await store.get_next_span_sequence_id(first.rollout_id, first.attempt.attempt_id) > numbers["d"]
    (later,) = await store.add_many_spans([make_span(first, "e")], allocate_sequence_ids=True)
    assert later.sequence_id > numbers["d"]


async def test_add_many_spans_allocating_ignores_the_spans_own_numbers(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    (added,) = await store.add_many_spans([make_span(rollout, "s1", sequence_id=500)], allocate_sequence_ids=True)

    assert added.sequence_id < 500
    assert (await spans_of(store, rollout.rollout_id))[0].sequence_id == added.sequence_id


async def test_add_many_spans_allocating_skips_duplicates_and_keeps_their_numbers(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    (kept,) = await store.add_many_spans([make_span(rollout, "s1")], allocate_sequence_ids=True)

    added = await store.add_many_spans([make_span(rollout, "s1"), make_span(rollout, "s2")], allocate_sequence_ids=True)

    assert [span.span_id for span in added] == ["s2"]
    stored = {span.span_id: span.sequence_id for span in await spans_of(store, rollout.rollout_id)}
    assert stored["s1"] == kept.sequence_id
    assert stored["s2"] > kept.sequence_id


async def test_add_many_spans_allocating_for_an_unknown_attempt_writes_and_draws_nothing(
    store: LightningStore,
) -> None:
    rollout = await store.start_rollout({"q": 1})
    before = await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id)

    with pytest.raises(NotFoundError) as raised:
        await store.add_many_spans(
            [make_span(rollout, "s1"), make_span(rollout, "s2", attempt_id="at-missing")], allocate_sequence_ids=True
        )

    assert raised.value.field == "spans.1.attempt_id"
    assert await spans_of(store, rollout.rollout_id) == []
    assert await store.get_next_span_sequence_id(rollout.rollout_id, rollout.attempt.attempt_id) == before + 1


async def test_concurrent_allocating_writes_never_share_a_number(
    store: LightningStore, store_factory: StoreFactory
) -> None:
    rollout = await store.start_rollout({"q": 1})
    other = await store_factory()

    async def write(s: LightningStore, prefix: str) -> None:
        for i in range(10):
            await s.add_many_spans(
                [make_span(rollout, f"{prefix}-{i}-{j}") for j in range(3)], allocate_sequence_ids=True
            )

    await asyncio.gather(*(write(store, f"a{k}") for k in range(3)), *(write(other, f"b{k}") for k in range(2)))

    numbers = [span.sequence_id for span in await spans_of(store, rollout.rollout_id)]
    assert len(numbers) == 150
    assert len(set(numbers)) == 150


# OpenTelemetry spans -------------------------------------------------------------------------------------


def finished_otel_spans() -> tuple[ReadableSpan, ReadableSpan]:
    """A parent and a child span, ended and captured by an in-memory exporter: (child, parent)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-under-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("parent") as parent:
        link = OtelLink(parent.get_span_context(), {"why": "because"})
        with tracer.start_as_current_span("child", links=[link]) as child:
            child.set_attribute("tokens", [1, 2, 3])
            child.set_attribute("model", "qwen")
            child.add_event("retry", {"n": 2})
            child.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    child_span, parent_span = exporter.get_finished_spans()
    return child_span, parent_span


async def test_add_otel_span_converts_and_stores_a_readable_span(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    child, parent = finished_otel_spans()
    ctx = child.get_span_context()
    assert ctx is not None and child.start_time is not None and child.end_time is not None

    added = await store.add_otel_span(rollout.rollout_id, rollout.attempt.attempt_id, child, sequence_id=42)

    assert added is not None
    [stored] = await spans_of(store, rollout.rollout_id)
    assert stored == added
    assert stored.sequence_id == 42
    assert stored.name == "child"
    assert stored.trace_id == trace_api.format_trace_id(ctx.trace_id)
    assert stored.span_id == trace_api.format_span_id(ctx.span_id)
    parent_ctx = parent.get_span_context()
    assert parent_ctx is not None
    assert stored.parent_id == trace_api.format_span_id(parent_ctx.span_id)
    assert stored.attributes == {"tokens": [1, 2, 3], "model": "qwen"}
    assert [(e.name, e.attributes) for e in stored.events] == [("retry", {"n": 2})]
    assert [link.attributes for link in stored.links] == [{"why": "because"}]
    assert stored.status.status_code == "ERROR" and stored.status.description == "boom"
    assert stored.start_time == pytest.approx(child.start_time / 1e9)
    assert stored.end_time == pytest.approx(child.end_time / 1e9)
    assert stored.resource.attributes["service.name"] == "agent-under-test"


async def test_add_otel_span_without_sequence_id_draws_the_next_one(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    child, parent = finished_otel_spans()
    attempt_id = rollout.attempt.attempt_id

    first = await store.add_otel_span(rollout.rollout_id, attempt_id, parent)
    second = await store.add_otel_span(rollout.rollout_id, attempt_id, child)

    assert first is not None and second is not None
    assert first.sequence_id < second.sequence_id
    assert await store.get_next_span_sequence_id(rollout.rollout_id, attempt_id) > second.sequence_id
    assert [s.name for s in await spans_of(store, rollout.rollout_id)] == ["parent", "child"]


async def test_add_otel_span_twice_is_a_duplicate(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    child, _ = finished_otel_spans()

    await store.add_otel_span(rollout.rollout_id, rollout.attempt.attempt_id, child)

    assert await store.add_otel_span(rollout.rollout_id, rollout.attempt.attempt_id, child) is None


# Queries -------------------------------------------------------------------------------------------------


async def two_attempts_with_spans(store: LightningStore) -> tuple[AttemptedRollout, AttemptedRollout]:
    first = await store.start_rollout({"q": 1})
    await store.add_many_spans([make_span(first, "a1"), make_span(first, "a2", sequence_id=2)])
    second = await store.start_attempt(first.rollout_id)
    await store.add_span(make_span(second, "b1", sequence_id=3))
    return first, second


async def test_query_spans_of_all_attempts(store: LightningStore) -> None:
    first, _ = await two_attempts_with_spans(store)

    result = await store.query_spans(first.rollout_id, None)

    assert [s.span_id for s in result] == ["a1", "a2", "b1"]
    assert result.total == 3


async def test_query_spans_of_latest_attempt(store: LightningStore) -> None:
    first, second = await two_attempts_with_spans(store)

    result = await store.query_spans(first.rollout_id, "latest")

    assert [s.span_id for s in result] == ["b1"]
    assert {s.attempt_id for s in result} == {second.attempt.attempt_id}


async def test_query_spans_of_a_specific_attempt(store: LightningStore) -> None:
    first, _ = await two_attempts_with_spans(store)

    result = await store.query_spans(first.rollout_id, first.attempt.attempt_id)

    assert [s.span_id for s in result] == ["a1", "a2"]
    assert result.total == 2


async def test_query_spans_of_latest_attempt_of_rollout_without_attempts_is_empty(store: LightningStore) -> None:
    queued = await store.enqueue_rollout({"q": 1})

    result = await store.query_spans(queued.rollout_id, "latest")

    assert list(result) == [] and result.total == 0


async def test_query_spans_of_unknown_ids_finds_nothing(store: LightningStore) -> None:
    # Reads of unknown ids find nothing (as in Agent Lightning), they do not raise.
    rollout = await store.start_rollout({"q": 1})
    other = await store.start_rollout({"q": 2})
    await store.add_span(make_span(other, "s1"))

    assert (await store.query_spans("ro-missing")).total == 0
    assert (await store.query_spans(rollout.rollout_id, "at-missing")).total == 0
    assert (await store.query_spans(rollout.rollout_id, other.attempt.attempt_id)).total == 0


async def three_distinct_spans(store: LightningStore) -> str:
    rollout = await store.start_rollout({"q": 1})
    await store.add_many_spans(
        [
            make_span(rollout, "aaaa0001", trace_id="trace-one", name="agent.run", sequence_id=1),
            make_span(rollout, "bbbb0002", trace_id="trace-one", name="llm.call", parent_id="aaaa0001", sequence_id=2),
            make_span(rollout, "cccc0003", trace_id="trace-two", name="tool_50%", parent_id="bbbb0002", sequence_id=3),
        ]
    )
    return rollout.rollout_id


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"trace_id": "trace-one"}, ["aaaa0001", "bbbb0002"]),
        ({"trace_id_contains": "two"}, ["cccc0003"]),
        ({"span_id": "bbbb0002"}, ["bbbb0002"]),
        ({"span_id_contains": "0003"}, ["cccc0003"]),
        ({"parent_id": "aaaa0001"}, ["bbbb0002"]),
        ({"parent_id_contains": "000"}, ["bbbb0002", "cccc0003"]),
        ({"name": "llm.call"}, ["bbbb0002"]),
        ({"name_contains": "."}, ["aaaa0001", "bbbb0002"]),
        ({"name_contains": "%"}, ["cccc0003"]),
        ({"name_contains": "_"}, ["cccc0003"]),
        ({"name": "nothing"}, []),
        ({"trace_id": "trace-one", "name_contains": "agent"}, ["aaaa0001"]),
        ({"trace_id": "trace-two", "name": "llm.call"}, []),
    ],
)
async def test_query_spans_filters(store: LightningStore, filters: dict[str, str], expected: list[str]) -> None:
    rollout_id = await three_distinct_spans(store)

    result = await store.query_spans(rollout_id, **filters)  # type: ignore[arg-type]

    assert [s.span_id for s in result] == expected
    assert result.total == len(expected)


async def test_query_spans_filter_logic_or_matches_any_condition(store: LightningStore) -> None:
    rollout_id = await three_distinct_spans(store)

    result = await store.query_spans(rollout_id, name="agent.run", span_id="cccc0003", filter_logic="or")

    assert [s.span_id for s in result] == ["aaaa0001", "cccc0003"]


async def test_query_spans_contains_filter_is_case_sensitive(store: LightningStore) -> None:
    rollout_id = await three_distinct_spans(store)

    assert [s.span_id for s in await store.query_spans(rollout_id, name_contains="LLM")] == []


async def test_query_spans_filters_only_the_given_rollout(store: LightningStore) -> None:
    rollout_id = await three_distinct_spans(store)
    other = await store.start_rollout({"q": 2})
    await store.add_span(make_span(other, "aaaa0001", trace_id="trace-one"))

    result = await store.query_spans(rollout_id, trace_id="trace-one")

    assert {s.rollout_id for s in result} == {rollout_id}


async def test_query_spans_sorts_by_sequence_id_by_default(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_many_spans([make_span(rollout, "late", sequence_id=9), make_span(rollout, "early", sequence_id=2)])

    assert [s.span_id for s in await store.query_spans(rollout.rollout_id)] == ["early", "late"]


async def test_query_spans_sort_by_name_descending(store: LightningStore) -> None:
    rollout_id = await three_distinct_spans(store)

    result = await store.query_spans(rollout_id, sort_by="name", sort_order="desc")

    assert [s.name for s in result] == ["tool_50%", "llm.call", "agent.run"]


async def test_query_spans_sort_by_start_time(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_many_spans(
        [
            make_span(rollout, "x", sequence_id=1, start_time=30.0),
            make_span(rollout, "y", sequence_id=2, start_time=10.0),
            make_span(rollout, "z", sequence_id=3, start_time=20.0),
        ]
    )

    ascending = await store.query_spans(rollout.rollout_id, sort_by="start_time")
    descending = await store.query_spans(rollout.rollout_id, sort_by="start_time", sort_order="desc")

    assert [s.span_id for s in ascending] == ["y", "z", "x"]
    assert [s.span_id for s in descending] == ["x", "z", "y"]


async def test_query_spans_limit_and_offset_page_with_total(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    await store.add_many_spans([make_span(rollout, f"s{i}", sequence_id=i) for i in range(1, 6)])

    page = await store.query_spans(rollout.rollout_id, limit=2, offset=1)
    tail = await store.query_spans(rollout.rollout_id, limit=10, offset=4)
    past_end = await store.query_spans(rollout.rollout_id, limit=2, offset=9)

    assert [s.span_id for s in page] == ["s2", "s3"]
    assert (page.total, page.limit, page.offset) == (5, 2, 1)
    assert [s.span_id for s in tail] == ["s5"] and tail.total == 5
    assert list(past_end) == [] and past_end.total == 5


async def test_query_spans_refuses_a_limit_of_zero(store: LightningStore) -> None:
    # As Agent Lightning's server refuses it (400 over HTTP): -1 is "no limit", a page holds at least one item.
    rollout = await store.start_rollout({"q": 1})

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_spans(rollout.rollout_id, limit=0)
    assert caught.value.field == "limit"


async def test_query_spans_rejects_unknown_sort_field(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_spans(rollout.rollout_id, sort_by="attributes")
    assert caught.value.field == "sort_by"


async def test_query_spans_rejects_limit_below_minus_one(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_spans(rollout.rollout_id, limit=-2)
    assert caught.value.field == "limit"


async def test_query_spans_rejects_negative_offset(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_spans(rollout.rollout_id, offset=-1)
    assert caught.value.field == "offset"


async def test_concurrent_duplicate_spans_are_stored_once(store: LightningStore, store_factory: StoreFactory) -> None:
    rollout = await store.start_rollout({"q": 1})
    other = await store_factory()
    span = make_span(rollout, "s1")

    results = await asyncio.gather(*(s.add_span(span) for _ in range(5) for s in (store, other)))

    assert sum(r is not None for r in results) == 1
    assert (await store.query_spans(rollout.rollout_id)).total == 1


async def test_concurrent_span_writes_each_get_their_own_answer_and_a_bad_one_fails_alone(
    store: LightningStore,
) -> None:
    # Concurrent writes may share a transaction (the SQL store coalesces them): a write naming an unknown attempt
    # fails on its own, every other write lands, and each caller gets back its own new spans.
    first, second = await store.start_rollout({"q": 1}), await store.start_rollout({"q": 2})

    async def ids(spans: list[Span], **kwargs: Any) -> list[str]:
        return [span.span_id for span in await store.add_many_spans(spans, **kwargs)]

    pairs = [ids([make_span(first, f"a{i}", sequence_id=i), make_span(second, f"b{i}")]) for i in range(8)]
    unknown = ids([make_span(first, "x1", attempt_id="at-unknown")])
    repeat = ids([make_span(first, "a0")])
    numbered = ids([make_span(second, "n", sequence_id=0)], allocate_sequence_ids=True)
    results = await asyncio.gather(*pairs, unknown, repeat, numbered, return_exceptions=True)

    assert isinstance(results[8], NotFoundError)
    assert results[1:8] == [[f"a{i}", f"b{i}"] for i in range(1, 8)]
    # a0 is new to exactly one of the two writes that carry it.
    assert (results[0], results[9]) in ((["a0", "b0"], []), (["b0"], ["a0"]))
    assert results[10] == ["n"]
    assert sorted(s.span_id for s in await spans_of(store, first.rollout_id)) == [f"a{i}" for i in range(8)]
    assert len(await spans_of(store, second.rollout_id)) == 9
    assert len({s.sequence_id for s in await spans_of(store, second.rollout_id) if s.span_id == "n"} - {0}) == 1


async def test_add_many_spans_of_several_rollouts_in_one_batch(store: LightningStore) -> None:
    first, second = await store.start_rollout({"q": 1}), await store.start_rollout({"q": 2})

    added = await store.add_many_spans(
        [make_span(first, "a1"), make_span(second, "b1"), make_span(first, "a2", sequence_id=2)]
    )

    assert [s.span_id for s in added] == ["a1", "b1", "a2"]
    assert [s.span_id for s in await spans_of(store, first.rollout_id)] == ["a1", "a2"]
    assert [s.span_id for s in await spans_of(store, second.rollout_id)] == ["b1"]
    for rollout in (first, second):  # each span was a heartbeat of its own attempt
        attempt = await store.get_latest_attempt(rollout.rollout_id)
        assert attempt is not None and attempt.status == "running"
