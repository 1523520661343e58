"""Schema migrations through Alembic, driven from the async engine. The revisions live in ``migrations/``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncEngine

if TYPE_CHECKING:
    from lightning_store.settings import StoreSettings

SettingsT = TypeVar("SettingsT", bound="StoreSettings")


def migrations_dir() -> Path:
    """Where the ``migrations`` package (shipped in the same distribution) lies."""
    spec = importlib.util.find_spec("migrations")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'migrations' package is not installed alongside lightning_store")
    return Path(next(iter(spec.submodule_search_locations)))


def alembic_config(connection: Any = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (a no-op when it is already there)."""
    async with engine.begin() as conn:
        await conn.run_sync(lambda sync_conn: command.upgrade(alembic_config(sync_conn), revision))


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(lambda sync_conn: command.downgrade(alembic_config(sync_conn), revision))


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync_conn: MigrationContext.configure(sync_conn).get_current_revision())


class DatabaseNotMigratedError(Exception):
    """The database's schema is not the one this code needs: older than the newest revision (``store migrate``
    upgrades it) or a revision this code does not know (a newer lightning-store migrated it)."""

    def __init__(self, current: str | None, head: str, *, known: bool) -> None:
        self.current = current
        self.head = head
        self.known = known
        """Whether ``current`` is one of this code's revisions (or none): then ``store migrate`` fixes it."""
        if known:
            message = f"database is not migrated (at revision {current or 'none'}, head is {head})"
        else:
            message = f"database is at revision {current}, which this lightning-store does not know (head is {head})"
        super().__init__(message)


async def check_current(engine: AsyncEngine) -> None:
    """Raise :class:`DatabaseNotMigratedError` unless the database is at the newest revision."""
    current = await current_revision(engine)
    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None
    if current != head:
        known = current is None or any(rev.revision == current for rev in script.walk_revisions())
        raise DatabaseNotMigratedError(current, head, known=known)


async def prepare_database(settings: SettingsT) -> SettingsT:
    """Before a command uses the database (``store serve``, ``store stats``): upgrade the schema when migration
    is on (``migrate_on_start``; by default on SQLite), else check that it is at the newest revision. Raises
    :class:`~lightning_store.errors.DatabaseUnavailableError` when the database cannot be reached and
    :class:`DatabaseNotMigratedError` when its schema is not current: a clear refusal up front instead of an
    error on every request. Returns the settings to open the store with (migration done, not to be tried again).
    An in-memory SQLite database belongs to one engine: it is left to the store that opens it."""
    from lightning_store.sql.engine import is_memory_sqlite, is_sqlite, make_engine, normalize_url, unavailable_as_error

    url = normalize_url(settings.database_url)
    if is_memory_sqlite(url):
        return settings
    migrate = is_sqlite(url) if settings.migrate_on_start is None else settings.migrate_on_start
    engine = make_engine(url, pool_size=1)
    try:
        with unavailable_as_error():
            if migrate:
                await upgrade(engine)
            else:
                await check_current(engine)
    finally:
        await engine.dispose()
    return settings.model_copy(update={"migrate_on_start": False})
