"""The ``store`` command's root: the Typer app with this package's commands. Subcommands from other packages arrive
through the ``lightning_store.commands`` entry-point group: each entry point names a ``typer.Typer`` (added as a
group) or a function (a command)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from lightning_store.cli.common import DatabaseUrl, database_errors, fail
from lightning_store.cli.enqueue import enqueue
from lightning_store.cli.export import export
from lightning_store.cli.prune import prune
from lightning_store.cli.resources import resources
from lightning_store.cli.rollout_actions import cancel, requeue, retry
from lightning_store.cli.rollouts import rollouts
from lightning_store.cli.sql import sql
from lightning_store.cli.stats import stats
from lightning_store.logs import LogLevel
from lightning_store.settings import load_settings

STORE_PANEL = "Commands: the store"
LOOP_PANEL = "Commands: the training loop"
HOLDS_PANEL = "Commands: what the store holds"
PLUGIN_PANEL = "Commands: from plugins"
PANELS: dict[str, str] = {
    "serve": STORE_PANEL,
    "migrate": STORE_PANEL,
    "resources": LOOP_PANEL,
    "policy": LOOP_PANEL,
    "enqueue": LOOP_PANEL,
    "doctor": LOOP_PANEL,
    "run": LOOP_PANEL,
    "train": LOOP_PANEL,
    "algorithms": LOOP_PANEL,
    "rollouts": HOLDS_PANEL,
    "stats": HOLDS_PANEL,
    "sql": HOLDS_PANEL,
    "export": HOLDS_PANEL,
    "prune": HOLDS_PANEL,
}
"""Where ``store --help`` lists each command, in this order: the loop's steps as a newcomer takes them
(docs/reference/cli.md has the same table). A plugin's command not named here goes under :data:`PLUGIN_PANEL`."""


class InLoopOrder(TyperGroup):
    """Lists the commands in the order of :data:`PANELS` (Typer lists commands before groups, in the order they
    were added, and plugins are added last), others after them as they were added."""

    def list_commands(self, ctx: Any) -> list[str]:  # (a Context of the click that this Typer version vendors)
        rank = {name: i for i, name in enumerate(PANELS)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    help="lightning-store: a durable rollout and span store for agent RL.", no_args_is_help=True, cls=InLoopOrder
)
console = Console()
logger = logging.getLogger(__name__)
# The workflow commands, through the store contract (server or database): see lightning_store/cli/common.py.
for command in (enqueue, stats, sql, export, prune):
    app.command(rich_help_panel=PANELS[command.__name__])(command)
app.add_typer(resources, name="resources", rich_help_panel=PANELS["resources"])
app.add_typer(rollouts, name="rollouts", rich_help_panel=PANELS["rollouts"])
for act in (retry, requeue, cancel):
    rollouts.command()(act)


@app.command(rich_help_panel=STORE_PANEL)
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
    otlp_grpc: Annotated[
        bool | None,
        typer.Option(
            "--otlp-grpc/--no-otlp-grpc",
            help="Accept OTLP traces over gRPC too \\[default: on].",
            show_default=False,
        ),
    ] = None,
    otlp_grpc_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Port of OTLP over gRPC \\[default: 4317].", show_default=False),
    ] = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            case_sensitive=False, help="Log records shown, uvicorn's and the store's; debug adds a line per request."
        ),
    ] = LogLevel.info,
) -> None:
    """Serve the store over HTTP: the Agent Lightning 0.3 REST API under /v1/agl, OTLP at /v1/traces (and over
    gRPC on port 4317), /metrics."""
    from lightning_store.errors import StoreError
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
        otlp_grpc=otlp_grpc,
        otlp_grpc_port=otlp_grpc_port,
    )
    try:
        with database_errors("cannot serve", settings.database_url, code=2, serving=True):
            run_server(settings, log_level=log_level.value)
    except StoreError as exc:
        fail("cannot serve", str(exc), 2)


@app.command(rich_help_panel=STORE_PANEL)
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

    with database_errors("cannot migrate", url):
        now = asyncio.run(run())
    console.print(f"schema at revision [bold]{now}[/bold]")


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
            app.add_typer(target, name=ep.name, rich_help_panel=PANELS.get(ep.name, PLUGIN_PANEL))
        else:
            app.command(name=ep.name, rich_help_panel=PANELS.get(ep.name, PLUGIN_PANEL))(target)


def main() -> None:
    _load_plugins()
    app()
