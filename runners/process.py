"""The worker process: one :class:`~runners.worker.Worker` in its own interpreter, supervised by the runner.

A process per worker is what makes a hung agent recoverable: the supervisor can kill it. The process stops
dequeuing on SIGTERM or SIGINT, gives the attempts in flight ``grace`` seconds to finish, then releases them (each
attempt is marked failed and the rollout requeued, whatever its retry policy: the agent was not at fault) for at
most ``RELEASE_SECONDS``: a store that does not answer by then (its server is gone) leaves them to the watchdog.
If the runner process dies, the worker finishes its attempt (bounded by its timeout) and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from lightning_store import aio
from lightning_store.connect import connect, is_server_url
from lightning_store.logs import quiet_chatty_loggers
from lightning_store.settings import RunnerSettings
from runners.agent import agent_problem, load_agent
from runners.attempts import RELEASE_SECONDS, release_all
from runners.openai_defaults import point_openai_defaults
from runners.worker import EXIT_HUNG, AgentHung, Worker
from tracers.openinference import instrument_from_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs (it crosses the process boundary by pickling)."""

    agent: str
    store_url: str
    worker_id: str
    token: str | None = None
    default_timeout: float | None = None
    heartbeat_interval: float = 5.0
    poll_timeout: float = 5.0
    concurrency: int = 1
    grace: float = 30.0
    idle_exit: float | None = None
    parent_pid: int = 0
    log_level: int = logging.INFO
    cwd_on_path: str | None = None


def worker_main(config: WorkerConfig, conn: Connection) -> None:
    """Entry point of a worker process."""
    logging.basicConfig(level=config.log_level, format=f"%(asctime)s {config.worker_id} %(levelname)s %(message)s")
    quiet_chatty_loggers(config.log_level)
    if config.cwd_on_path and config.cwd_on_path not in sys.path:
        sys.path.insert(0, config.cwd_on_path)  # agents given as module:name from the runner's directory
    try:
        aio.run(_serve(config, conn))
    except AgentHung as hung:
        logger.error("%s; exiting so that the runner starts a fresh worker", hung)
        _send(conn, {"event": "hung", "attempt_id": hung.attempt_id})  # the others it held were not at fault
        conn.close()
        os._exit(EXIT_HUNG)  # the hung thread cannot be joined; leave without waiting for it


async def _serve(config: WorkerConfig, conn: Connection) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    _watch_parent(config.parent_pid, lambda: loop.call_soon_threadsafe(stop.set))
    server_url = config.store_url if is_server_url(config.store_url) else None
    point_openai_defaults(  # before the agent's module is imported: a client made at import reads them
        server_url=server_url,
        worker_id=config.worker_id,
        token=config.token,
        concurrency=config.concurrency,
        enabled=RunnerSettings().openai_defaults,
    )
    try:
        agent = load_agent(config.agent)
    except Exception as error:  # the agent's own import may raise anything: all of it means "cannot run it"
        _send(conn, {"event": "unloadable", "reason": agent_problem(config.agent, error)})
        return
    instrument_from_settings()  # OpenInference for LangChain / the OpenAI Agents SDK (LIGHTNING_STORE_INSTRUMENT)
    store = await connect(config.store_url, token=config.token)
    worker = Worker(
        store,
        agent,
        worker_id=config.worker_id,
        server_url=server_url,
        token=config.token,
        default_timeout=config.default_timeout,
        heartbeat_interval=config.heartbeat_interval,
        poll_timeout=config.poll_timeout,
        concurrency=config.concurrency,
        report=lambda event: _send(conn, event),
    )
    aio.freeze_startup_heap()  # the agent and its libraries are imported; nothing else is made up front
    try:
        running = asyncio.ensure_future(worker.run(stop, idle_exit=config.idle_exit))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not running.done():
            # Stopping: no new claims; the attempts in flight may finish within the grace period.
            done, _ = await asyncio.wait({running}, timeout=config.grace)
            if not done:
                await _release_in_flight(worker, running, conn)
                return
        running.result()
    finally:
        await store.close()


async def _release_in_flight(worker: Worker, running: asyncio.Future[None], conn: Connection) -> None:
    """Cancel the attempts still running past the grace period and give them back to the queue, in bounded
    time: a store that no longer answers leaves them to the watchdog (see :func:`release_all`)."""
    in_flight = list(worker.in_flight.values())  # cancelled attempts leave worker.in_flight
    running.cancel()
    await asyncio.wait({running}, timeout=RELEASE_SECONDS)  # it flushes its spans as it ends
    ids = [(claimed.rollout_id, claimed.attempt.attempt_id) for claimed in in_flight]
    await release_all(worker.store, ids, "worker stopped")
    for _, attempt_id in ids:
        _send(conn, {"event": "released", "attempt_id": attempt_id})  # the runner need not try again


def _send(conn: Connection, event: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the runner is gone; the store still gets every report
        conn.send(event)


def _watch_parent(parent_pid: int, on_orphaned: Any) -> None:
    """Call ``on_orphaned`` once the runner process has died (checked every half second)."""
    if not parent_pid:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        on_orphaned()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
