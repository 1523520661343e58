"""The claim on Postgres as one statement (ADR 0022).

A claim took four statements in a transaction: the queue's ``SKIP LOCKED`` pop, the attempts' insert, the
workers' upsert and, for a call that found nothing, a read and an upsert marking its worker idle; with ``BEGIN``
and ``COMMIT`` six trips to the database, each costing the server about 0.09 ms of CPU in SQLAlchemy and asyncpg
alone. Here data-modifying CTEs do all of it in one statement, run in autocommit: one statement is one atomic
transaction on Postgres, so nothing is half-claimed.

The calls of a coalesced batch (:class:`~lightning_store.sql.claims.ClaimCall`) are passed as arrays: call ``i``
takes the claimed rows at positions ``taken_before[i] + 1 .. taken_before[i] + limit``, in queue order, as the
transaction's Python did.

One race this statement cannot see, and leaves to the caller: every part of a statement reads one snapshot, so
an attempt that another transaction inserted and committed between that snapshot and our lock on its rollout
(which ``SKIP LOCKED`` takes without waiting, so the window is microseconds) is missing from ``max(sequence_id)``,
and our insert then violates ``(rollout_id, sequence_id)``. The statement fails as a whole, having written
nothing; :class:`~lightning_store.sql.claims.ClaimOps` then claims in a transaction, statement by statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.limits import MAX_INT
from lightning_store.models import Attempt
from lightning_store.sql.schema import QUEUED, rollouts

ATTEMPT_ID_SQL = "'at-' || left(replace(CAST(gen_random_uuid() AS text), '-', ''), 12)"
"""A new attempt id, as :func:`lightning_store.sql.rows.new_id` makes one in Python (``at-`` and 48 random
bits in 12 hex digits; the first 12 hex digits of a version-4 UUID are random)."""

_NOW = "CAST(:now AS double precision)"

_CLAIM = sa.text(
    f"""
WITH head AS MATERIALIZED (
    SELECT pk FROM rollouts WHERE {QUEUED} ORDER BY enqueue_time, pk LIMIT :limit FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE rollouts SET status = 'preparing' WHERE pk IN (SELECT pk FROM head) RETURNING *
), placed AS (
    SELECT claimed.*, row_number() OVER (ORDER BY enqueue_time, pk) AS position FROM claimed
), calls AS (
    SELECT * FROM unnest(CAST(:taken_before AS bigint[]), CAST(:workers AS text[]), CAST(:mark_idle AS boolean[]))
        AS call_ (taken_before, worker_id, marks_idle)
), started AS (
    INSERT INTO attempts (rollout_id, attempt_id, sequence_id, start_time, status, worker_id)
    SELECT
        placed.rollout_id,
        {ATTEMPT_ID_SQL},
        COALESCE((SELECT max(earlier.sequence_id) FROM attempts AS earlier
                  WHERE earlier.rollout_id = placed.rollout_id), 0) + 1,
        {_NOW},
        'preparing',
        (SELECT calls.worker_id FROM calls WHERE calls.taken_before < placed.position
         ORDER BY calls.taken_before DESC LIMIT 1)
    FROM placed
    RETURNING rollout_id, attempt_id, sequence_id, worker_id
), busy AS (
    INSERT INTO workers AS worker
        (worker_id, status, last_busy_time, current_rollout_id, current_attempt_id, last_dequeue_time)
    SELECT DISTINCT ON (started.worker_id)
        started.worker_id, 'busy', {_NOW}, started.rollout_id, started.attempt_id, {_NOW}
    FROM started JOIN placed USING (rollout_id)
    WHERE started.worker_id IS NOT NULL
    ORDER BY started.worker_id, placed.position DESC
    ON CONFLICT (worker_id) DO UPDATE SET
        status = excluded.status,
        last_busy_time = excluded.last_busy_time,
        current_rollout_id = excluded.current_rollout_id,
        current_attempt_id = excluded.current_attempt_id,
        last_dequeue_time = excluded.last_dequeue_time
), idle AS (
    INSERT INTO workers AS worker (worker_id, status, last_dequeue_time, last_idle_time)
    SELECT DISTINCT calls.worker_id, 'idle', {_NOW}, {_NOW}
    FROM calls
    WHERE calls.marks_idle AND calls.worker_id IS NOT NULL
        AND calls.taken_before >= (SELECT count(*) FROM claimed)
        AND calls.worker_id NOT IN (SELECT started.worker_id FROM started WHERE started.worker_id IS NOT NULL)
    ON CONFLICT (worker_id) DO UPDATE SET
        status = 'idle',
        last_dequeue_time = excluded.last_dequeue_time,
        last_idle_time = CASE WHEN worker.status = 'idle' THEN worker.last_idle_time ELSE excluded.last_idle_time END,
        current_rollout_id = CASE WHEN worker.status = 'idle' THEN worker.current_rollout_id END,
        current_attempt_id = CASE WHEN worker.status = 'idle' THEN worker.current_attempt_id END
)
SELECT placed.*, started.attempt_id AS a_attempt_id, started.sequence_id AS a_sequence_id,
    started.worker_id AS a_worker_id
FROM placed JOIN started USING (rollout_id)
ORDER BY placed.position
"""
).columns(
    *rollouts.c,
    sa.column("position", sa.BigInteger),
    sa.column("a_attempt_id", sa.String),
    sa.column("a_sequence_id", sa.Integer),
    sa.column("a_worker_id", sa.String),
)
"""Parameters: ``limit`` (how many rows all calls want), ``taken_before`` / ``workers`` / ``mark_idle`` (the rows
the calls before each call take, its worker, whether finding nothing marks that worker idle), ``now``. The claimed
rows with their new attempts, in queue order. A worker that several attempts name takes the last one's state; a
worker whose call found nothing is marked idle (its idle time starts now unless it already was), unless another
of its calls got a rollout."""


class ClaimShape(Protocol):
    @property
    def limit(self) -> int: ...
    @property
    def worker_id(self) -> str | None: ...
    @property
    def mark_idle(self) -> bool: ...


async def claim(
    conn: AsyncConnection, calls: Sequence[ClaimShape], wanted: int, now: float
) -> list[tuple[sa.RowMapping, Attempt]]:
    """Run the claim for ``calls`` (``wanted``: their limits' sum, capped) on an autocommit connection: the
    claimed rollouts' rows, each with its new attempt, in queue order. Raises ``IntegrityError`` on the race in
    the module's docstring, having written nothing."""
    befores, taken = [], 0
    for call in calls:
        befores.append(taken)
        taken = min(taken + call.limit, MAX_INT)
    params = {
        "limit": wanted,
        "taken_before": befores,
        "workers": [call.worker_id for call in calls],
        "mark_idle": [call.mark_idle for call in calls],
        "now": now,
    }
    rows = (await conn.execute(_CLAIM, params)).mappings().all()
    return [
        (
            row,
            Attempt(
                rollout_id=row["rollout_id"],
                attempt_id=row["a_attempt_id"],
                sequence_id=row["a_sequence_id"],
                start_time=now,
                status="preparing",
                worker_id=row["a_worker_id"],
            ),
        )
        for row in rows
    ]
