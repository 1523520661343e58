"""The SQL store: every method of the contract over one database, plus its background tasks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from lightning_store.contract import StoreStatistics
from lightning_store.errors import DatabaseUnavailableError
from lightning_store.migrate import upgrade
from lightning_store.settings import StoreSettings, load_settings
from lightning_store.sql.ends import EndOps
from lightning_store.sql.engine import is_memory_sqlite, is_sqlite, make_engine, normalize_url
from lightning_store.sql.llm_calls import LlmCallOps
from lightning_store.sql.notify import PostgresListener
from lightning_store.sql.resources import ResourceOps
from lightning_store.sql.rollouts import RolloutOps
from lightning_store.sql.schema import attempts, resources, rollouts, spans, workers
from lightning_store.sql.span_search import SpanSearchOps
from lightning_store.sql.sqlite_driver import READ_BUDGET
from lightning_store.sql.watchdog import WatchdogOps


class SqlStore(RolloutOps, EndOps, LlmCallOps, SpanSearchOps, ResourceOps, WatchdogOps):
    """The store contract on Postgres or SQLite. Create it with :func:`open_store`; ``close`` it when done.

    Safe for concurrent use by many tasks of one event loop, and by many processes over the same database.
    """

    _listener: PostgresListener | None = None

    async def statistics(self) -> StoreStatistics:
        async with self._read() as conn:
            totals = {}
            for name, table in (
                ("rollouts", rollouts),
                ("attempts", attempts),
                ("spans", spans),
                ("resources", resources),
                ("workers", workers),
            ):
                totals[name] = int((await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one())
            by_status: dict[str, int] = dict(
                (await conn.execute(sa.select(rollouts.c.status, sa.func.count()).group_by(rollouts.c.status))).all()
            )
        return StoreStatistics(
            name=type(self).__name__,
            total_rollouts=totals["rollouts"],
            total_attempts=totals["attempts"],
            total_spans=totals["spans"],
            total_resources=totals["resources"],
            total_workers=totals["workers"],
            uptime=time.time() - self._started_at,
            rollouts_by_status={str(k): int(v) for k, v in by_status.items()},
        )

    async def check_database(self, timeout: float = 2.0) -> None:
        """``SELECT 1``: returns when the database answers within ``timeout`` seconds, else raises
        :class:`DatabaseUnavailableError` (what ``/v1/agl/health`` asks)."""
        try:
            async with asyncio.timeout(timeout), self._read() as conn:
                await conn.execute(sa.select(1))
        except TimeoutError:
            raise DatabaseUnavailableError(f"no answer within {timeout:g} s") from None

    async def start(self, *, watchdog: bool = True) -> None:
        """Start the background tasks: the Postgres listener and (unless disabled) the watchdog."""
        if not self.is_sqlite and self._listener is None:
            self._listener = PostgresListener(self.url, self.topics)
            self._listener.start()
        if watchdog:
            self.start_watchdog(self.settings.watchdog_interval)

    async def close(self) -> None:
        await self.stop_watchdog()
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await self.engine.dispose()
        if self.writer is not self.engine:
            await self.writer.dispose()


async def open_store(
    database_url: str | URL | None = None,
    *,
    migrate: bool | None = None,
    watchdog: bool = True,
    settings: StoreSettings | None = None,
    **overrides: Any,
) -> SqlStore:
    """Open (and by default start) a store. Arguments win over ``LIGHTNING_STORE_*`` variables.

    ``migrate`` upgrades the schema to the newest revision first; by default it does so on SQLite and not on
    Postgres (where schema changes should be a deliberate ``store migrate``).
    """
    settings = settings or load_settings(database_url=database_url, migrate_on_start=migrate, **overrides)
    url = normalize_url(settings.database_url)
    # On a SQLite file every statement runs on the event loop's thread (sqlite_driver: a trip to a connection's
    # thread per statement cost more than most statements); a read that runs long moves to its thread.
    file_sqlite = is_sqlite(url) and not is_memory_sqlite(url)
    engine = make_engine(
        url,
        pool_size=settings.pool_size,
        inline=file_sqlite,
        budget=READ_BUDGET,
        deadline=settings.statement_timeout or None,
    )
    # SQLite has one writer at a time (the store's lock serializes them): one connection of their own serves them,
    # without a budget (an interrupted statement would roll its transaction back).
    writer = make_engine(url, pool_size=1, inline=True) if file_sqlite else None
    store = SqlStore(engine, url, settings, writer)
    should_migrate = settings.migrate_on_start
    if should_migrate is None:
        should_migrate = store.is_sqlite
    try:
        if should_migrate and store.is_sqlite:
            await upgrade(engine)  # an in-memory database belongs to its engine
        elif should_migrate:  # on an engine of its own: a migration may run longer than a request's deadline
            unbounded = make_engine(url, pool_size=1)
            try:
                await upgrade(unbounded)
            finally:
                await unbounded.dispose()
        await store.start(watchdog=watchdog)
    except BaseException:
        await store.close()
        raise
    return store
