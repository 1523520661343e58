"""State changes shared by several store methods and the watchdog, applied inside a write transaction.

The rules themselves live in :mod:`lightning_store.lifecycle`; this module turns them into SQL.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.errors import NotFoundError
from lightning_store.models import (
    ENDED_ATTEMPT_STATUSES,
    QUEUED_ROLLOUT_STATUSES,
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptStatus,
    RolloutConfig,
    RolloutStatus,
)
from lightning_store.sql.base import Wakeups
from lightning_store.sql.dialect import upsert_by_name
from lightning_store.sql.rows import attempt_from_row, new_id
from lightning_store.sql.schema import attempts, rollouts, workers

_earlier = attempts.alias("earlier")
_INSERT_NEXT_ATTEMPT = (
    sa.insert(attempts)
    .values(
        sequence_id=sa.select(sa.func.coalesce(sa.func.max(_earlier.c.sequence_id), 0) + 1)
        .where(_earlier.c.rollout_id == sa.bindparam("of_rollout"))
        .scalar_subquery()
    )
    .returning(attempts.c.attempt_id, attempts.c.sequence_id, sort_by_parameter_order=True)
)


async def lock_rollout(conn: AsyncConnection, rollout_id: str) -> sa.RowMapping:
    """The rollout's row, locked until commit (Postgres; SQLite has a single writer anyway)."""
    row = (
        (await conn.execute(sa.select(rollouts).where(rollouts.c.rollout_id == rollout_id).with_for_update()))
        .mappings()
        .first()
    )
    if row is None:
        raise NotFoundError(f"rollout {rollout_id!r} not found", field="rollout_id")
    return row


async def latest_attempt(conn: AsyncConnection, rollout_id: str) -> Attempt | None:
    row = (
        (
            await conn.execute(
                sa.select(attempts)
                .where(attempts.c.rollout_id == rollout_id)
                .order_by(attempts.c.sequence_id.desc())
                .limit(1)
            )
        )
        .mappings()
        .first()
    )
    return None if row is None else attempt_from_row(row)


def rollout_status_values(status: RolloutStatus, now: float) -> dict[str, Any]:
    """Columns that change with a rollout status: terminal stamps ``end_time``, queued moves to the tail."""
    values: dict[str, Any] = {"status": status}
    if status in TERMINAL_ROLLOUT_STATUSES:
        values["end_time"] = now
    elif status in QUEUED_ROLLOUT_STATUSES:
        values["enqueue_time"] = now
        values["end_time"] = None
    return values


def wake_for_status(wakeups: Wakeups, status: str) -> None:
    if status in TERMINAL_ROLLOUT_STATUSES:
        wakeups.add("done")
    elif status in QUEUED_ROLLOUT_STATUSES:
        wakeups.add("queue")


async def set_rollout_status(
    conn: AsyncConnection, wakeups: Wakeups, rollout_id: str, status: RolloutStatus, now: float
) -> None:
    await set_rollout_statuses(conn, wakeups, {rollout_id: status}, now)


async def set_rollout_statuses(
    conn: AsyncConnection, wakeups: Wakeups, statuses: dict[str, RolloutStatus], now: float
) -> None:
    """Set each rollout's status (a terminal one stamps ``end_time``, a queued one ``enqueue_time``)."""
    for status in statuses.values():
        wake_for_status(wakeups, status)
    await update_rollouts(
        conn, {rollout_id: rollout_status_values(status, now) for rollout_id, status in statuses.items()}
    )


async def update_rollouts(conn: AsyncConnection, changes: dict[str, dict[str, Any]]) -> None:
    """Write each rollout's changed columns (``changes``: rollout id → column → value), one ``executemany`` per
    set of columns, in rollout order."""
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for rollout_id, values in sorted(changes.items()):
        shapes.setdefault(tuple(values), []).append(
            {"of_rollout": rollout_id} | {f"new_{k}": v for k, v in values.items()}
        )
    for columns, params in shapes.items():
        await conn.execute(_update_rollouts_statement(columns), params)


@functools.lru_cache(maxsize=32)
def _update_rollouts_statement(columns: tuple[str, ...]) -> sa.Update:
    """``UPDATE rollouts SET <columns> = :new_<column> WHERE rollout_id = :of_rollout``, built once per shape
    (building a statement costs more than running it)."""
    return (
        sa.update(rollouts)
        .where(rollouts.c.rollout_id == sa.bindparam("of_rollout"))
        .values({column: sa.bindparam(f"new_{column}") for column in columns})
    )


async def create_attempt(conn: AsyncConnection, rollout_id: str, worker_id: str | None, now: float) -> Attempt:
    """Insert the next attempt of a (locked) rollout."""
    return (await create_attempts(conn, [rollout_id], [worker_id], now))[0]


async def create_attempts(
    conn: AsyncConnection, rollout_ids: Sequence[str], worker_ids: Sequence[str | None], now: float
) -> list[Attempt]:
    """Insert the next attempt of each (locked) rollout, run by the worker at the same position of
    ``worker_ids``, in one statement; sequence ids follow the last ones."""
    new = [
        _new_attempt(rollout_id, worker_id, now, 0)
        for rollout_id, worker_id in zip(rollout_ids, worker_ids, strict=True)
    ]
    params = [{**attempt.model_dump(exclude={"sequence_id"}), "of_rollout": attempt.rollout_id} for attempt in new]
    sequence_ids: dict[str, int] = dict((await conn.execute(_INSERT_NEXT_ATTEMPT, params)).all())
    return [attempt.model_copy(update={"sequence_id": sequence_ids[attempt.attempt_id]}) for attempt in new]


def _new_attempt(rollout_id: str, worker_id: str | None, now: float, sequence_id: int) -> Attempt:
    return Attempt(
        rollout_id=rollout_id,
        attempt_id=new_id("at"),
        sequence_id=sequence_id,
        start_time=now,
        status="preparing",
        worker_id=worker_id,
    )


async def sync_worker(
    conn: AsyncConnection, dialect: str, attempt: Attempt, now: float, *, dequeued: bool = False
) -> None:
    """Make the attempt's worker (if any) reflect the attempt's status."""
    await sync_workers(conn, dialect, [attempt], now, dequeued=dequeued)


async def sync_workers(
    conn: AsyncConnection, dialect: str, changed: Sequence[Attempt], now: float, *, dequeued: bool = False
) -> None:
    """:func:`sync_worker` for several attempts, one upsert ``executemany`` per set of columns; a worker named
    by several attempts takes the last one's state."""
    last = {attempt.worker_id: attempt for attempt in changed if attempt.worker_id}
    shapes: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for worker_id, attempt in last.items():
        values: dict[str, Any] = {"worker_id": worker_id, **lifecycle.worker_fields_for_attempt(attempt, now)}
        if dequeued:
            values["last_dequeue_time"] = now
        shapes.setdefault(tuple(values), []).append(values)
    for columns, params in shapes.items():
        await conn.execute(upsert_by_name(dialect, workers, ("worker_id",), columns), params)


async def set_attempt_status(
    conn: AsyncConnection,
    wakeups: Wakeups,
    dialect: str,
    *,
    attempt: Attempt,
    status: AttemptStatus,
    rollout_status: RolloutStatus,
    config: RolloutConfig,
    is_latest: bool,
    now: float,
) -> Attempt:
    """Move an attempt to ``status``; when it is the latest, the rollout follows the retry policy."""
    values: dict[str, Any] = {"status": status}
    if status in ENDED_ATTEMPT_STATUSES:
        values["end_time"] = now
    await conn.execute(sa.update(attempts).where(attempts.c.attempt_id == attempt.attempt_id).values(values))
    updated = attempt.model_copy(update=values)
    if is_latest:
        new_rollout_status = lifecycle.rollout_status_after_attempt(rollout_status, status, attempt.sequence_id, config)
        if new_rollout_status != rollout_status:
            await set_rollout_status(conn, wakeups, attempt.rollout_id, new_rollout_status, now)
    await sync_worker(conn, dialect, updated, now)
    return updated
