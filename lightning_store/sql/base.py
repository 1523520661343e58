"""Connection handling shared by the SQL store's method families.

Reads run in plain transactions. Writes run in one transaction each; on SQLite they are also serialized within
the process (SQLite has one writer; queueing here is cheaper than busy-waiting in the driver), begin with
``BEGIN IMMEDIATE``, and go through a connection of their own (``writer``), so that a writer holding the lock
never waits for a pooled connection behind a burst of readers (64 LLM calls reading their rollouts' resources at
once held one for 200 ms). Postgres writes that wake waiters ``pg_notify`` inside the transaction, so waiters in
other processes see the change only once it is committed.

An error that says the database cannot be reached (refused, cut, timed out: :func:`engine.unavailable_reason`)
leaves both as :class:`~lightning_store.errors.DatabaseUnavailableError`, whatever driver raised it. A write marks
its request once its commit is under way (:mod:`~lightning_store.sql.commit_mark`): an outage after that point may
have left it done, and the server's 503 says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from lightning_store import waits
from lightning_store.settings import StoreSettings
from lightning_store.sql import commit_mark
from lightning_store.sql.engine import STATEMENT_OPTION, WRITE_OPTION, is_sqlite, unavailable_as_error
from lightning_store.sql.notify import TOPICS, Topic, notify_clause


@dataclass
class Wakeups:
    """Topics a write transaction wants signalled once it has committed."""

    topics: set[str] = field(default_factory=set)
    notified: set[str] = field(default_factory=set)
    """Postgres: topics a statement of the transaction has already ``pg_notify``'d (one that wrote and notified
    in one trip: :mod:`~lightning_store.sql.postgres_end`)."""

    def add(self, topic: str) -> None:
        self.topics.add(topic)


class SqlBase:
    """State and transaction helpers; see :class:`lightning_store.sql.store.SqlStore` for the public API."""

    def __init__(
        self, engine: AsyncEngine, url: URL, settings: StoreSettings, writer: AsyncEngine | None = None
    ) -> None:
        self.engine = engine
        self.writer = writer or engine
        """The engine of write transactions (``engine`` itself unless one was given)."""
        self.url = url
        self.settings = settings
        self.dialect = engine.dialect.name
        self.is_sqlite = is_sqlite(url)
        # Reads on Postgres run outside a transaction: at READ COMMITTED (Postgres's default, and the store's)
        # each statement takes its own snapshot whether or not a transaction surrounds it, so BEGIN and COMMIT
        # bought nothing but two round trips per read (a proxied LLM call reads its attempt's resources). On
        # SQLite a read transaction holds one snapshot for all its statements, and costs no trip of its own.
        self._reader = engine if self.is_sqlite else engine.execution_options(isolation_level="AUTOCOMMIT")
        # Reads whose statements need no common snapshot run without a transaction on SQLite too: a read of one
        # statement is then one statement, without a BEGIN and a COMMIT (the proxy reads resources per call).
        self._statement_reader = engine.execution_options(**{STATEMENT_OPTION: True}) if self.is_sqlite else None
        self.topics = {name: Topic() for name in TOPICS}
        self._write_lock = asyncio.Lock()
        self._started_at = time.time()

    @property
    def poll_interval(self) -> float:
        """How long a waiter sleeps before re-checking when no wake-up came."""
        if self.is_sqlite:
            return self.settings.sqlite_poll_interval
        return self.settings.postgres_poll_interval

    @contextlib.asynccontextmanager
    async def _read(self, *, snapshot: bool = True) -> AsyncIterator[AsyncConnection]:
        """A connection for reads: a read transaction on SQLite (one snapshot); on Postgres, autocommit, each
        statement with its own snapshot as in a READ COMMITTED transaction, without the BEGIN/COMMIT trips.
        ``snapshot=False``: the statements need no common snapshot, and run in autocommit on SQLite too."""
        with unavailable_as_error():
            if self._statement_reader is not None and not snapshot:
                async with self._statement_reader.connect() as conn:
                    yield conn
                return
            async with self._reader.connect() as conn:
                if not self.is_sqlite:
                    yield conn
                    return
                async with conn.begin():
                    yield conn

    @contextlib.asynccontextmanager
    async def _autocommit(self) -> AsyncIterator[AsyncConnection]:
        """Postgres only: a connection whose every statement commits on its own, for a write that is one
        statement (the claim: :mod:`~lightning_store.sql.postgres_claim`). ``BEGIN`` and ``COMMIT`` cost two trips
        to the database and about 0.14 ms of the server's CPU, more than the statement's own 0.09."""
        assert not self.is_sqlite, "SQLite's writes go through _write (one writer, BEGIN IMMEDIATE)"
        with unavailable_as_error():
            async with self._reader.connect() as conn:
                commit_mark.committing()  # each statement commits as it runs
                yield conn

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[tuple[AsyncConnection, Wakeups]]:
        """A write transaction; topics added to the yielded ``Wakeups`` are signalled after commit."""
        wakeups = Wakeups()
        lock = self._write_lock if self.is_sqlite else contextlib.nullcontext()
        with unavailable_as_error():
            async with lock, self.writer.connect() as conn:
                await conn.execution_options(**{WRITE_OPTION: True})
                async with conn.begin():
                    yield conn, wakeups
                    if not self.is_sqlite:
                        for topic in sorted(wakeups.topics - wakeups.notified):
                            await conn.execute(notify_clause(topic))
                    commit_mark.committing()  # from here an outage may leave it committed, unbeknown to us
        for topic in wakeups.topics:
            self.topics[topic].signal()

    async def _wait_for_change(self, topic: str, deadline: float | None) -> bool:
        """Sleep until ``topic`` is signalled, the poll interval passes, or ``deadline``; ``False`` once past
        the deadline, or once the wait was ended early (:mod:`lightning_store.waits`)."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if (remaining is not None and remaining <= 0) or waits.ended():
            return False
        # The re-check falls on the next multiple of the interval on the monotonic clock, the same instant for
        # every waiter of this process: the re-checks of many idle waiters then coincide, and the claimers' share
        # one read (ClaimOps._queue_has_work). Each on its own timer, 1,000 idle runners' long-polls made 1,000
        # reads a second on Postgres (twenty times that on SQLite): a fifth of an idle server's CPU.
        step = self.poll_interval - time.monotonic() % self.poll_interval
        if remaining is not None:
            step = min(step, remaining)
        await self.topics[topic].wait(step)
        return not waits.ended()
