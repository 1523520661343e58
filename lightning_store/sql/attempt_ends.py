"""``end_attempts`` as a few set-wise statements, whatever the size of the batch.

Each entry means what ``update_attempt(rollout_id, attempt_id, status=..., metadata=..., if_current=True)`` means,
applied in ``(rollout_id, position)`` order: an entry whose attempt is no longer current (superseded, or ended
already, possibly by an earlier entry of the same batch) is skipped with ``None``, and the rollout of an applied
one follows its retry policy. Applying them one by one took about six statements per entry inside the write
transaction; on SQLite every statement is a trip to the database thread while the single write lock is held.
Here the rollouts are locked and their attempts read in one statement, the outcome is decided in Python
(:func:`decide_ends`), and the writes go out as one ``executemany`` per shape of change (:func:`write_ends`):
about four statements for any number of entries; on Postgres one (:mod:`~lightning_store.sql.postgres_end`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.errors import NotFoundError
from lightning_store.models import ACTIVE_ATTEMPT_STATUSES, Attempt, AttemptEnd, RolloutConfig
from lightning_store.spans import Span
from lightning_store.sql.base import Wakeups
from lightning_store.sql.dialect import among_param, among_value
from lightning_store.sql.rows import attempt_from_row
from lightning_store.sql.schema import attempts, rollouts
from lightning_store.sql.spans import numbered
from lightning_store.sql.transitions import rollout_status_values, sync_workers, update_rollouts, wake_for_status

_later = attempts.alias("later")
_WRITE_ATTEMPTS = (
    sa.update(attempts)
    .where(attempts.c.attempt_id == sa.bindparam("of_attempt"))
    .values(
        status=sa.bindparam("new_status"),
        end_time=sa.bindparam("new_end_time"),
        metadata=sa.bindparam("new_metadata", type_=attempts.c.metadata.type),
    )
)
_ATTEMPT_COLUMNS = [column.label(f"a_{column.name}") for column in attempts.c]


@functools.cache
def _lock_statement(dialect: str) -> sa.Select[Any]:
    """The ends' rollouts (parameter ``rollout_ids``), locked in rollout order (as every writer that locks several
    rollouts locks them: no deadlock on Postgres), each joined with its latest attempt and with its attempts the
    ends name (``named``): one row per rollout and attempt, with the rollout's span counter. One statement where
    locking and reading took two; built once per dialect (building it cost more than running it)."""
    is_latest = ~sa.exists().where(
        _later.c.rollout_id == attempts.c.rollout_id, _later.c.sequence_id > attempts.c.sequence_id
    )
    candidates = sa.and_(
        attempts.c.rollout_id == rollouts.c.rollout_id,
        sa.or_(among_param(dialect, attempts.c.attempt_id, "named"), is_latest),
    )
    return (
        sa.select(
            rollouts.c.rollout_id, rollouts.c.status, rollouts.c.config, rollouts.c.last_span_seq, *_ATTEMPT_COLUMNS
        )
        .select_from(rollouts.outerjoin(attempts, candidates))
        .where(among_param(dialect, rollouts.c.rollout_id, "rollout_ids"))
        .order_by(rollouts.c.rollout_id)
        .with_for_update(of=rollouts)
    )


@dataclass(frozen=True)
class EndWrites:
    """What applying a batch of ends writes: the ended attempts (their new status, end time and metadata; each
    one's worker follows it) and each rollout's changed columns (``status``, ``end_time``, ``enqueue_time``,
    ``last_span_seq``)."""

    attempts: list[Attempt]
    rollouts: dict[str, dict[str, Any]]
    now: float


async def decide_ends(
    conn: AsyncConnection,
    wakeups: Wakeups,
    dialect: str,
    ends: Sequence[AttemptEnd],
    carried: Sequence[Span],
    now: float,
) -> tuple[list[Attempt | None], list[Span], EndWrites]:
    """Lock and read what ``ends`` need, in the caller's write transaction, and decide: the ended attempts,
    ``None`` where one was not current; ``carried`` (spans of the ends' rollouts) numbered from their rollouts'
    span counters; and the writes that apply them (:func:`write_ends`, or one statement on Postgres:
    :mod:`~lightning_store.sql.postgres_end`), which advance the counters past those spans. The caller stores the
    spans. Raises :class:`NotFoundError` naming ``ends.N.rollout_id`` / ``ends.N.attempt_id`` before writing
    anything."""
    rollout_ids = sorted({end.rollout_id for end in ends})
    ids = {
        "rollout_ids": among_value(dialect, rollout_ids),
        "named": among_value(dialect, {e.attempt_id for e in ends}),
    }
    rows = (await conn.execute(_lock_statement(dialect), ids)).mappings().all()
    locked = {row["rollout_id"]: row for row in rows}
    found = [attempt_from_row(row, "a_") for row in rows if row["a_attempt_id"] is not None]
    by_id = {attempt.attempt_id: attempt for attempt in found}
    latest: dict[str, Attempt] = {}
    for attempt in found:
        if attempt.rollout_id not in latest or attempt.sequence_id > latest[attempt.rollout_id].sequence_id:
            latest[attempt.rollout_id] = attempt

    results: list[Attempt | None] = [None] * len(ends)
    rollout_status = {rollout_id: row["status"] for rollout_id, row in locked.items()}
    changes: dict[str, dict[str, Any]] = {}
    for i in sorted(range(len(ends)), key=lambda i: (ends[i].rollout_id, i)):
        end = ends[i]
        if end.rollout_id not in locked:
            raise NotFoundError(f"rollout {end.rollout_id!r} not found", field=f"ends.{i}.rollout_id")
        target = latest.get(end.rollout_id) if end.attempt_id == "latest" else by_id.get(end.attempt_id)
        if target is None or target.rollout_id != end.rollout_id:
            raise NotFoundError(
                f"attempt {end.attempt_id!r} of rollout {end.rollout_id!r} not found", field=f"ends.{i}.attempt_id"
            )
        if latest[end.rollout_id].attempt_id != target.attempt_id or target.status not in ACTIVE_ATTEMPT_STATUSES:
            continue  # the watchdog, a newer attempt or an earlier entry decided first: nothing written for it
        values: dict[str, Any] = {"status": end.status, "end_time": now}
        if end.metadata is not None:
            values["metadata"] = end.metadata
        ended = target.model_copy(update=values)
        results[i] = by_id[ended.attempt_id] = latest[end.rollout_id] = ended
        config = RolloutConfig.model_validate(locked[end.rollout_id]["config"])
        current = rollout_status[end.rollout_id]
        follows = (
            lifecycle.rollout_status_after_release(current)
            if end.requeue
            else lifecycle.rollout_status_after_attempt(current, end.status, target.sequence_id, config)
        )
        if follows != current:
            rollout_status[end.rollout_id] = follows
            changes[end.rollout_id] = rollout_status_values(follows, now)
            wake_for_status(wakeups, follows)

    spans_ = numbered(carried, {rollout_id: int(row["last_span_seq"]) for rollout_id, row in locked.items()})
    for span in spans_:  # numbered in order: the last span of a rollout has its highest number
        changes.setdefault(span.rollout_id, {})["last_span_seq"] = span.sequence_id
    applied = [attempt for attempt in results if attempt is not None]
    return results, spans_, EndWrites(attempts=applied, rollouts=changes, now=now)


async def write_ends(conn: AsyncConnection, dialect: str, writes: EndWrites) -> None:
    """Apply ``writes`` statement by statement: one ``executemany`` per shape of change."""
    await _write_attempts(conn, writes.attempts)
    await update_rollouts(conn, writes.rollouts)
    await sync_workers(conn, dialect, writes.attempts, writes.now)


async def _write_attempts(conn: AsyncConnection, applied: list[Attempt]) -> None:
    # One shape: an entry without metadata writes back what the attempt had.
    if not applied:
        return
    params = [
        {"of_attempt": a.attempt_id, "new_status": a.status, "new_end_time": a.end_time, "new_metadata": a.metadata}
        for a in applied
    ]
    await conn.execute(_WRITE_ATTEMPTS, params)
