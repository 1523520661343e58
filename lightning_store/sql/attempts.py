"""Attempt methods of the SQL store."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.contract import UNSET, Unset
from lightning_store.errors import ConflictError, NotFoundError
from lightning_store.models import (
    ACTIVE_ATTEMPT_STATUSES,
    ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    PaginatedResult,
    RolloutConfig,
    SortOrder,
)
from lightning_store.sql import transitions, validate
from lightning_store.sql.base import SqlBase, Wakeups
from lightning_store.sql.dialect import among_param, among_value
from lightning_store.sql.paging import fetch_page
from lightning_store.sql.rows import attempt_document, attempt_from_row, attempt_text_columns
from lightning_store.sql.schema import attempts


@functools.cache
def _latest_among(dialect: str, as_text: bool = False) -> sa.Select[Any]:
    """The latest attempt of each rollout in parameter ``rollout_ids`` (an :func:`among_value`), built once per
    dialect: building it took longer than running it, on every page of rollouts and every claim. ``as_text``: the
    columns of :func:`attempt_text_columns`."""
    later = attempts.alias("later")
    columns = attempt_text_columns(dialect) if as_text else (attempts,)
    return sa.select(*columns).where(
        among_param(dialect, attempts.c.rollout_id, "rollout_ids"),
        ~sa.exists().where(later.c.rollout_id == attempts.c.rollout_id, later.c.sequence_id > attempts.c.sequence_id),
    )


ATTEMPT_SORTABLE = ("sequence_id", "attempt_id", "start_time", "end_time", "status", "worker_id", "last_heartbeat_time")


class AttemptOps(SqlBase):
    async def _latest_attempts(self, conn: AsyncConnection, rollout_ids: Sequence[str]) -> dict[str, Attempt]:
        """The latest attempt of each rollout that has one, in one query."""
        if not rollout_ids:
            return {}
        ids = {"rollout_ids": among_value(self.dialect, set(rollout_ids))}
        found = (await conn.execute(_latest_among(self.dialect), ids)).mappings()
        return {row["rollout_id"]: attempt_from_row(row) for row in found}

    async def _latest_attempt_documents(self, conn: AsyncConnection, rollout_ids: Sequence[str]) -> dict[str, str]:
        """:meth:`_latest_attempts` as :func:`attempt_document` JSON, for :func:`rollout_from_text_row`."""
        if not rollout_ids:
            return {}
        ids = {"rollout_ids": among_value(self.dialect, set(rollout_ids))}
        found = (await conn.execute(_latest_among(self.dialect, as_text=True), ids)).mappings()
        return {row["rollout_id"]: attempt_document(row) for row in found}

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Attempt]:
        async with self._read() as conn:
            rows, total = await fetch_page(
                conn,
                sa.select(attempts).where(attempts.c.rollout_id == rollout_id),
                table=attempts,
                sort_by=sort_by,
                sort_order=sort_order,
                sortable=ATTEMPT_SORTABLE,
                limit=limit,
                offset=offset,
                tiebreak=attempts.c.sequence_id,
            )
        return PaginatedResult(items=[attempt_from_row(r) for r in rows], limit=limit, offset=offset, total=total)

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        async with self._read() as conn:
            return await transitions.latest_attempt(conn, rollout_id)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | Unset = UNSET,
        worker_id: str | Unset = UNSET,
        last_heartbeat_time: float | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
        *,
        if_current: bool = False,
    ) -> Attempt:
        if status is not UNSET:
            validate.one_of(status, ATTEMPT_STATUSES, "status")
        async with self._write() as (conn, wakeups):
            return await self._update_in(
                conn,
                wakeups,
                rollout_id,
                attempt_id,
                status=status,
                worker_id=worker_id,
                last_heartbeat_time=last_heartbeat_time,
                metadata=metadata,
                if_current=if_current,
                now=time.time(),
            )

    async def _update_in(
        self,
        conn: AsyncConnection,
        wakeups: Wakeups,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | Unset = UNSET,
        worker_id: str | Unset = UNSET,
        last_heartbeat_time: float | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
        if_current: bool,
        now: float,
    ) -> Attempt:
        """``update_attempt`` inside the caller's write transaction; raises before writing anything when the
        attempt is unknown or (with ``if_current``) no longer current."""
        rollout = await transitions.lock_rollout(conn, rollout_id)
        latest = await transitions.latest_attempt(conn, rollout_id)
        if attempt_id == "latest":
            if latest is None:
                raise NotFoundError(f"rollout {rollout_id!r} has no attempts", field="attempt_id")
            attempt = latest
        else:
            row = (
                (
                    await conn.execute(
                        sa.select(attempts).where(
                            attempts.c.rollout_id == rollout_id, attempts.c.attempt_id == attempt_id
                        )
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found", field="attempt_id")
            attempt = attempt_from_row(row)
        if if_current:
            _check_current(attempt, latest)
        values: dict[str, Any] = {}
        if worker_id is not UNSET:
            values["worker_id"] = worker_id
        if last_heartbeat_time is not UNSET:
            values["last_heartbeat_time"] = last_heartbeat_time
        if metadata is not UNSET:
            values["metadata"] = metadata
        if values:
            await conn.execute(sa.update(attempts).where(attempts.c.attempt_id == attempt.attempt_id).values(values))
            attempt = attempt.model_copy(update=values)
        if status is not UNSET:
            attempt = await transitions.set_attempt_status(
                conn,
                wakeups,
                self.dialect,
                attempt=attempt,
                status=status,
                rollout_status=rollout["status"],
                config=RolloutConfig.model_validate(rollout["config"]),
                is_latest=latest is not None and latest.attempt_id == attempt.attempt_id,
                now=now,
            )
        elif worker_id is not UNSET:
            await transitions.sync_worker(conn, self.dialect, attempt, now)
        return attempt


def _check_current(attempt: Attempt, latest: Attempt | None) -> None:
    if latest is None or latest.attempt_id != attempt.attempt_id:
        raise ConflictError(f"attempt {attempt.attempt_id!r} is no longer its rollout's latest", field="attempt_id")
    if attempt.status not in ACTIVE_ATTEMPT_STATUSES:
        raise ConflictError(f"attempt {attempt.attempt_id!r} has already ended ({attempt.status})", field="status")
