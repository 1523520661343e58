"""aiosqlite connections whose statements take one trip to the database thread instead of four.

aiosqlite runs each sqlite3 call in the connection's own thread and wakes the event loop with its result.
SQLAlchemy's adapter makes four such calls per statement (open a cursor, execute, fetch the rows, close the
cursor), and each wake-up waits its turn behind whatever else the loop has ready. On a busy ``store serve``
that made a five-statement write transaction hold SQLite's single write lock for 15-60 ms, nearly all of it
waiting for the loop rather than for SQLite, and every other write queued behind it.

:class:`OneTripCursor` executes, fetches every row and closes the sqlite3 cursor in one call on the database
thread, then serves ``fetchall`` from memory. Fetching eagerly is what SQLAlchemy's adapter does anyway for
the ordinary (buffered) cursors the store uses.

Transactions cost no trips of their own either. The store begins each transaction with a ``BEGIN`` statement of
its own (:mod:`lightning_store.sql.engine`); the cursor holds it back and sends it with the transaction's first
statement, in the same call. Ending a transaction that never started (a ``BEGIN`` no statement followed, or the
pool's rollback of a connection whose transaction already ended) does not go to the thread at all. A one-statement
read is then two trips, where it was four: the statement, and its commit.

It relies on ``aiosqlite.Connection._execute`` (queue a function on the connection's thread), the one private
name it needs; where an aiosqlite release lacks it, :func:`connect` returns plain aiosqlite connections.

A connection opened with ``inline=True`` takes no trip at all: its statements, commits and rollbacks run on the
event loop's thread. A trip costs more than most of the store's statements (a claim and an end took 1.6 ms of
CPU with trips, 0.9 ms inline: each trip is a queue hand-off, a thread wake-up, a self-pipe write and an event
loop wake-up). Two things may make a statement slow, and neither may stall the loop:

- *a lock another process holds*: an inline connection has no busy timeout, and a statement that finds a lock
  taken (SQLITE_BUSY at once) runs again on the connection's thread, waiting as long as other connections would;
- *a long statement* (a dashboard's aggregate, a page of thousands of spans): a connection opened with a
  ``budget`` interrupts a statement once it has run that many SQLite virtual-machine steps (a progress handler;
  :data:`READ_BUDGET` is about 2 ms) and runs it again on the connection's thread, where it has no budget. Only
  a ``SELECT`` has a budget: SQLite rolls back the transaction of an ``INSERT``, ``UPDATE`` or ``DELETE`` it
  interrupts (a migration's, say), and an interrupted ``SELECT`` leaves its transaction as it was. The store's
  writer has no budget at all (its statements are short; a batch of a thousand spans takes a few milliseconds).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import aiosqlite

ONE_TRIP = callable(getattr(aiosqlite.Connection, "_execute", None))
"""Whether this aiosqlite release has what :class:`OneTripCursor` needs."""

BEGIN, BEGIN_IMMEDIATE = "BEGIN", "BEGIN IMMEDIATE"
"""The statements that open the store's read and write transactions (:mod:`lightning_store.sql.engine`)."""
BEGINS = frozenset({BEGIN, BEGIN_IMMEDIATE})
"""Held back until the transaction's first statement."""

BUSY_TIMEOUT_MS = 30_000
"""How long a statement waits for a lock another connection holds before it fails with "database is locked"."""
READ_BUDGET = 200_000
"""SQLite virtual-machine steps an inline read may take before it moves to its thread (about 2 ms here)."""
_MOVE_TO_THREAD = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_INTERRUPT})

_Outcome = tuple[Any, int, int | None, list[Any], bool]
_T = TypeVar("_T")


@dataclass
class Transaction:
    """What the event loop knows of one connection's transaction (the sqlite3 connection itself may only be
    asked on its thread)."""

    pending_begin: str | None = None
    """A ``BEGIN`` not yet sent: it goes with the next statement."""
    open: bool = False
    """Whether the database has a transaction open, as of the last trip; ``True`` when a trip failed (unknown:
    the next commit or rollback then asks the database)."""
    inline: bool = False
    """Statements run on the event loop's thread, not the connection's (see the module's docstring)."""
    budget: int | None = None
    """The steps an inline ``SELECT`` may take before it moves to the connection's thread (None: no limit)."""
    reading: bool = False
    """An inline ``SELECT`` with a budget is running: the progress handler interrupts it."""

    def interrupt(self) -> int:
        """SQLite's progress handler, called every ``budget`` steps of a statement: nonzero interrupts it."""
        return 1 if self.reading else 0


async def connect(
    database: str, *, inline: bool = False, budget: int | None = None, **kwargs: Any
) -> aiosqlite.Connection:
    """An open aiosqlite connection (arguments as for ``sqlite3.connect``) whose cursors are one-trip ones;
    ``inline``: whose statements take no trip, ``budget`` steps at most each (see the module's docstring; the
    caller sets ``PRAGMA busy_timeout=0`` on it, as its first statement)."""
    inline = inline and ONE_TRIP
    if inline:
        kwargs["check_same_thread"] = False  # opened on aiosqlite's thread, used on the event loop's
    connection = aiosqlite.connect(database, **kwargs)
    # As SQLAlchemy does for connections it opens itself: the thread must not keep the interpreter alive.
    thread: Any = getattr(connection, "_thread", connection)  # aiosqlite < 0.22: the connection is the thread
    thread.daemon = True
    try:
        await connection
    except BaseException:
        # aiosqlite stops its thread when the connect fails (a file it cannot open): let the thread finish first,
        # or it may answer to an event loop that has closed by then (a traceback on stderr after a one-line error).
        for _ in range(100):
            if not thread.is_alive():
                break
            await asyncio.sleep(0.01)
        raise
    if ONE_TRIP:
        # Instance attributes: the connection is otherwise aiosqlite's own (its thread, queue and close).
        transaction = Transaction(inline=inline, budget=budget if inline else None)
        if transaction.budget is not None:
            connection._conn.set_progress_handler(transaction.interrupt, transaction.budget)
        setattr(connection, "cursor", lambda: OneTripCursor(connection, transaction))  # noqa: B010
        setattr(connection, "commit", functools.partial(_end, connection, transaction, "commit"))  # noqa: B010
        setattr(connection, "rollback", functools.partial(_end, connection, transaction, "rollback"))  # noqa: B010
    return connection


async def _end(connection: aiosqlite.Connection, transaction: Transaction, how: Literal["commit", "rollback"]) -> None:
    """Commit or roll back; no trip when no transaction was started."""
    transaction.pending_begin = None
    if not transaction.open:
        return
    if transaction.inline:
        transaction.open = await _inline(connection, transaction, _finish, how)
        return
    still_open: bool = await connection._execute(_finish, connection._conn, how)  # type: ignore[no-untyped-call]
    transaction.open = still_open


class OneTripCursor:
    """The part of ``aiosqlite.Cursor`` that SQLAlchemy's adapter uses, one database-thread call per statement."""

    arraysize = 1

    def __init__(self, connection: aiosqlite.Connection, transaction: Transaction) -> None:
        self._connection = connection
        self._transaction = transaction
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows: list[Any] = []

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> OneTripCursor:
        transaction = self._transaction
        if sql in BEGINS and not transaction.open and transaction.pending_begin is None:
            transaction.pending_begin = sql
            self.description, self.rowcount, self.lastrowid, self._rows = None, -1, None, []
            return self
        self._take(await self._on_thread(_execute, sql, parameters))
        return self

    async def executemany(self, sql: str, parameters: Iterable[Sequence[Any]]) -> OneTripCursor:
        self._take(await self._on_thread(_executemany, sql, parameters))
        return self

    async def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    async def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        count = self.arraysize if size is None else size
        rows, self._rows = self._rows[:count], self._rows[count:]
        return rows

    async def close(self) -> None:
        self._rows = []

    async def _on_thread(self, function: Callable[..., _Outcome], *args: Any) -> _Outcome:
        connection, transaction = self._connection, self._transaction
        begin, transaction.pending_begin = transaction.pending_begin, None
        transaction.open = True  # until the trip says otherwise: a failed or cancelled one leaves it unknown
        if transaction.inline:
            outcome = await _inline(connection, transaction, function, begin, *args)
        else:
            outcome = await connection._execute(function, connection._conn, begin, *args)  # type: ignore[no-untyped-call]
        transaction.open = outcome[4]
        return outcome

    def _take(self, outcome: _Outcome) -> None:
        self.description, self.rowcount, self.lastrowid, self._rows, _ = outcome


async def _inline(
    connection: aiosqlite.Connection, transaction: Transaction, function: Callable[..., _T], *args: Any
) -> _T:
    """``function`` on the event loop's thread; when it finds a lock taken or a ``SELECT`` runs out of its budget,
    again on the connection's thread (see the module's docstring). SQLite undoes a statement that fails either
    way (and keeps the transaction of an interrupted ``SELECT`` open), so running it again is safe."""
    transaction.reading = transaction.budget is not None and function is _execute and _is_select(args[1])
    try:
        return function(connection._conn, *args)
    except sqlite3.OperationalError as error:
        if error.sqlite_errorcode not in _MOVE_TO_THREAD:
            raise
    finally:
        transaction.reading = False
    call = functools.partial(_on_own_thread, function, connection._conn, *args)
    return await connection._execute(call)  # type: ignore[no-any-return, no-untyped-call]


def _is_select(sql: str) -> bool:
    return sql[:6].upper() == "SELECT"


def _on_own_thread(function: Callable[..., _T], connection: sqlite3.Connection, *args: Any) -> _T:
    """``function`` as a connection that is not inline runs it: with the busy timeout, without a budget."""
    connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    try:
        return function(connection, *args)
    finally:
        connection.execute("PRAGMA busy_timeout=0")


def _execute(connection: sqlite3.Connection, begin: str | None, sql: str, parameters: Sequence[Any] | None) -> _Outcome:
    cursor = connection.cursor()
    try:
        if begin is not None and not connection.in_transaction:  # in one: a retry whose BEGIN went through
            cursor.execute(begin)
        cursor.execute(sql, () if parameters is None else parameters)
        return _outcome(connection, cursor)
    finally:
        cursor.close()


def _executemany(
    connection: sqlite3.Connection, begin: str | None, sql: str, parameters: Iterable[Sequence[Any]]
) -> _Outcome:
    cursor = connection.cursor()
    try:
        if begin is not None and not connection.in_transaction:
            cursor.execute(begin)
        cursor.executemany(sql, parameters)
        return _outcome(connection, cursor)
    finally:
        cursor.close()


def _outcome(connection: sqlite3.Connection, cursor: sqlite3.Cursor) -> _Outcome:
    rows = cursor.fetchall() if cursor.description else []
    return cursor.description, cursor.rowcount, cursor.lastrowid, rows, connection.in_transaction


def _finish(connection: sqlite3.Connection, how: Literal["commit", "rollback"]) -> bool:
    """Commit or roll back on the database thread; whether a transaction is still open after it."""
    if how == "commit":
        connection.commit()
    else:
        connection.rollback()
    return connection.in_transaction
