"""``store sql``: one read-only statement against the store, on its database or through a ``store serve``.

On a database (``--database-url``, or ``--store`` given a database URL) it runs in this process
(:func:`lightning_store.read_only_sql.run_read_only`); through a server (``--store http://…``) the server runs it
the same way (``POST /v1/sql``, with the server's token), so the rows are those of the database the server
serves, whatever directory the command runs in.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import sqlalchemy as sa
import typer
from rich.table import Table

from lightning_store.cli.common import (
    DatabaseUrl,
    ReadStore,
    Token,
    database_errors,
    database_failure,
    errors,
    fail,
    missing_database_line,
    out,
    with_store,
)
from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.settings import load_settings

Rows = tuple[list[str], list[tuple[Any, ...]], bool]
"""Column names, rows, and whether there were more rows than asked for."""


def sql(
    query: Annotated[str, typer.Argument(help="A read-only SQL statement, e.g. SELECT * FROM rollouts_v")],
    database_url: DatabaseUrl = None,
    target: ReadStore = None,
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per row.")] = False,
    timeout: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds the statement may run before it is stopped (300 at most through a server)."
        ),
    ] = 30.0,
    max_rows: Annotated[
        int, typer.Option(min=1, help="Rows shown at most; a note on stderr says when more matched.")
    ] = 10_000,
) -> None:
    """Run a read-only SQL query against the store and print the rows."""
    from lightning_store.connect import is_server_url, store_target

    if target is not None and is_server_url(target):
        columns, rows, more = _through_server(store_target(target), token, query, timeout, max_rows)
    else:
        columns, rows, more = _on_database(target or database_url, query, timeout, max_rows)
    if not columns:
        out.print("the statement returned no rows")
        return
    if as_json:
        for row in rows:
            typer.echo(json.dumps(dict(zip(columns, row, strict=True)), default=str))
    else:
        table = Table(*columns)
        for row in rows:
            table.add_row(*(json.dumps(v) if isinstance(v, dict | list) else str(v) for v in row))
        out.print(table)
    if more:
        errors.print(f"more rows matched: these are the first {max_rows} (--max-rows N shows more)", markup=False)


def _through_server(url: str, token: str | None, query: str, timeout: float, max_rows: int) -> Rows:
    from lightning_store.client import HttpStore

    async def run(store: LightningStore) -> dict[str, Any]:
        if not isinstance(store, HttpStore):  # pragma: no cover - a server URL always opens one
            raise TypeError(type(store))
        try:
            return await store.run_sql(query, timeout=timeout, max_rows=max_rows)
        except InvalidRequestError as exc:
            fail("query failed", exc.message if exc.field == "query" else f"{exc.message} (field: {exc.field})")

    answer = with_store(url, token, "query failed", run, timeout=timeout + 5)
    for warning in answer["warnings"]:
        errors.print(warning, markup=False)
    return answer["columns"], [tuple(row) for row in answer["rows"]], bool(answer["truncated"])


def _on_database(database_url: str | None, query: str, timeout: float, max_rows: int) -> Rows:
    from lightning_store.read_only_sql import run_read_only

    url = load_settings(database_url=database_url).database_url
    if (line := missing_database_line(url)) is not None:
        fail("query failed", line)

    async def run() -> tuple[list[str], list[tuple[Any, ...]]]:
        def warn(line: str) -> None:
            errors.print(line, markup=False)

        return await run_read_only(url, query, timeout=timeout, warn=warn, max_rows=max_rows)

    try:
        with database_errors("query failed", url):
            columns, rows = asyncio.run(run())
    except sa.exc.DBAPIError as exc:
        if str(exc.orig) == "interrupted" or "statement timeout" in str(exc.orig):
            fail("query failed", f"stopped after --timeout {timeout:g} s ({exc.orig})", 1)
        fail("query failed", f"{exc.orig}{_not_migrated_hint(url)}", 1)
    except sa.exc.SQLAlchemyError as exc:
        fail("query failed", f"{exc}{_not_migrated_hint(url)}", 1)
    return columns, rows[:max_rows], len(rows) > max_rows


def _not_migrated_hint(database_url: str) -> str:
    """`` (database is not migrated …: run `store migrate …`)`` when a failed query may be explained by that."""
    from lightning_store.migrate import DatabaseNotMigratedError, check_current
    from lightning_store.sql.engine import make_engine

    async def check() -> None:
        engine = make_engine(database_url, pool_size=1)
        try:
            await check_current(engine)
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except DatabaseNotMigratedError as exc:
        return f" ({database_failure(exc, database_url)})"
    except Exception:  # only a hint: the query's own error is what gets reported
        return ""
    return ""
