"""Alembic environment. Runs on the connection that lightning_store.migrate hands in (async engines run it
through ``run_sync``); with no connection (plain ``alembic`` command) it opens one from the settings URL."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from lightning_store.sql.schema import metadata

config = context.config


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_with_own_engine() -> None:
    from lightning_store.settings import load_settings
    from lightning_store.sql.engine import make_engine

    async def main() -> None:
        engine = make_engine(load_settings().database_url)
        async with engine.begin() as conn:
            await conn.run_sync(run_on)
        await engine.dispose()

    asyncio.run(main())


connection = config.attributes.get("connection")
if connection is None:
    run_with_own_engine()
else:
    run_on(connection)
