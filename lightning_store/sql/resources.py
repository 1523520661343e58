"""Resources methods of the SQL store: versioned named snapshots; the latest is the most recently written.

``resources`` holds each id's latest version; every write also appends the version it made to
``resource_versions``, in the same transaction, so the history never misses a version that was acknowledged.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.errors import InvalidRequestError, NotFoundError
from lightning_store.models import PaginatedResult, SortOrder
from lightning_store.resources import WRITING, NamedResources, ResourcesUpdate
from lightning_store.sql import validate
from lightning_store.sql.base import SqlBase
from lightning_store.sql.dialect import among_param, among_value, contains_text, upsert
from lightning_store.sql.paging import fetch_page
from lightning_store.sql.rows import new_id, resources_from_row
from lightning_store.sql.schema import attempts, resource_versions, resources, rollouts

RESOURCES_SORTABLE = ("resources_id", "create_time", "update_time", "version")
_named_resources: TypeAdapter[NamedResources] = TypeAdapter(NamedResources)
_LATEST = sa.select(resources).order_by(resources.c.update_time.desc(), resources.c.pk.desc()).limit(1)
# One statement for the rollout, its attempt and its snapshot, built once: the LLM proxy asks it on every call.
_ATTEMPT_RESOURCES = (
    sa.select(
        sa.exists()
        .where(attempts.c.rollout_id == sa.bindparam("rollout_id"), attempts.c.attempt_id == sa.bindparam("attempt_id"))
        .label("has_attempt"),
        *resources.c,
    )
    .select_from(rollouts.outerjoin(resources, resources.c.resources_id == rollouts.c.resources_id))
    .where(rollouts.c.rollout_id == sa.bindparam("rollout_id"))
)


def _checked(value: Any) -> dict[str, Any]:
    """The snapshot as JSON, after checking that each entry is a known resource type."""
    if isinstance(value, dict):
        value = {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in value.items()}
    try:
        parsed = _named_resources.validate_python(value, context=WRITING)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = ".".join(str(p) for p in ("resources", *error["loc"]))
        raise InvalidRequestError(f"{path}: {error['msg']}", field=path) from None
    dumped: dict[str, Any] = _named_resources.dump_python(parsed, mode="json")
    return dumped


def _history_row(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The ``resource_versions`` row of a version just written (``row`` as ``resources`` now holds it)."""
    return {
        "resources_id": row["resources_id"],
        "version": row["version"],
        "time": row["update_time"],
        "resources": row["resources"],
    }


@functools.cache
def _resources_among(dialect: str) -> sa.Select[Any]:
    """The snapshots whose ids are parameter ``ids`` (an :func:`among_value`), built once per dialect."""
    return sa.select(resources).where(among_param(dialect, resources.c.resources_id, "ids"))


async def resources_for_ids(
    conn: AsyncConnection, dialect: str, resources_ids: Sequence[str | None]
) -> dict[str | None, ResourcesUpdate | None]:
    """:meth:`ResourceOps.resources_for` on an open connection (a claim reads them in its own transaction)."""
    wanted = {rid for rid in resources_ids if rid}
    found: dict[str | None, ResourcesUpdate | None] = {}
    if wanted:
        rows = await conn.execute(_resources_among(dialect), {"ids": among_value(dialect, sorted(wanted))})
        found = {row["resources_id"]: resources_from_row(row) for row in rows.mappings()}
    if any(rid not in found for rid in resources_ids):
        row = (await conn.execute(_LATEST)).mappings().first()
        latest = None if row is None else resources_from_row(row)
        found.update({rid: latest for rid in resources_ids if rid not in found})
    return found


class ResourceOps(SqlBase):
    async def add_resources(self, resources_: NamedResources) -> ResourcesUpdate:
        payload = _checked(resources_)
        now = time.time()
        row = {"resources_id": new_id("rs"), "create_time": now, "update_time": now, "version": 1, "resources": payload}
        async with self._write() as (conn, _):
            await conn.execute(sa.insert(resources).values(row))
            await conn.execute(sa.insert(resource_versions).values(_history_row(row)))
        return ResourcesUpdate.model_validate(row)

    async def update_resources(self, resources_id: str, resources_: NamedResources) -> ResourcesUpdate:
        validate.non_empty_id(resources_id, "resources_id")
        payload = _checked(resources_)
        now = time.time()
        row = {"resources_id": resources_id, "create_time": now, "update_time": now, "version": 1, "resources": payload}
        # One upsert: concurrent first updates of a new id cannot both insert.
        stmt = upsert(
            self.dialect,
            resources,
            ["resources_id"],
            row,
            on_conflict={"update_time": now, "version": resources.c.version + 1, "resources": payload},
        ).returning(*resources.c)
        async with self._write() as (conn, _):
            stored = (await conn.execute(stmt)).mappings().one()
            await conn.execute(sa.insert(resource_versions).values(_history_row(stored)))
        return resources_from_row(stored)

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        async with self._read() as conn:
            row = (
                (await conn.execute(sa.select(resources).where(resources.c.resources_id == resources_id)))
                .mappings()
                .first()
            )
        return None if row is None else resources_from_row(row)

    async def get_attempt_resources(self, rollout_id: str, attempt_id: str) -> ResourcesUpdate | None:
        validate.non_empty_id(rollout_id, "rollout_id")
        validate.non_empty_id(attempt_id, "attempt_id")
        async with self._read(snapshot=False) as conn:  # the proxy's read per call: the rollout's, else latest
            ids = {"rollout_id": rollout_id, "attempt_id": attempt_id}
            row = (await conn.execute(_ATTEMPT_RESOURCES, ids)).mappings().first()
            if row is None:
                raise NotFoundError(f"rollout {rollout_id!r} not found", field="rollout_id")
            if not row["has_attempt"]:
                raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found", field="attempt_id")
            if row["resources_id"] is not None:
                return resources_from_row(row)
            latest = (await conn.execute(_LATEST)).mappings().first()
        return None if latest is None else resources_from_row(latest)

    async def resources_for(self, resources_ids: Sequence[str | None]) -> dict[str | None, ResourcesUpdate | None]:
        """For each of ``resources_ids``, the snapshot an attempt of a rollout with that ``resources_id`` runs
        with: that id's, else (an unknown id, or None) the latest; in one read."""
        async with self._read() as conn:
            return await resources_for_ids(conn, self.dialect, resources_ids)

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        async with self._read() as conn:
            row = (await conn.execute(_LATEST)).mappings().first()
        return None if row is None else resources_from_row(row)

    async def query_resources(
        self,
        *,
        resources_id: str | None = None,
        resources_id_contains: str | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[ResourcesUpdate]:
        query = sa.select(resources)
        if resources_id is not None:
            query = query.where(resources.c.resources_id == resources_id)
        if resources_id_contains is not None:
            query = query.where(contains_text(self.dialect, resources.c.resources_id, resources_id_contains))
        async with self._read() as conn:
            rows, total = await fetch_page(
                conn,
                query,
                table=resources,
                sort_by=sort_by,
                sort_order=sort_order,
                sortable=RESOURCES_SORTABLE,
                limit=limit,
                offset=offset,
                tiebreak=resources.c.pk,
            )
        return PaginatedResult(items=[resources_from_row(r) for r in rows], limit=limit, offset=offset, total=total)
