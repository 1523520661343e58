"""The ``store`` command's root: the Typer app with this package's commands. Subcommands from other packages arrive
through the ``lightning_store.commands`` entry-point group: each entry point names a ``typer.Typer`` (added as a
group) or a function (a command)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, Any

import sqlalchemy as sa
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lightning_store.cli.common import database_failure, errors, fail
from lightning_store.cli.enqueue import enqueue
from lightning_store.cli.export import export
from lightning_store.cli.prune import prune
from lightning_store.cli.resources import resources
from lightning_store.cli.rollouts import rollouts
from lightning_store.settings import load_settings
from lightning_store.sql.engine import missing_sqlite_file

app = typer.Typer(help="lightning-store: a durable rollout and span store for agent RL.", no_args_is_help=True)
console = Console()
logger = logging.getLogger(__name__)
# The workflow commands, through the store contract (server or database): see lightning_store/cli/common.py.
app.command()(enqueue)
app.command()(prune)
app.command()(export)
app.add_typer(resources, name="resources")
app.add_typer(rollouts, name="rollouts")

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", help="SQLAlchemy URL; default $LIGHTNING_STORE_DATABASE_URL or ./lightning_store.db"
    ),
]


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to bind \\[default: 127.0.0.1].", show_default=False)
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port \\[default: 4747].", show_default=False)] = None,
    database_url: DatabaseUrl = None,
    workers: Annotated[
        int | None, typer.Option(help="Server processes (Postgres only) \\[default: 1].", show_default=False)
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="Bearer token required on every route but health; env LIGHTNING_STORE_TOKEN.")
    ] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback host without a token.")] = False,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="Largest request body \\[default: 32 MiB].", show_default=False)
    ] = None,
    max_header_bytes: Annotated[
        int | None,
        typer.Option(help="Largest request line and headers, 431 beyond \\[default: 64 KiB].", show_default=False),
    ] = None,
    migrate_on_start: Annotated[
        bool | None,
        typer.Option(
            "--migrate/--no-migrate", help="Upgrade the schema first \\[default: on for SQLite].", show_default=False
        ),
    ] = None,
    llm_upstream: Annotated[
        str | None, typer.Option(help="OpenAI-compatible base URL for the LLM proxy when no llm resource names one.")
    ] = None,
    llm_model: Annotated[
        str | None,
        typer.Option(help="Model named to --llm-upstream when a call names none; env LIGHTNING_STORE_LLM_MODEL."),
    ] = None,
    llm_api_key: Annotated[
        str | None, typer.Option(help="Bearer key sent to --llm-upstream; env LIGHTNING_STORE_LLM_API_KEY.")
    ] = None,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            help="An origin whose browser pages may call the API (CORS); repeat for more, * for any; env "
            "LIGHTNING_STORE_CORS_ORIGINS (comma-separated)."
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="debug (adds a line per request), info, warning or error: uvicorn's and the store's.")
    ] = "info",
) -> None:
    """Serve the store over HTTP: the Agent Lightning 0.3 REST API under /v1/agl, OTLP at /v1/traces, /metrics."""
    from lightning_store.errors import StoreError

    if log_level.lower() not in ("trace", "debug", "info", "warning", "error", "critical"):
        raise typer.BadParameter(f"{log_level!r} is not debug, info, warning or error", param_hint="--log-level")
    from lightning_store.server.run import serve as run_server
    from lightning_store.settings import load_server_settings

    settings = load_server_settings(
        host=host,
        port=port,
        database_url=database_url,
        workers=workers,
        token=token,
        insecure=insecure or None,
        max_body_bytes=max_body_bytes,
        max_header_bytes=max_header_bytes,
        migrate_on_start=migrate_on_start,
        llm_upstream=llm_upstream,
        llm_model=llm_model,
        llm_api_key=llm_api_key,
        cors_origins=cors_origin or None,
    )
    try:
        with _database_errors("cannot serve", settings.database_url, code=2, serving=True):
            run_server(settings, log_level=log_level)
    except StoreError as exc:
        fail("cannot serve", str(exc), 2)


@app.command()
def migrate(
    database_url: DatabaseUrl = None,
    revision: Annotated[str, typer.Option(help="Alembic revision to upgrade to: head (the newest) or an id.")] = "head",
) -> None:
    """Upgrade the database schema to REVISION (default: the newest)."""
    from lightning_store.migrate import current_revision, upgrade
    from lightning_store.sql.engine import make_engine

    url = load_settings(database_url=database_url).database_url

    async def run() -> str | None:
        engine = make_engine(url)
        try:
            await upgrade(engine, revision)
            return await current_revision(engine)
        finally:
            await engine.dispose()

    with _database_errors("cannot migrate", url):
        now = asyncio.run(run())
    console.print(f"schema at revision [bold]{now}[/bold]")


@app.command()
def stats(
    database_url: DatabaseUrl = None,
    as_json: bool = typer.Option(False, "--json", help="One JSON object instead of a table."),
) -> None:
    """Print counts of rollouts (by status), attempts, spans, resources and workers."""
    from lightning_store.migrate import prepare_database
    from lightning_store.sql import open_store

    settings = load_settings(database_url=database_url)
    if (missing := missing_sqlite_file(settings.database_url)) is not None:  # a typo must not create a database
        fail("cannot read the store", f"no such file: {missing} (`store serve` or `store migrate` creates it)")

    async def run() -> dict[str, Any]:
        # Migrated (SQLite, by default) or checked first: a database that is not current gets a one-line answer.
        store = await open_store(settings=await prepare_database(settings), watchdog=False)
        try:
            return dict(await store.statistics())
        finally:
            await store.close()

    with _database_errors("cannot read the store", settings.database_url):
        result = asyncio.run(run())
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table("statistic", "value")
    for key, value in result.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    console.print(table)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only SQL statement, e.g. SELECT * FROM rollouts_v")],
    database_url: DatabaseUrl = None,
    as_json: bool = typer.Option(False, "--json", help="One JSON object per row."),
    timeout: float = typer.Option(30.0, min=0.001, help="Seconds the statement may run before it is stopped."),
) -> None:
    """Run a read-only SQL query against the store and print the rows."""
    from lightning_store.read_only_sql import run_read_only

    url = load_settings(database_url=database_url).database_url

    async def run() -> tuple[list[str], list[tuple[Any, ...]]]:
        return await run_read_only(url, query, timeout=timeout, warn=lambda line: errors.print(line, markup=False))

    try:
        with _database_errors("query failed", url):
            columns, rows = asyncio.run(run())
    except sa.exc.DBAPIError as exc:
        if str(exc.orig) == "interrupted" or "statement timeout" in str(exc.orig):
            fail("query failed", f"stopped after --timeout {timeout:g} s ({exc.orig})", 1)
        fail("query failed", f"{exc.orig}{_not_migrated_hint(url)}", 1)
    except sa.exc.SQLAlchemyError as exc:
        fail("query failed", f"{exc}{_not_migrated_hint(url)}", 1)
    if not columns:
        console.print("the statement returned no rows")
        return
    if as_json:
        for row in rows:
            typer.echo(json.dumps(dict(zip(columns, row, strict=True)), default=str))
        return
    table = Table(*columns)
    for row in rows:
        table.add_row(*(json.dumps(v) if isinstance(v, dict | list) else str(v) for v in row))
    console.print(table)


@contextlib.contextmanager
def _database_errors(what: str, database_url: str, *, code: int = 1, serving: bool = False) -> Iterator[None]:
    """Turn a database that cannot be reached or is not migrated into one line (``what: …``) and exit ``code``;
    other errors pass."""
    try:
        yield
    except Exception as exc:
        line = database_failure(exc, database_url, serving=serving)
        if line is None:
            raise
        fail(what, line, code)


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


MISSING_EXTRA = "missing_extra"
"""The attribute by which a command says it cannot run in this installation. An entry point's target (a
``typer.Typer`` or a function) may carry ``missing_extra``: the name of an extra of its distribution whose packages
cannot be imported here, or None when they can. A target whose ``missing_extra`` is set is registered hidden (so
``store --help`` lists only what can run), its ``--help`` starts with the install hint, and running it prints
that hint as one line and exits 2. Its module must stay importable without the extra (heavy imports inside the
commands); ``algorithms.extras.needs_train_extra`` marks the targets that need ``train``."""


def _install_hint(ep: EntryPoint, extra: str) -> str:
    distribution = ep.dist.name if ep.dist is not None else "lightning-store"
    return f"store {ep.name} needs the {extra!r} extra: pip install '{distribution}[{extra}]'"


def _register_unavailable(ep: EntryPoint, target: object, hint: str) -> None:
    """Registers a hidden stand-in for the command ``ep`` names: its help is ``hint`` and the target's own help;
    whatever it is given, it prints ``hint`` and exits 2."""
    about = target.info.help if isinstance(target, typer.Typer) else inspect.getdoc(target)
    shown = escape(hint) + (f"\n\n{about}" if isinstance(about, str) and about else "")

    def unavailable() -> None:
        typer.echo(hint, err=True)
        raise typer.Exit(2)

    accept_anything = {"ignore_unknown_options": True, "allow_extra_args": True}
    app.command(name=ep.name, help=shown, hidden=True, context_settings=accept_anything)(unavailable)


def _load_plugins() -> None:
    """Adds the commands of the ``lightning_store.commands`` entry points (see :data:`MISSING_EXTRA` for those
    whose extra is not installed); one that fails to load is logged and skipped."""
    for ep in entry_points(group="lightning_store.commands"):
        try:
            target = ep.load()
        except Exception as exc:
            logger.warning("cannot load command %r from entry point group lightning_store.commands: %s", ep.name, exc)
            continue
        extra = getattr(target, MISSING_EXTRA, None)
        if isinstance(extra, str) and extra:
            _register_unavailable(ep, target, _install_hint(ep, extra))
        elif isinstance(target, typer.Typer):
            app.add_typer(target, name=ep.name)
        else:
            app.command(name=ep.name)(target)


def main() -> None:
    _load_plugins()
    app()
