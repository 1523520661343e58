"""``end_attempts`` as a few set-wise statements, whatever the size of the batch.

Each entry means what ``update_attempt(rollout_id, attempt_id, status=..., metadata=..., if_current=True)`` means,
applied in ``(rollout_id, position)`` order: an entry whose attempt is no longer current (superseded, or ended
already, possibly by an earlier entry of the same batch) is skipped with ``None``, and the rollout of an applied
one follows its retry policy. Applying them one by one took about six statements per entry inside the write
transaction; on SQLite every statement is a trip to the database thread while the single write lock is held.
Here the rollouts are locked and the attempts read in one statement each, the outcome is decided in Python, and
the writes go out as one ``executemany`` per shape of change: about six statements for any number of entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.errors import NotFoundError
from lightning_store.models import ACTIVE_ATTEMPT_STATUSES, Attempt, AttemptEnd, RolloutConfig, RolloutStatus
from lightning_store.sql.base import Wakeups
from lightning_store.sql.rows import attempt_from_row
from lightning_store.sql.schema import attempts, rollouts
from lightning_store.sql.transitions import set_rollout_statuses, sync_workers

_later = attempts.alias("later")


async def apply_ends(
    conn: AsyncConnection, wakeups: Wakeups, dialect: str, ends: Sequence[AttemptEnd], now: float
) -> list[Attempt | None]:
    """Apply ``ends`` in the caller's write transaction; the ended attempts, ``None`` where one was not current.
    Raises :class:`NotFoundError` naming ``ends.N.rollout_id`` / ``ends.N.attempt_id`` before writing anything."""
    rollout_ids = sorted({end.rollout_id for end in ends})
    # Locked in rollout order, as every writer that locks several rollouts does (no deadlock on Postgres).
    locked = {
        row["rollout_id"]: row
        for row in (
            await conn.execute(
                sa.select(rollouts.c.rollout_id, rollouts.c.status, rollouts.c.config)
                .where(rollouts.c.rollout_id.in_(rollout_ids))
                .order_by(rollouts.c.rollout_id)
                .with_for_update()
            )
        ).mappings()
    }
    named = {end.attempt_id for end in ends}
    is_latest = ~sa.exists().where(
        _later.c.rollout_id == attempts.c.rollout_id, _later.c.sequence_id > attempts.c.sequence_id
    )
    found = [
        attempt_from_row(row)
        for row in (
            await conn.execute(
                sa.select(attempts).where(
                    sa.or_(attempts.c.attempt_id.in_(named), sa.and_(attempts.c.rollout_id.in_(rollout_ids), is_latest))
                )
            )
        ).mappings()
    ]
    by_id = {attempt.attempt_id: attempt for attempt in found}
    latest: dict[str, Attempt] = {}
    for attempt in found:
        if attempt.rollout_id not in latest or attempt.sequence_id > latest[attempt.rollout_id].sequence_id:
            latest[attempt.rollout_id] = attempt

    results: list[Attempt | None] = [None] * len(ends)
    rollout_status = {rollout_id: row["status"] for rollout_id, row in locked.items()}
    changed_rollouts: dict[str, RolloutStatus] = {}
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
        follows = lifecycle.rollout_status_from_attempt(end.status, target.sequence_id, config)
        if follows != rollout_status[end.rollout_id]:
            rollout_status[end.rollout_id] = changed_rollouts[end.rollout_id] = follows

    applied = [attempt for attempt in results if attempt is not None]
    await _write_attempts(conn, applied)
    await set_rollout_statuses(conn, wakeups, changed_rollouts, now)
    await sync_workers(conn, dialect, applied, now)
    return results


async def _write_attempts(conn: AsyncConnection, applied: list[Attempt]) -> None:
    # One shape: an entry without metadata writes back what the attempt had.
    if not applied:
        return
    statement = (
        sa.update(attempts)
        .where(attempts.c.attempt_id == sa.bindparam("of_attempt"))
        .values(
            status=sa.bindparam("new_status"),
            end_time=sa.bindparam("new_end_time"),
            metadata=sa.bindparam("new_metadata", type_=attempts.c.metadata.type),
        )
    )
    params = [
        {"of_attempt": a.attempt_id, "new_status": a.status, "new_end_time": a.end_time, "new_metadata": a.metadata}
        for a in applied
    ]
    await conn.execute(statement, params)
