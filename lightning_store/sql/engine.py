"""Engines for the two backends, and the few places where SQLite needs telling how to behave."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from lightning_store.errors import InvalidRequestError
from lightning_store.sql import sqlite_driver

WRITE_OPTION = "lightning_store_write"
"""Execution option that marks a connection as a writer (``BEGIN IMMEDIATE`` on SQLite)."""


def normalize_url(url: str | URL) -> URL:
    """Accept plain ``postgresql://`` and ``sqlite:///`` URLs and pick the async drivers for them."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+asyncpg")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    raise InvalidRequestError(f"unsupported database {backend!r}: use postgresql or sqlite", field="database_url")


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def is_memory_sqlite(url: URL) -> bool:
    return is_sqlite(url) and url.database in (None, "", ":memory:")


def make_engine(url: str | URL, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine. SQLite gets WAL, enforced foreign keys, a busy timeout, explicit transactions and
    one trip to its connection's thread per statement (:mod:`lightning_store.sql.sqlite_driver`)."""
    parsed = normalize_url(url)
    if not is_sqlite(parsed):
        return create_async_engine(parsed, pool_size=pool_size, max_overflow=pool_size)
    kwargs: dict[str, Any] = {}
    if is_memory_sqlite(parsed):
        kwargs["poolclass"] = StaticPool
    else:
        # No overflow: an overflow connection is opened and closed around a single use, and with aiosqlite that
        # is a thread and four PRAGMAs per request once more than pool_size requests run at once. Waiting for a
        # pooled connection is cheaper (and SQLite gains nothing from more concurrent readers on a few cores).
        kwargs.update(pool_size=pool_size, max_overflow=0)
    # The same connection arguments SQLAlchemy would give aiosqlite, to connections with one-trip statements.
    args, connect_args = parsed.get_dialect()().create_connect_args(parsed)
    kwargs["async_creator"] = functools.partial(sqlite_driver.connect, *args, **connect_args)
    engine = create_async_engine(parsed, **kwargs)
    _configure_sqlite(engine)
    return engine


def _configure_sqlite(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so that BEGIN is ours (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=NORMAL",
            "PRAGMA foreign_keys=ON",
            "PRAGMA busy_timeout=30000",
        ):
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A writer takes the write lock up front: a deferred transaction that reads and then writes can fail
        # with SQLITE_BUSY at once when another process also writes, without waiting for busy_timeout.
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql(sqlite_driver.BEGIN_IMMEDIATE if immediate else sqlite_driver.BEGIN)
