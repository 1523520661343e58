"""Starting the server: one process in place, or several uvicorn workers over one Postgres database."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from typing import Any

import uvicorn

from lightning_store.errors import InvalidRequestError
from lightning_store.settings import ServerSettings, load_server_settings
from lightning_store.sql.engine import is_sqlite, normalize_url


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(settings: ServerSettings) -> None:
    """Refuse configurations that would expose the store or corrupt it, with a message that says what to do."""
    if not is_loopback(settings.host) and not settings.token and not settings.insecure:
        raise InvalidRequestError(
            f"binding to {settings.host} exposes the store: give --token (or LIGHTNING_STORE_TOKEN), "
            "or --insecure if the network is trusted",
            field="host",
        )
    if settings.workers > 1 and is_sqlite(normalize_url(settings.database_url)):
        raise InvalidRequestError("--workers > 1 needs Postgres: SQLite has a single writer", field="workers")


def serve(settings: ServerSettings, *, log_level: str = "info") -> None:
    check(settings)
    if settings.workers == 1:
        from lightning_store.server.app import create_app

        app = create_app(settings, freeze_heap=True)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level)
        return
    if settings.migrate_on_start:
        _migrate_once(settings)
    # Workers are separate processes: they read their settings from the environment we pass down.
    for name, value in settings.model_dump(exclude={"workers"}).items():
        if value is not None:
            os.environ[f"LIGHTNING_STORE_{name.upper()}"] = str(value)
    os.environ["LIGHTNING_STORE_MIGRATE_ON_START"] = "false"
    uvicorn.run(
        "lightning_store.server.run:app_from_environment",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=log_level,
    )


def app_from_environment() -> Any:
    from lightning_store.server.app import create_app

    return create_app(load_server_settings(), freeze_heap=True)


def _migrate_once(settings: ServerSettings) -> None:
    from lightning_store.migrate import upgrade
    from lightning_store.sql.engine import make_engine

    async def run() -> None:
        engine = make_engine(settings.database_url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())
