"""Plan regressions: the queue, wait and span queries use the indexes built for them (Postgres and SQLite)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from lightning_store import EnqueueRolloutRequest
from lightning_store.sql import SqlStore, open_store
from lightning_store.sql.claims import _claim_statement
from lightning_store.sql.dialect import among_value
from lightning_store.sql.rollouts import _finished_among
from tests.conftest import StoreFactory


@pytest.fixture
def backend() -> str:
    return "postgres"


def index_names(plan: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= index_names(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= index_names(value)
    return found


async def explain(store: SqlStore, statement: sa.ClauseElement, params: dict[str, Any]) -> set[str]:
    """Index names in the plan of ``statement`` (EXPLAIN without ANALYZE: nothing is executed)."""
    async with store.engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        assert isinstance(compiled, SQLCompiler)
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        bound = compiled.construct_params(params) or {}
        names = compiled.positiontup or []
        # A small table is cheapest to scan whole; forbid that so the test asks "can the index serve this?".
        await raw.execute("SET enable_seqscan = off")
        plan = await raw.fetchval(f"EXPLAIN (FORMAT JSON) {compiled}", *(bound[name] for name in names))
        await raw.execute("RESET enable_seqscan")
    return index_names(json.loads(plan) if isinstance(plan, str) else plan)


@pytest.mark.postgres
async def test_claim_uses_the_partial_queue_index(store_factory: StoreFactory) -> None:
    store = await store_factory()
    assert isinstance(store, SqlStore)
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(200)])
    assert "ix_rollouts_queue" in await explain(store, _claim_statement("postgresql"), {"limit": 1})


@pytest.mark.postgres
async def test_span_query_uses_the_rollout_sequence_index(store_factory: StoreFactory) -> None:
    store = await store_factory()
    assert isinstance(store, SqlStore)
    from lightning_store.sql.schema import spans

    query = sa.select(spans).where(spans.c.rollout_id == sa.bindparam("r")).order_by(spans.c.sequence_id)
    assert "ix_spans_rollout_id_sequence_id" in await explain(store, query, {"r": "ro-x"})


async def sqlite_plan(store: SqlStore, statement: sa.ClauseElement, params: dict[str, Any]) -> str:
    """SQLite's ``EXPLAIN QUERY PLAN`` of ``statement``, its steps' details joined by newlines."""
    async with store.engine.connect() as conn:
        compiled = statement.compile(dialect=conn.dialect)
        assert isinstance(compiled, SQLCompiler)
        bound = compiled.construct_params(params) or {}
        values = tuple(bound[name] for name in compiled.positiontup or [])
        rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", values)).all()
    return "\n".join(str(row[-1]) for row in rows)


async def test_sqlite_claims_and_waits_use_their_indexes_not_the_status_one(tmp_path: Path) -> None:
    """Without statistics, SQLite's planner preferred ix_rollouts_status: a claim sorted every queued rollout and a
    wait walked every finished one, so both slowed as the table grew. With a queue and finished rollouts in the
    table, the claim reads the queue's index in order and the wait looks its ids up by the rollout id."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", migrate=True, watchdog_interval=0)
    try:
        enqueued = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(60)])
        for rollout in enqueued[:30]:
            await store.update_rollout(rollout.rollout_id, status="succeeded")
        claim = await sqlite_plan(store, _claim_statement("sqlite"), {"limit": 1, "status": "preparing"})
        assert "ix_rollouts_queue" in claim and "ix_rollouts_status" not in claim and "TEMP B-TREE" not in claim
        ids = among_value("sqlite", [r.rollout_id for r in enqueued[:5]])
        wait = await sqlite_plan(store, _finished_among("sqlite"), {"ids": ids})
        assert "(rollout_id=?)" in wait and "ix_rollouts_status" not in wait, wait
        claimed = await store.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == enqueued[30].rollout_id
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_wait_looks_its_rollouts_up_by_id(store_factory: StoreFactory) -> None:
    store = await store_factory()
    assert isinstance(store, SqlStore)
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(200)])
    names = await explain(store, _finished_among("postgresql"), {"ids": ["ro-a", "ro-b"]})
    assert names == {"uq_rollouts_rollout_id"}, names


async def test_a_wait_on_many_rollouts_rereads_at_a_pace_not_at_every_end(tmp_path: Path) -> None:
    """Every attempt end wakes a wait, and its re-read costs in proportion to the ids still pending: a wait on
    300 rollouts ending one by one as fast as the store can end them re-reads a few dozen times, not 300, and still
    answers every one of them."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", migrate=True, watchdog_interval=0)
    rereads = 0

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal rereads
        rereads += "+rollouts.status" in statement

    sa.event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    try:
        enqueued = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(300)])
        ids = [r.rollout_id for r in enqueued]
        waiting = asyncio.create_task(store.wait_for_rollouts(rollout_ids=ids, timeout=60))
        await asyncio.sleep(0.05)
        for rollout_id in ids:
            await store.update_rollout(rollout_id, status="succeeded")
        finished = await waiting
        assert [r.rollout_id for r in finished] == ids
        assert rereads < 100, rereads
    finally:
        await store.close()
