"""Engines for the two backends, and the few places where SQLite needs telling how to behave."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from lightning_store.errors import DatabaseUnavailableError, InvalidRequestError
from lightning_store.sql import sqlite_driver
from lightning_store.sql.dialect import postgres_json

WRITE_OPTION = "lightning_store_write"
"""Execution option that marks a connection as a writer (``BEGIN IMMEDIATE`` on SQLite)."""

STATEMENT_OPTION = "lightning_store_one_statement"
"""Execution option that marks a SQLite reader whose statements each stand alone: no ``BEGIN``, so a read of one
statement is one trip to the database thread (a transaction costs a second one, for its ``COMMIT``)."""
CONNECT_TIMEOUT = 10.0
"""Seconds a new Postgres connection may take (asyncpg's default, 60 s, outlasts every client's patience)."""
DEADLINE_MARGIN = 2.0
"""Seconds the store's own clock gives a Postgres statement past the server's ``statement_timeout``: the server
stops a slow statement first (and says so); the store stops waiting on a connection that does not answer at all."""

UNAVAILABLE_SQLSTATES = ("08", "53", "57P01", "57P02", "57P03", "3D000", "28")
"""Postgres error codes (or their classes) that mean the database cannot serve us now: connection exceptions,
insufficient resources (too many connections, disk full), shutting down or starting up, the database missing,
the credentials refused."""
UNAVAILABLE_SQLITE_CODES = frozenset({5, 6, 10, 13, 14, 26})
"""SQLite primary result codes that say the same: BUSY and LOCKED (past the busy timeout), IOERR, FULL, CANTOPEN,
NOTADB (the file is not a SQLite database: nothing of the store can be read there either)."""


def missing_sqlite_file(url: str | URL) -> Path | None:
    """The file of a SQLite URL when it does not exist (opening it would create an empty database), else None
    (it exists, it is in memory or a URI, or the URL is not SQLite's)."""
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        return None  # not a URL: whoever opens it says so
    if not is_sqlite(parsed) or is_memory_sqlite(parsed) or "uri" in parsed.query:
        return None
    path = Path(parsed.database or "")
    return None if path.is_file() else path


def normalize_url(url: str | URL) -> URL:
    """Accept plain ``postgresql://`` and ``sqlite:///`` URLs and pick the async drivers for them."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        _require_asyncpg()
        return parsed.set(drivername="postgresql+asyncpg")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+aiosqlite")
    raise InvalidRequestError(f"unsupported database {backend!r}: use postgresql or sqlite", field="database_url")


def _require_asyncpg() -> None:
    """Postgres's driver is the ``postgres`` extra (the embedded default needs none): without it, say in one line
    what to install, rather than SQLAlchemy's ``No module named 'asyncpg'`` traceback."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise InvalidRequestError(
            "Postgres needs its driver, which the core install leaves out: pip install 'lightning-store[postgres]'",
            field="database_url",
        ) from None


def shown_url(database_url: str) -> str:
    """``database_url`` as it may be printed: without its password."""
    try:
        return make_url(database_url).render_as_string(hide_password=True)
    except sa_exc.ArgumentError:
        return database_url


def is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def is_memory_sqlite(url: URL) -> bool:
    return is_sqlite(url) and url.database in (None, "", ":memory:")


def make_engine(
    url: str | URL,
    *,
    pool_size: int = 10,
    inline: bool = False,
    budget: int | None = None,
    deadline: float | None = None,
) -> AsyncEngine:
    """An async engine. SQLite gets WAL, enforced foreign keys, a busy timeout, explicit transactions and
    one trip to its connection's thread per statement (:mod:`lightning_store.sql.sqlite_driver`); ``inline``:
    none, its statements run on the event loop's thread, and move to their connection's thread when they meet a
    lock or run past ``budget`` steps.

    Postgres with a ``deadline`` (seconds; the store's ``statement_timeout`` setting): no statement waits longer
    than that for a pooled connection, for a lock (``lock_timeout``) or to run (``statement_timeout``), and the
    store stops waiting for an answer ``DEADLINE_MARGIN`` s later (a stalled network, where the server's own
    timeouts never reach us), dropping that connection. Each raises an error that
    :func:`unavailable_reason` reads as an outage, so the request is answered 503 within the deadline rather than
    hanging as long as the stall."""
    parsed = normalize_url(url)
    # No overflow on either backend: SQLAlchemy closes an overflow connection when it is returned, so every burst
    # of more than pool_size requests would open and close connections: Postgres backends started and ended (at
    # 16 runner workers a fifth of the rollouts/s), or on SQLite a thread and four PRAGMAs per request. Waiting
    # for a pooled connection is cheaper.
    pool: dict[str, Any] = {"pool_size": pool_size, "max_overflow": 0}
    if not is_sqlite(parsed):
        asyncpg_args: dict[str, Any] = {"timeout": CONNECT_TIMEOUT}
        if deadline:
            milliseconds = str(max(1, round(deadline * 1000)))
            asyncpg_args["server_settings"] = {"statement_timeout": milliseconds, "lock_timeout": milliseconds}
            asyncpg_args["command_timeout"] = deadline + DEADLINE_MARGIN
            pool["pool_timeout"] = deadline
        engine = create_async_engine(parsed, **pool, json_serializer=postgres_json, connect_args=asyncpg_args)
        if deadline:
            _drop_connections_that_time_out(engine)
        return engine
    kwargs: dict[str, Any] = {}
    if is_memory_sqlite(parsed):
        kwargs["poolclass"] = StaticPool
    else:
        kwargs.update(pool)  # SQLite gains nothing from more concurrent readers on a few cores either
    # The same connection arguments SQLAlchemy would give aiosqlite, to connections with one-trip statements.
    inline = inline and sqlite_driver.ONE_TRIP
    args, connect_args = parsed.get_dialect()().create_connect_args(parsed)
    kwargs["async_creator"] = functools.partial(
        sqlite_driver.connect, *args, inline=inline, budget=budget, **connect_args
    )
    engine = create_async_engine(parsed, **kwargs)
    _configure_sqlite(engine, inline=inline)
    return engine


def _drop_connections_that_time_out(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "handle_error")
    def _on_error(context: Any) -> None:
        # asyncpg gave up waiting (command_timeout): the statement may still be on its way or running, so the
        # connection's state is unknown. Treated as a disconnect, SQLAlchemy closes it instead of pooling it.
        if isinstance(context.original_exception, TimeoutError):
            context.is_disconnect = True


def _configure_sqlite(engine: AsyncEngine, *, inline: bool) -> None:
    # An inline connection must not wait for a lock on the event loop's thread: it has no busy timeout, and its
    # statements that find a lock taken wait on its own thread instead (sqlite_driver._inline).
    busy_timeout = 0 if inline else sqlite_driver.BUSY_TIMEOUT_MS

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so that BEGIN is ours (see _on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=NORMAL",
            "PRAGMA foreign_keys=ON",
            f"PRAGMA busy_timeout={busy_timeout}",
        ):
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A writer takes the write lock up front: a deferred transaction that reads and then writes can fail
        # with SQLITE_BUSY at once when another process also writes, without waiting for busy_timeout.
        options = conn.get_execution_options()
        if options.get(STATEMENT_OPTION, False):
            return  # the driver is in autocommit: each statement is its own transaction
        immediate = options.get(WRITE_OPTION, False)
        conn.exec_driver_sql(sqlite_driver.BEGIN_IMMEDIATE if immediate else sqlite_driver.BEGIN)


def unavailable_reason(exc: BaseException) -> str | None:
    """One line on why the database cannot be reached when ``exc`` says so, else ``None`` (a bug, a constraint,
    a bad statement). The one place that decides what a database outage looks like.

    What an outage raises (found by cutting a forwarder between the store and Postgres): a refused or failed
    connect is a bare ``OSError`` (``ConnectionRefusedError``, ``ConnectionResetError``, ``socket.gaierror``;
    a connect that hangs, ``TimeoutError``); a pooled connection cut under a statement is a ``DBAPIError``
    marked ``connection_invalidated`` (asyncpg's ``ConnectionDoesNotExistError``, SQLSTATE 08003, or, for a
    backend terminated by the server, an ``InternalClientError``); a pool with no connection free in time is
    ``sqlalchemy.exc.TimeoutError``; a server that is down for maintenance, full, missing the database or
    turning the role away answers one of :data:`UNAVAILABLE_SQLSTATES`; SQLite, one of
    :data:`UNAVAILABLE_SQLITE_CODES`.
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        orig = current.orig if isinstance(current, sa_exc.DBAPIError) else None
        current = orig if isinstance(orig, BaseException) and orig is not current else current.__cause__
    if not any(_means_unavailable(link) for link in chain):
        return None
    for link in reversed(chain):  # the innermost one that says something
        if isinstance(link, asyncio.CancelledError | sa_exc.StatementError):
            continue
        message = str(link).strip() or ("timed out" if isinstance(link, TimeoutError) else "")
        if message:
            return f"{type(link).__name__}: {message.splitlines()[0][:300]}"
    return type(exc).__name__


def _means_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OSError | sa_exc.TimeoutError):
        return True
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(UNAVAILABLE_SQLSTATES):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and code & 0xFF in UNAVAILABLE_SQLITE_CODES


@contextlib.contextmanager
def unavailable_as_error() -> Iterator[None]:
    """Raise :class:`DatabaseUnavailableError` (from the original) for an error that says the database cannot
    be reached; let every other error through unchanged."""
    try:
        yield
    except DatabaseUnavailableError:
        raise
    except Exception as exc:
        reason = unavailable_reason(exc)
        if reason is None:
            raise
        raise DatabaseUnavailableError(reason) from exc
