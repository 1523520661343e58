"""``POST /v1/sql``: one read-only SQL statement against the served database (an addition).

What ``store sql --store http://…`` sends, so that a user reads the server's store with SQL from any directory or
machine, with the server's token, instead of opening a database file that may not be the server's. The statement
runs exactly as ``store sql`` runs it on the database (:func:`lightning_store.read_only_sql.run_read_only`:
read-only in fact, as a role that may only ``SELECT`` on Postgres, a read-only connection on SQLite), with a
timeout and a row cap that the server bounds. A statement that fails (a syntax error, a write, a timeout) is a 400
naming ``query`` with the database's own message, never a 500.
"""

from __future__ import annotations

import json
import math
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from lightning_store.errors import BadRequestError, DatabaseUnavailableError, InvalidRequestError
from lightning_store.read_only_sql import run_read_only
from lightning_store.server import wire
from lightning_store.server.json_body import CheckedJsonRoute

router = APIRouter(prefix="/v1", route_class=CheckedJsonRoute)

MAX_TIMEOUT = 300.0
"""The longest a statement may run, in seconds: it holds a connection of the server's pool meanwhile."""
MAX_ROWS = 1_000_000


class SqlBody(wire.Body):
    query: str = Field(
        min_length=1, max_length=1_000_000, description="One SQL statement, e.g. SELECT * FROM rollouts_v."
    )
    timeout: float = Field(default=30.0, gt=0, le=MAX_TIMEOUT, description="Seconds the statement may run.")
    max_rows: int = Field(
        default=10_000, ge=1, le=MAX_ROWS, description="Rows answered at most (`truncated` says more)."
    )


class SqlAnswer(BaseModel):
    columns: list[str] = Field(description="Column names; empty when the statement returns no rows.")
    rows: list[list[Any]] = Field(
        description="Each row's values as JSON: text, numbers, booleans, null; other types (times, bytes, "
        "non-finite numbers) as text."
    )
    truncated: bool = Field(description="More rows than `max_rows` were returned; the first `max_rows` are here.")
    warnings: list[str] = Field(description="E.g. that the statement ran as the connecting user (no reader role).")


@router.post("/sql", response_model=SqlAnswer, responses={400: {"description": "The statement failed: `detail`"}})
async def sql(body: SqlBody, request: Request) -> Response:
    """Run one read-only statement and answer its rows (addition: `store sql --store URL` sends it)."""
    database = getattr(request.app.state.store, "url", None)
    if database is None:  # a store without a database of its own
        raise InvalidRequestError("this server's store has no database to query", field="query")
    warnings: list[str] = []
    try:
        columns, rows = await run_read_only(
            database, body.query, timeout=body.timeout, warn=warnings.append, max_rows=body.max_rows
        )
    except sa.exc.DBAPIError as exc:
        if _is_outage(exc):
            raise DatabaseUnavailableError(str(exc.orig)) from None
        raise BadRequestError(_failure(exc, body.timeout), field="query") from None
    except (sa.exc.SQLAlchemyError, ValueError) as exc:  # e.g. a statement SQLAlchemy cannot even prepare
        raise BadRequestError(f"{type(exc).__name__}: {exc}", field="query") from None
    answer = {
        "columns": columns,
        "rows": [[_plain(value) for value in row] for row in rows[: body.max_rows]],
        "truncated": len(rows) > body.max_rows,
        "warnings": warnings,
    }
    return Response(json.dumps(answer, allow_nan=False), media_type="application/json")


def _is_outage(exc: sa.exc.DBAPIError) -> bool:
    return bool(exc.connection_invalidated)


def _failure(exc: sa.exc.DBAPIError, timeout: float) -> str:
    reason = str(exc.orig)
    if reason == "interrupted" or "statement timeout" in reason:
        return f"stopped after the timeout of {timeout:g} s ({reason})"
    return reason


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: containers walked, non-finite numbers and other types as text."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)
