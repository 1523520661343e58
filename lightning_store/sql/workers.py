"""Worker methods of the SQL store. Worker status follows dequeues and attempt updates; heartbeats add stats."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.contract import UNSET, Unset
from lightning_store.models import WORKER_STATUSES, FilterLogic, PaginatedResult, SortOrder, Worker, WorkerStatus
from lightning_store.sql import validate
from lightning_store.sql.base import SqlBase
from lightning_store.sql.dialect import contains_text, insert_ignoring_conflicts, upsert_by_name
from lightning_store.sql.paging import combine, fetch_page
from lightning_store.sql.rows import WORKER_COLUMNS, worker_from_row
from lightning_store.sql.schema import workers

WORKER_SORTABLE = tuple(c for c in WORKER_COLUMNS if c not in ("heartbeat_stats",))


class WorkerOps(SqlBase):
    async def query_workers(
        self,
        *,
        status_in: Sequence[WorkerStatus] | None = None,
        worker_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Worker]:
        validate.all_of(status_in, WORKER_STATUSES, "status_in")
        conditions: list[sa.ColumnElement[bool]] = []
        if status_in is not None:
            conditions.append(workers.c.status.in_(list(status_in)))
        if worker_id_contains is not None:
            conditions.append(contains_text(self.dialect, workers.c.worker_id, worker_id_contains))
        query = sa.select(workers)
        combined = combine(conditions, filter_logic)
        if combined is not None:
            query = query.where(combined)
        async with self._read() as conn:
            rows, total = await fetch_page(
                conn,
                query,
                table=workers,
                sort_by=sort_by,
                sort_order=sort_order,
                sortable=WORKER_SORTABLE,
                limit=limit,
                offset=offset,
                tiebreak=workers.c.worker_id,
            )
        return PaginatedResult(items=[worker_from_row(r) for r in rows], limit=limit, offset=offset, total=total)

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        async with self._read() as conn:
            row = (await conn.execute(sa.select(workers).where(workers.c.worker_id == worker_id))).mappings().first()
        return None if row is None else worker_from_row(row)

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] | Unset = UNSET) -> Worker:
        validate.non_empty_id(worker_id, "worker_id")
        if heartbeat_stats is not UNSET and not isinstance(heartbeat_stats, dict):
            raise validate.InvalidRequestError("heartbeat_stats must be an object", field="heartbeat_stats")
        values: dict[str, Any] = {"worker_id": worker_id, "last_heartbeat_time": time.time()}
        if heartbeat_stats is not UNSET:
            values["heartbeat_stats"] = dict(heartbeat_stats)
        async with self._write() as (conn, _):
            await conn.execute(
                insert_ignoring_conflicts(self.dialect, workers, ["worker_id"]).values(
                    worker_id=worker_id, status="unknown"
                )
            )
            await conn.execute(sa.update(workers).where(workers.c.worker_id == worker_id).values(values))
            row = (await conn.execute(sa.select(workers).where(workers.c.worker_id == worker_id))).mappings().one()
        return worker_from_row(row)

    async def _mark_worker_idle(self, conn: AsyncConnection, worker_id: str, now: float) -> None:
        """A dequeue that found nothing: the worker is idle (its idle time starts now unless it already was)."""
        current = (
            await conn.execute(sa.select(workers.c.status).where(workers.c.worker_id == worker_id))
        ).scalar_one_or_none()
        values: dict[str, Any] = {"worker_id": worker_id, "last_dequeue_time": now, "status": "idle"}
        if current != "idle":
            values.update(last_idle_time=now, current_rollout_id=None, current_attempt_id=None)
        # Built once per set of columns (two): building an upsert per empty claim cost more than running it.
        await conn.execute(upsert_by_name(self.dialect, workers, ("worker_id",), tuple(values)), values)
