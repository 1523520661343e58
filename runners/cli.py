"""``store run``: a runner process with N workers (registered through the ``lightning_store.commands`` entry
point group, so the core CLI does not import the runners)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from lightning_store import aio
from lightning_store.connect import store_target
from lightning_store.errors import InvalidRequestError
from lightning_store.logs import LogLevel
from runners.agent import AgentNotLoadable
from runners.progress import configure_logging
from runners.supervisor import Runner


def run(
    agent: Annotated[str, typer.Argument(help="The agent, as module:function (importable from here).")],
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="LIGHTNING_STORE_URL",
            help="A store serve URL (http://host:port; the agent's LLM goes through its proxy) or a database URL.",
        ),
    ] = "http://127.0.0.1:4747",
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 1,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Attempts each worker runs at once (async agents as tasks, sync in threads).")
    ] = 1,
    token: Annotated[str | None, typer.Option(envvar="LIGHTNING_STORE_TOKEN", help="Bearer token.")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Seconds an attempt may run when its rollout config sets no timeout.")
    ] = None,
    kill_after: Annotated[float, typer.Option(help="Seconds past the timeout before a worker is killed.")] = 10.0,
    grace: Annotated[float, typer.Option(help="Seconds in-flight attempts get to finish on SIGINT/SIGTERM.")] = 30.0,
    idle_exit: Annotated[
        float | None, typer.Option(help="Exit once no attempt has run and the queue stayed empty this many seconds.")
    ] = None,
    heartbeat: Annotated[float, typer.Option(help="Seconds between heartbeats.")] = 5.0,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Live display (default: on a terminal).")
    ] = None,
    log_level: Annotated[
        LogLevel, typer.Option(help="Log records shown, the workers' too; debug adds a line per HTTP request.")
    ] = LogLevel.info,
) -> None:
    """Run rollouts of AGENT from the store's queue in WORKERS processes (each running CONCURRENCY attempts at
    once) until stopped."""
    configure_logging(log_level.number)
    try:
        store = store_target(store)
    except InvalidRequestError as error:
        typer.echo(f"store run: {error}", err=True)
        raise typer.Exit(2) from None
    runner = Runner(
        agent,
        store,
        workers=workers,
        concurrency=concurrency,
        token=token,
        default_timeout=timeout,
        kill_after=kill_after,
        grace=grace,
        idle_exit=idle_exit,
        heartbeat_interval=heartbeat,
        progress=progress,
    )
    aio.freeze_startup_heap()  # also keeps the exit short: the store command's plugins import torch
    try:
        summary = aio.run(runner.run())
    except AgentNotLoadable as error:
        typer.echo(f"store run: {error}", err=True)  # one line, however wide the terminal
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"summary": summary.statuses, "worker_restarts": summary.worker_restarts}))
    if summary.forced:
        raise typer.Exit(1)  # stopped at once by a second signal: the workers were killed
