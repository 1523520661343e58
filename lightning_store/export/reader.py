"""How ``store export`` reads: an engine whose statements stream, and one read-only snapshot for the whole export
(:mod:`lightning_store.export`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from lightning_store.errors import DatabaseUnavailableError
from lightning_store.sql.engine import is_memory_sqlite, is_sqlite, make_engine, missing_sqlite_file, normalize_url


@contextlib.asynccontextmanager
async def reader(database: str | URL | AsyncEngine) -> AsyncIterator[tuple[AsyncEngine, bool]]:
    """An engine to read with, and whether it is this export's own (else the caller's, left open).

    A SQLite file gets an engine of its own on plain aiosqlite connections, whose cursors step through a
    statement's rows as they are fetched: the store's engine fetches every row of a statement at once
    (:mod:`lightning_store.sql.sqlite_driver`), which is right for its short queries and wrong here."""
    url = normalize_url(database.url if isinstance(database, AsyncEngine) else database)
    if isinstance(database, AsyncEngine) and (not is_sqlite(url) or is_memory_sqlite(url)):
        yield database, False
        return
    if is_sqlite(url):
        _check_sqlite_file(url)
        engine = create_async_engine(url, poolclass=NullPool)
        event.listen(engine.sync_engine, "connect", _read_only_sqlite)
    else:
        engine = make_engine(url, pool_size=1)
    try:
        yield engine, True
    finally:
        await engine.dispose()


def _check_sqlite_file(url: URL) -> None:
    """A SQLite file that does not exist is refused, not created (as opening it would)."""
    if (path := missing_sqlite_file(url)) is not None:
        raise DatabaseUnavailableError(f"no such file: {path}")


def _read_only_sqlite(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # transactions are ours: see begin_snapshot
    cursor = dbapi_connection.cursor()
    for pragma in ("PRAGMA busy_timeout=30000", "PRAGMA query_only=ON"):
        cursor.execute(pragma)
    cursor.close()


async def begin_snapshot(conn: AsyncConnection, *, owned: bool) -> None:
    """One read-only transaction for the whole export: every file sees the same store."""
    if conn.dialect.name == "postgresql":
        await conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
    elif owned:
        await conn.exec_driver_sql("BEGIN")
    else:  # the caller's SQLite engine (in memory): it began the transaction itself
        await conn.exec_driver_sql("PRAGMA query_only = ON")


async def end_snapshot(conn: AsyncConnection, *, owned: bool) -> None:
    if conn.dialect.name != "postgresql" and not owned:
        await conn.exec_driver_sql("PRAGMA query_only = OFF")
    await conn.rollback()
