"""aiosqlite connections whose statements take one trip to the database thread instead of four.

aiosqlite runs each sqlite3 call in the connection's own thread and wakes the event loop with its result.
SQLAlchemy's adapter makes four such calls per statement (open a cursor, execute, fetch the rows, close the
cursor), and each wake-up waits its turn behind whatever else the loop has ready. On a busy ``store serve``
that made a five-statement write transaction hold SQLite's single write lock for 15-60 ms, nearly all of it
waiting for the loop rather than for SQLite, and every other write queued behind it.

:class:`OneTripCursor` executes, fetches every row and closes the sqlite3 cursor in one call on the database
thread, then serves ``fetchall`` from memory. Fetching eagerly is what SQLAlchemy's adapter does anyway for
the ordinary (buffered) cursors the store uses.

It relies on ``aiosqlite.Connection._execute`` (queue a function on the connection's thread), the one private
name it needs; where an aiosqlite release lacks it, :func:`connect` returns plain aiosqlite connections.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiosqlite

ONE_TRIP = callable(getattr(aiosqlite.Connection, "_execute", None))
"""Whether this aiosqlite release has what :class:`OneTripCursor` needs."""

_Outcome = tuple[Any, int, int | None, list[Any]]


async def connect(database: str, **kwargs: Any) -> aiosqlite.Connection:
    """An open aiosqlite connection (arguments as for ``sqlite3.connect``) whose cursors are one-trip ones."""
    connection = aiosqlite.connect(database, **kwargs)
    # As SQLAlchemy does for connections it opens itself: the thread must not keep the interpreter alive.
    thread: Any = getattr(connection, "_thread", connection)  # aiosqlite < 0.22: the connection is the thread
    thread.daemon = True
    await connection
    if ONE_TRIP:
        # An instance attribute: the connection is otherwise aiosqlite's own (its thread, queue and close).
        setattr(connection, "cursor", lambda: OneTripCursor(connection))  # noqa: B010 (not the declared type)
    return connection


class OneTripCursor:
    """The part of ``aiosqlite.Cursor`` that SQLAlchemy's adapter uses, one database-thread call per statement."""

    arraysize = 1

    def __init__(self, connection: aiosqlite.Connection) -> None:
        self._connection = connection
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows: list[Any] = []

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> OneTripCursor:
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
        connection = self._connection
        outcome: _Outcome = await connection._execute(function, connection._conn, *args)  # type: ignore[no-untyped-call]
        return outcome

    def _take(self, outcome: _Outcome) -> None:
        self.description, self.rowcount, self.lastrowid, self._rows = outcome


def _execute(connection: sqlite3.Connection, sql: str, parameters: Sequence[Any] | None) -> _Outcome:
    cursor = connection.cursor()
    try:
        cursor.execute(sql, () if parameters is None else parameters)
        return _outcome(cursor)
    finally:
        cursor.close()


def _executemany(connection: sqlite3.Connection, sql: str, parameters: Iterable[Sequence[Any]]) -> _Outcome:
    cursor = connection.cursor()
    try:
        cursor.executemany(sql, parameters)
        return _outcome(cursor)
    finally:
        cursor.close()


def _outcome(cursor: sqlite3.Cursor) -> _Outcome:
    rows = cursor.fetchall() if cursor.description else []
    return cursor.description, cursor.rowcount, cursor.lastrowid, rows
