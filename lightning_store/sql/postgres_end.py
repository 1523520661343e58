"""The writes of ``end_attempts`` on Postgres as one statement (ADR 0022).

After the ends' rollouts are locked and read (:func:`~lightning_store.sql.attempt_ends.decide_ends`), applying
them took four statements and a fifth to wake waiters: the attempts' update, the rollouts' update, the workers'
upsert, the carried spans' insert and ``pg_notify``, each a trip to the database and about 0.09 ms of the
server's CPU in SQLAlchemy and asyncpg. Here data-modifying CTEs make them one statement, with the changes
passed as arrays (one element per attempt, rollout or worker) and the spans as one JSON array, as
:meth:`~lightning_store.sql.spans.SpanOps._insert` passes them. It runs in the caller's transaction, after the
lock: what it writes is what the statements wrote, in the same transaction.
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.sql.attempt_ends import EndWrites
from lightning_store.sql.dialect import insert_from_json_array, postgres_json
from lightning_store.sql.notify import CHANNEL
from lightning_store.sql.schema import spans
from lightning_store.sql.spans import SPAN_FIELDS, SPAN_KEY

ROLLOUT_COLUMNS = frozenset({"status", "end_time", "enqueue_time", "last_span_seq"})
"""The rollout columns an end may change (``EndWrites.rollouts``)."""


@functools.cache
def _statement() -> sa.TextClause:
    insert_spans = insert_from_json_array(
        "postgresql", spans, SPAN_FIELDS, extra_column="extra", conflict_columns=SPAN_KEY
    ).text
    return sa.text(
        f"""
WITH ended AS (
    UPDATE attempts SET status = e.status, end_time = e.end_time, metadata = CAST(e.metadata AS jsonb)
    FROM unnest(CAST(:attempt_ids AS text[]), CAST(:attempt_statuses AS text[]),
                CAST(:attempt_end_times AS double precision[]), CAST(:attempt_metadata AS text[]))
        AS e (attempt_id, status, end_time, metadata)
    WHERE attempts.attempt_id = e.attempt_id
), moved AS (
    UPDATE rollouts SET
        status = COALESCE(c.status, rollouts.status),
        end_time = CASE WHEN c.sets_end_time THEN c.end_time ELSE rollouts.end_time END,
        enqueue_time = COALESCE(c.enqueue_time, rollouts.enqueue_time),
        last_span_seq = COALESCE(c.last_span_seq, rollouts.last_span_seq)
    FROM unnest(CAST(:rollout_ids AS text[]), CAST(:rollout_statuses AS text[]),
                CAST(:sets_end_time AS boolean[]), CAST(:rollout_end_times AS double precision[]),
                CAST(:enqueue_times AS double precision[]), CAST(:last_span_seqs AS bigint[]))
        AS c (rollout_id, status, sets_end_time, end_time, enqueue_time, last_span_seq)
    WHERE rollouts.rollout_id = c.rollout_id
), followed AS (
    INSERT INTO workers AS worker
        (worker_id, status, last_busy_time, last_idle_time, current_rollout_id, current_attempt_id)
    SELECT * FROM unnest(CAST(:worker_ids AS text[]), CAST(:worker_statuses AS text[]),
                         CAST(:busy_times AS double precision[]), CAST(:idle_times AS double precision[]),
                         CAST(:current_rollout_ids AS text[]), CAST(:current_attempt_ids AS text[]))
    ON CONFLICT (worker_id) DO UPDATE SET
        status = excluded.status,
        last_busy_time = COALESCE(excluded.last_busy_time, worker.last_busy_time),
        last_idle_time = COALESCE(excluded.last_idle_time, worker.last_idle_time),
        current_rollout_id = excluded.current_rollout_id,
        current_attempt_id = excluded.current_attempt_id
), stored AS (
    {insert_spans}
)
SELECT pg_notify(:channel, topic) FROM unnest(CAST(:topics AS text[])) AS topic
"""
    )


async def write(
    conn: AsyncConnection,
    writes: EndWrites,
    span_doc: str,
    topics: list[str],
) -> None:
    """Apply ``writes``, insert the spans of the JSON array ``span_doc`` (duplicates ignored) and ``pg_notify``
    each of ``topics`` (delivered at commit), in one statement of the caller's transaction."""
    params: dict[str, Any] = {"channel": CHANNEL, "topics": topics, "doc": span_doc}
    params |= _columns(
        [
            {
                "attempt_ids": a.attempt_id,
                "attempt_statuses": a.status,
                "attempt_end_times": a.end_time,
                "attempt_metadata": postgres_json(a.metadata),
            }
            for a in writes.attempts
        ],
        ("attempt_ids", "attempt_statuses", "attempt_end_times", "attempt_metadata"),
    )
    rollout_rows = []
    for rollout_id, values in writes.rollouts.items():
        if not values.keys() <= ROLLOUT_COLUMNS:
            raise ValueError(f"an end cannot change {sorted(values.keys() - ROLLOUT_COLUMNS)} of a rollout")
        rollout_rows.append(
            {
                "rollout_ids": rollout_id,
                "rollout_statuses": values.get("status"),
                "sets_end_time": "end_time" in values,
                "rollout_end_times": values.get("end_time"),
                "enqueue_times": values.get("enqueue_time"),
                "last_span_seqs": values.get("last_span_seq"),
            }
        )
    params |= _columns(
        rollout_rows,
        ("rollout_ids", "rollout_statuses", "sets_end_time", "rollout_end_times", "enqueue_times", "last_span_seqs"),
    )
    # A worker named by several attempts takes the last one's state, as sync_workers has it.
    last = {a.worker_id: a for a in writes.attempts if a.worker_id}
    worker_rows = []
    for worker_id, attempt in last.items():
        fields = lifecycle.worker_fields_for_attempt(attempt, writes.now)
        worker_rows.append(
            {
                "worker_ids": worker_id,
                "worker_statuses": fields["status"],
                "busy_times": fields.get("last_busy_time"),
                "idle_times": fields.get("last_idle_time"),
                "current_rollout_ids": fields["current_rollout_id"],
                "current_attempt_ids": fields["current_attempt_id"],
            }
        )
    params |= _columns(
        worker_rows,
        ("worker_ids", "worker_statuses", "busy_times", "idle_times", "current_rollout_ids", "current_attempt_ids"),
    )
    await conn.execute(_statement(), params)


def _columns(rows: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, list[Any]]:
    """Rows as one list per column: the arrays the statement unnests."""
    return {name: [row[name] for row in rows] for name in names}
