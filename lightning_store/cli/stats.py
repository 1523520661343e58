"""``store stats``: counts of what the store holds, read from a database or through a ``store serve``."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.table import Table

from lightning_store.cli.common import (
    DatabaseUrl,
    ReadStore,
    Token,
    database_errors,
    fail,
    missing_database_line,
    out,
    with_store,
)
from lightning_store.contract import LightningStore
from lightning_store.settings import load_settings


def stats(
    database_url: DatabaseUrl = None,
    target: ReadStore = None,
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of a table.")] = False,
) -> None:
    """Print counts of rollouts (by status), attempts, spans, resources and workers."""
    from lightning_store.connect import is_server_url, store_target

    if target is not None and is_server_url(target):

        async def read(store: LightningStore) -> dict[str, Any]:
            return dict(await store.statistics())

        result = with_store(store_target(target), token, "cannot read the store", read)
    else:
        result = _from_database(target or database_url)
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table("statistic", "value")
    for key, value in result.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    out.print(table)


def _from_database(database_url: str | None) -> dict[str, Any]:
    from lightning_store.migrate import prepare_database
    from lightning_store.sql import open_store

    settings = load_settings(database_url=database_url)
    if (line := missing_database_line(settings.database_url)) is not None:  # a typo must not create a database
        fail("cannot read the store", line)

    async def run() -> dict[str, Any]:
        # Migrated (SQLite, by default) or checked first: a database that is not current gets a one-line answer.
        store = await open_store(settings=await prepare_database(settings), watchdog=False)
        try:
            return dict(await store.statistics())
        finally:
            await store.close()

    with database_errors("cannot read the store", settings.database_url):
        return asyncio.run(run())
