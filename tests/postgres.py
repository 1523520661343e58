"""Test databases on a real PostgreSQL server, each cloned from one migrated template.

The server is the one at ``LIGHTNING_STORE_TEST_POSTGRES_URL`` (default: the local trust-auth server); tests
that need it are skipped when none answers. Cloning (``CREATE DATABASE … TEMPLATE``) costs a few tens of
milliseconds, far less than migrating each database.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid

from sqlalchemy.engine import URL, make_url

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_url() -> URL:
    return make_url(os.environ.get("LIGHTNING_STORE_TEST_POSTGRES_URL", DEFAULT_URL))


def database_url(name: str) -> str:
    return admin_url().set(drivername="postgresql+asyncpg", database=name).render_as_string(hide_password=False)


async def _admin(sql: str) -> None:
    import asyncpg

    url = admin_url().set(drivername="postgresql")
    conn = await asyncpg.connect(url.render_as_string(hide_password=False), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def server_answers() -> bool:
    try:
        asyncio.run(_admin("SELECT 1"))
    except Exception:
        return False
    return True


class TemplateDatabases:
    """Creates the migrated template once per test session and clones it per test."""

    def __init__(self) -> None:
        self.prefix = f"ls_test_{uuid.uuid4().hex[:8]}"
        self.template = f"{self.prefix}_template"
        self._counter = itertools.count()
        self._created: list[str] = []

    async def create_template(self) -> None:
        from lightning_store.migrate import upgrade
        from lightning_store.sql.engine import make_engine

        await _admin(f'CREATE DATABASE "{self.template}"')
        engine = make_engine(database_url(self.template))
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()

    async def clone(self, *, migrated: bool = True) -> str:
        name = f"{self.prefix}_{next(self._counter)}"
        await _admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{self.template}"' if migrated else ""))
        self._created.append(name)
        return database_url(name)

    async def drop(self, url: str) -> None:
        name = make_url(url).database
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def drop_all(self) -> None:
        for name in [*self._created, self.template]:
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
