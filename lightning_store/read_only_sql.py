"""``store sql``: one statement against the store, read-only in fact rather than by keyword.

- **Postgres**: a ``READ ONLY`` transaction with a ``statement_timeout``, run as the role
  :data:`READER_ROLE` (revision 0009 creates it, with ``SELECT`` on the schema's tables and views and nothing else):
  a read-only transaction alone still runs ``COPY … TO PROGRAM``, ``pg_read_file`` or ``pg_terminate_backend``
  for a privileged user, which the role cannot. Where the role is missing (the migrating user could not create
  it) the statement runs as the connecting user, and the caller is told so.
- **SQLite**: the file opened for reading only (a missing file is refused, not created), ``query_only``, an
  authorizer that refuses ``ATTACH``/``DETACH`` (which would create files) and turning ``query_only`` off, and a
  progress handler that stops a statement past its timeout.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from lightning_store.errors import InvalidRequestError
from lightning_store.export.reader import reader
from lightning_store.sql.engine import is_memory_sqlite, normalize_url

READER_ROLE = "lightning_store_reader"
_ROLE_USABLE = sa.text(
    f"SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER_ROLE}') "
    f"THEN pg_has_role(current_user, '{READER_ROLE}', 'MEMBER') ELSE false END"
)
_LOCKED_PRAGMAS = {"query_only", "writable_schema", "trusted_schema"}


async def run_read_only(
    database: str | URL | AsyncEngine,
    statement: str,
    *,
    timeout: float,
    warn: Callable[[str], None],
    max_rows: int | None = None,
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The column names and rows of ``statement`` (no columns: it returns no rows); ``timeout`` seconds at most;
    at most ``max_rows`` rows plus one (so that the caller can tell there were more). Database errors are raised
    as SQLAlchemy raises them.

    Give a URL, not a running store's engine: the statement gets a connection of its own, closed after it, so
    that nothing it leaves on its session (a session-level advisory lock, a prepared statement) outlives it in a
    pool the store uses. An in-memory SQLite database has no other connection, and is refused."""
    url = database.url if isinstance(database, AsyncEngine) else database
    if is_memory_sqlite(normalize_url(url)):
        raise InvalidRequestError("an in-memory SQLite store cannot be read with SQL from outside", field="query")
    unguarded = ""
    async with reader(database) as (engine, _), engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(sa.text("SET TRANSACTION READ ONLY"))
            await conn.execute(sa.text(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}"))
            if await conn.scalar(_ROLE_USABLE):
                await conn.execute(sa.text(f"SET LOCAL ROLE {READER_ROLE}"))
            else:  # said once the statement has run: a failure stays one line
                unguarded = (
                    f"the role {READER_ROLE} is missing or not granted to this user (run `store migrate` as a "
                    "user that may create roles): the statement ran read-only as the connecting user"
                )
        else:
            sqlite_connection: Any = (await conn.get_raw_connection()).driver_connection  # aiosqlite's
            await sqlite_connection.set_authorizer(_sqlite_authorizer)
            deadline = time.monotonic() + timeout
            await sqlite_connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            result = await conn.execute(sa.text(statement))
            answer: tuple[list[str], list[tuple[Any, ...]]] = ([], [])
            if result.returns_rows:
                rows = result.all() if max_rows is None else result.fetchmany(max_rows + 1)
                answer = list(result.keys()), [tuple(row) for row in rows]
            if unguarded:
                warn(unguarded)
            return answer
        finally:
            await conn.rollback()


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _LOCKED_PRAGMAS and arg2 is not None:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK
