"""The LLM proxy's call recorder: one transaction per batch on the SQL store, two writes through any other store,
and the same records either way (sequence ids shared by each call and its span; a duplicate span's call left out;
a record of an unknown attempt dropped without losing the rest of its batch)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from lightning_store import LlmCall
from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout
from lightning_store.server.recorder import MAX_BATCH, CallRecord, CallRecorder
from lightning_store.spans import Span
from lightning_store.sql import SqlStore
from tests.conftest import SQL_BACKENDS, serving

pytestmark = SQL_BACKENDS


def record(rollout_id: str, attempt_id: str, span_id: str, *, with_call: bool = True) -> CallRecord:
    def build(sequence_id: int) -> tuple[Span, LlmCall | None]:
        span = Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            trace_id="ab" * 16,
            span_id=span_id,
            name="chat tiny",
            attributes={"lightning_store.llm_call": True},
            start_time=1.0,
            end_time=2.0,
        )
        call = LlmCall(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            span_id=span_id,
            sequence_id=sequence_id,
            prompt_token_ids=[1, 2],
            response_token_ids=[3],
            start_time=1.0,
            end_time=2.0,
        )
        return span, call if with_call else None

    return CallRecord(rollout_id, attempt_id, build)


async def recorded_through(store: LightningStore, batches: list[list[CallRecord]]) -> None:
    recorder = CallRecorder(store)
    for batch in batches:
        for one in batch:
            recorder.add(one)
        await recorder.close()  # each batch is written as one


@pytest.mark.parametrize("through", ["sql", "http"])
async def test_calls_and_spans_share_sequence_ids_and_a_bad_record_loses_nothing_else(
    sql_store: SqlStore, through: str
) -> None:
    first: AttemptedRollout = await sql_store.start_rollout({"i": 1})
    second: AttemptedRollout = await sql_store.start_rollout({"i": 2})
    a, b = (first.rollout_id, first.attempt.attempt_id), (second.rollout_id, second.attempt.attempt_id)
    batches = [
        [record(*a, "s1"), record(*b, "s1"), record(*a, "s2", with_call=False)],  # an error call: a span only
        [record(*a, "s1"), record("ro-gone", "at-gone", "s9"), record(*a, "s3")],  # a duplicate, an unknown
    ]
    client: Any = None
    if through == "http":
        async with serving(sql_store) as url:
            client = HttpStore(url)
            try:
                await recorded_through(client, batches)
            finally:
                await client.close()
    else:
        await recorded_through(sql_store, batches)

    spans = {s.span_id: s.sequence_id for s in await sql_store.query_spans(a[0])}
    calls = {c.span_id: c.sequence_id for c in await sql_store.query_llm_calls([a[0]])}
    # A duplicate still takes a number from its rollout's counter (as add_many_spans does), so s3 comes after a gap.
    assert spans["s1"] == 1 and spans["s2"] == 2 and spans["s3"] > 2 and set(spans) == {"s1", "s2", "s3"}
    assert calls == {"s1": 1, "s3": spans["s3"]}  # s2 failed (no call); the duplicate s1 kept its first record
    assert [c.sequence_id for c in await sql_store.query_llm_calls([b[0]])] == [1]


async def test_a_window_gathers_records_and_an_end_or_a_full_batch_cuts_it_short(sql_store: SqlStore) -> None:
    """Records gather for the window before they are written; ``settled`` (an attempt's end) and ``close`` write
    them at once, and so does a batch of ``MAX_BATCH`` records."""
    first: AttemptedRollout = await sql_store.start_rollout({"i": 1})
    second: AttemptedRollout = await sql_store.start_rollout({"i": 2})
    a, b = (first.rollout_id, first.attempt.attempt_id), (second.rollout_id, second.attempt.attempt_id)
    recorder = CallRecorder(sql_store, window=2.0)
    started = asyncio.get_running_loop().time()
    recorder.add(record(*a, "s1"))
    recorder.add(record(*b, "s1"))
    await asyncio.sleep(0.2)
    assert await sql_store.query_llm_calls([a[0], b[0]]) == []  # held by the window
    await asyncio.wait_for(recorder.settled(a[1]), timeout=1.5)  # an end does not wait for the window
    assert asyncio.get_running_loop().time() - started < 1.9
    assert {c.rollout_id for c in await sql_store.query_llm_calls([a[0], b[0]])} == {a[0], b[0]}  # one batch

    recorder.add(record(*a, "s2"))
    await asyncio.wait_for(recorder.close(), timeout=1.5)
    assert len(await sql_store.query_llm_calls([a[0]])) == 2

    full = CallRecorder(sql_store, window=30.0)
    for i in range(MAX_BATCH):
        full.add(record(*b, f"full-{i}"))
    for _ in range(100):
        if len(await sql_store.query_llm_calls([b[0]])) == MAX_BATCH + 1:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("a full batch waited for its window")
    await full.close()


async def test_an_absent_part_of_a_call_is_sql_null_on_every_backend(sql_store: SqlStore) -> None:
    """SQL sees an absent part of a call (``None``) as SQL NULL on SQLite as on Postgres (``WHERE response_logprobs
    IS NULL`` finds calls without logprobs), never as a JSON ``null`` (which ``store export`` once read as a
    broken array)."""
    rollout: AttemptedRollout = await sql_store.start_rollout({"i": 1})
    recorder = CallRecorder(sql_store)
    recorder.add(record(rollout.rollout_id, rollout.attempt.attempt_id, "s1"))  # no logprobs, request, response
    await recorder.close()
    async with sql_store.engine.connect() as conn:
        nulls = await conn.execute(
            sa.text("SELECT response_logprobs IS NULL, request IS NULL, response IS NULL FROM llm_calls")
        )
        assert [tuple(map(bool, row)) for row in nulls] == [(True, True, True)]
