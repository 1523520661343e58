"""The dashboard's one way into the data: fixed SELECT statements over the documented views (sql.md).

The dashboard writes nothing: every statement here and in the page modules is a SELECT written in this package
(no user SQL), run in a plain read transaction on the store's own read engine; the rollouts table also picks its
page's ids on the indexed ``rollouts`` table (see ``rollouts_query.py``). Dialect differences that the views
do not already hide (time buckets, JSON members of ``metadata``) live in the small helpers below.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from lightning_store.errors import StoreError
from lightning_store.sql.engine import unavailable_as_error


class DashboardUnavailableError(StoreError):
    """The server's store is not a database this process reads (e.g. a store handed in by a test that wraps
    another server): the dashboard has nothing to read from."""


class Reader:
    """Runs the dashboard's SELECTs on ``engine``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"

    async def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with unavailable_as_error():
            async with self.engine.connect() as conn:
                result = await conn.execute(sa.text(sql), dict(params or {}))
                return [dict(row) for row in result.mappings()]

    async def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        rows = await self.rows(sql, params)
        return next(iter(rows[0].values())) if rows else None

    def bucket(self, column: str, seconds: int) -> str:
        """``column`` (seconds since the epoch) as the index of its ``seconds``-long bucket."""
        if self.postgres:
            return f"CAST(floor({column} / {seconds}) AS BIGINT)"
        return f"CAST({column} / {seconds} AS INTEGER)"  # times are positive: truncation is the floor

    def json_text(self, column: str, key: str) -> str:
        """The member ``key`` of the JSON object ``column`` as text (numbers and booleans in their JSON
        spelling), NULL when absent. ``key`` must be a bound parameter's name, never user text."""
        if self.postgres:
            return f"({column} ->> :{key})"
        path = f"'$.\"' || :{key} || '\"'"
        # SQLite's json_extract gives 1 and 0 for true and false: spell booleans as JSON (and as Postgres) does.
        return (
            f"CASE json_type({column}, {path}) WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' "
            f"ELSE CAST(json_extract({column}, {path}) AS TEXT) END"
        )

    def json_number(self, column: str, key: str) -> str:
        """The member ``key`` of ``column`` as a number when it is one, else NULL (as the views read JSON)."""
        if self.postgres:
            return (
                f"CASE WHEN jsonb_typeof({column} -> '{key}') = 'number' "
                f"THEN ({column} ->> '{key}')::double precision END"
            )
        path = f"'$.\"{key}\"'"
        return f"CASE WHEN json_type({column}, {path}) IN ('integer', 'real') THEN json_extract({column}, {path}) END"


def bound_list(prefix: str, values: Iterable[Any]) -> tuple[str, dict[str, Any]]:
    """``values`` as bound parameters for ``IN (…)``: the placeholders (``:a_0, :a_1``) and their values."""
    params = {f"{prefix}_{i}": value for i, value in enumerate(values)}
    return ", ".join(f":{name}" for name in params), params


def reader_of(request: Request) -> Reader:
    """The reader for the store this server serves (made once per application)."""
    state = request.app.state
    found: Reader | None = getattr(state, "dashboard_reader", None)
    if found is None:
        engine = getattr(state.store, "engine", None)
        if not isinstance(engine, AsyncEngine):
            raise DashboardUnavailableError("the dashboard reads a database, and this server's store is not one")
        found = state.dashboard_reader = Reader(engine)
    return found
