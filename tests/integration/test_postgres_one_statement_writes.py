"""On Postgres a claim and an attempt's end write in one statement each (ADR 0022), and the claim's one race
falls back to the transaction it replaced.

What they write is specified once, in the conformance suite, on every backend; this file holds what is
particular to Postgres: how many statements they take, and the race that the one-statement claim cannot see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from lightning_store import EnqueueRolloutRequest
from lightning_store.models import AttemptEnd
from lightning_store.resources import LLM
from lightning_store.spans import Span
from lightning_store.sql.store import SqlStore, open_store

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("database_url", ["postgres"], indirect=True),
]


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, watchdog=False)
    try:
        yield opened
    finally:
        await opened.close()


def _span(rollout_id: str, attempt_id: str) -> Span:
    return Span.model_validate(
        {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "sequence_id": 0,
            "trace_id": "a" * 32,
            "span_id": "b" * 16,
            "parent_id": None,
            "name": "reward",
            "status": {"status_code": "OK"},
            "attributes": {"reward": 1.0},
            "events": [],
            "links": [],
            "start_time": 1.0,
            "end_time": 2.0,
            "context": None,
            "parent": None,
            "resource": {"attributes": {}},
        }
    )


async def test_a_claim_and_an_end_are_one_write_statement_each(store: SqlStore) -> None:
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement.lstrip().split(None, 1)[0].upper())

    await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=1)])
    event.listen(store.engine.sync_engine, "before_cursor_execute", record)

    [claim] = await store.claim_rollouts(limit=1, worker_id="w1")
    assert claim.resources is not None
    assert statements == ["WITH", "SELECT"], "the claim, then its resources"

    statements.clear()
    assert await store.claim_rollouts(limit=1, worker_id="w2") == []
    assert statements == ["WITH"], "a claim that finds nothing marks its worker idle in the same statement"

    statements.clear()
    rollout = claim.rollout
    end = AttemptEnd(
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt.attempt_id,
        status="succeeded",
        spans=[_span(rollout.rollout_id, rollout.attempt.attempt_id)],
    )
    [ended] = await store.end_attempts([end])
    assert ended is not None and ended.status == "succeeded"
    assert statements == ["SELECT", "WITH"], "the lock and read, then the writes, the span and the wake-up"
    assert [w.status for w in (await store.query_workers(sort_by="worker_id")).items] == ["idle", "idle"]
    assert len((await store.query_spans(rollout.rollout_id)).items) == 1


async def test_a_claim_that_meets_a_newer_attempt_claims_again_in_a_transaction(store: SqlStore) -> None:
    """The race: another transaction commits an attempt of the rollout between the claim statement's snapshot
    and its lock, so the statement's next sequence id is taken. Here a trigger stands in for that transaction:
    it inserts the colliding attempt inside the claim statement, once (a sequence counts its firings, and is not
    rolled back with the statement)."""
    await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=1)])
    async with store.engine.begin() as conn:
        for ddl in (
            "CREATE SEQUENCE race_firings",
            """CREATE FUNCTION race() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF pg_trigger_depth() = 1 AND nextval('race_firings') = 1 THEN
                    INSERT INTO attempts (rollout_id, attempt_id, sequence_id, start_time, status)
                    VALUES (NEW.rollout_id, 'at-race', NEW.sequence_id, 0, 'preparing');
                END IF;
                RETURN NEW;
            END $$""",
            "CREATE TRIGGER race BEFORE INSERT ON attempts FOR EACH ROW EXECUTE FUNCTION race()",
        ):
            await conn.execute(sa.text(ddl))
    try:
        claimed = await store.dequeue_rollout(worker_id="w1")
        assert claimed is not None and claimed.attempt.sequence_id == 1
        async with store.engine.connect() as conn:
            assert (await conn.execute(sa.text("SELECT last_value FROM race_firings"))).scalar_one() == 2
            found = await conn.execute(sa.text("SELECT attempt_id FROM attempts"))
            assert [row[0] for row in found] == [claimed.attempt.attempt_id], "the failed statement left nothing"
        rollout = await store.get_rollout_by_id(claimed.rollout_id)
        assert rollout is not None and rollout.status == "preparing"
    finally:
        async with store.engine.begin() as conn:
            await conn.execute(sa.text("DROP TRIGGER race ON attempts"))
            await conn.execute(sa.text("DROP FUNCTION race()"))
            await conn.execute(sa.text("DROP SEQUENCE race_firings"))
