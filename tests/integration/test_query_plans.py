"""Plan regressions: the queue and span queries use the indexes built for them (Postgres)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from lightning_store import EnqueueRolloutRequest
from lightning_store.sql import SqlStore
from tests.conftest import StoreFactory

pytestmark = pytest.mark.postgres


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


async def test_claim_uses_the_partial_queue_index(store_factory: StoreFactory) -> None:
    from lightning_store.sql.claims import _CLAIM

    store = await store_factory()
    assert isinstance(store, SqlStore)
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(200)])
    assert "ix_rollouts_queue" in await explain(store, _CLAIM, {"limit": 1})


async def test_span_query_uses_the_rollout_sequence_index(store_factory: StoreFactory) -> None:
    store = await store_factory()
    assert isinstance(store, SqlStore)
    from lightning_store.sql.schema import spans

    query = sa.select(spans).where(spans.c.rollout_id == sa.bindparam("r")).order_by(spans.c.sequence_id)
    assert "ix_spans_rollout_id_sequence_id" in await explain(store, query, {"r": "ro-x"})
