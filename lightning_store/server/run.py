"""Starting the server: one process in place, or several uvicorn workers over one Postgres database."""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import logging
import logging.config
import os
import sys
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG, STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from lightning_store import aio
from lightning_store.errors import InvalidRequestError
from lightning_store.migrate import prepare_database
from lightning_store.server.bounded_headers import BoundedHeadersProtocol
from lightning_store.server.listeners import ReusePortListener, supports_reuse_port
from lightning_store.settings import ServerSettings, load_server_settings
from lightning_store.sql.engine import is_sqlite, normalize_url, shown_url

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 1
"""How long a stopping server lets requests in flight finish before it cancels them. Long-polls do not count:
they answer at once when the server stops (:mod:`lightning_store.server.shutdown`); this bounds the rest (an LLM
call the proxy is waiting on, say), whose clients see the connection close."""

KEEP_ALIVE_SECONDS = 75
"""How long an idle client connection stays open. Longer than any client keeps one idle (httpx 5 s, aiohttp 15 s,
``HttpStore`` 5 s): the client then always closes first. With uvicorn's 5 s, a request sent as the
server closed the connection failed with a reset; 1,000 simulated runners, 30 s between their calls, saw 22."""


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
    """Serve the store until stopped. Logs go to stderr: uvicorn's and the store's own (:func:`log_config`); a
    line per request (uvicorn's access log) only at ``debug`` or ``trace``."""
    check(settings)
    logging.config.dictConfig(log_config(log_level))  # the lines of the migration and of a refusal, formatted alike
    # Migrate, or refuse a database that cannot be reached or is not migrated, before any process starts.
    settings = asyncio.run(prepare_database(settings))
    processes = f"{settings.workers} processes" if settings.workers > 1 else "1 process"
    shown = shown_url(settings.database_url)
    logger.info("store on %s, serving http://%s:%d (%s)", shown, settings.host, settings.port, processes)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": log_level,
        "log_config": log_config(log_level),
        "access_log": log_level.lower() in ("debug", "trace"),
        "timeout_graceful_shutdown": SHUTDOWN_GRACE_SECONDS,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
        "http": BoundedHeadersProtocol,  # httptools, with a request's headers bounded (server/bounded_headers.py)
    }
    BoundedHeadersProtocol.max_head_bytes = settings.max_header_bytes
    if settings.workers == 1:
        from lightning_store.server.app import create_app

        app = create_app(settings, freeze_heap=True, otlp_grpc=True)
        uvicorn.run(app, **options)
        return
    # Workers are separate processes: they read their settings from the environment we pass down.
    for name, value in settings.model_dump(exclude={"workers"}).items():
        if value is not None:
            text = ",".join(value) if isinstance(value, list) else str(value)  # lists are read back comma-separated
            os.environ[f"LIGHTNING_STORE_{name.upper()}"] = text
    os.environ["LIGHTNING_STORE_MIGRATE_ON_START"] = "false"
    # An attempt's end may reach another process than its calls did, whose CallRecorder.settled cannot wait for
    # this one's records: no process holds records back in a window.
    os.environ["LIGHTNING_STORE_CALL_RECORD_WINDOW"] = "0"
    # This process only supervises the workers. Freezing what it holds also keeps its exit short: tearing down
    # the modules the ``store`` command's plugins import (torch among them) took over a second of garbage
    # collection after the workers had stopped.
    aio.freeze_startup_heap()
    config = uvicorn.Config(
        "lightning_store.server.run:app_from_environment", factory=True, workers=settings.workers, **options
    )
    # uvicorn.run(workers=N) without its shared socket: each worker listens on its own (server/listeners.py).
    if not supports_reuse_port():
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    try:
        listener = ReusePortListener(settings.host, settings.port)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", settings.host, settings.port, exc)
        sys.exit(STARTUP_FAILURE)
    try:
        Multiprocess(config, sockets=[listener]).run()  # type: ignore[list-item]  # a socket in each worker
    finally:
        listener.close()


def app_from_environment() -> Any:
    from lightning_store.server.app import create_app

    settings = load_server_settings()
    BoundedHeadersProtocol.max_head_bytes = settings.max_header_bytes  # this worker's connections
    return create_app(settings, freeze_heap=True, otlp_grpc=True, share_ports=True)


def log_config(log_level: str) -> dict[str, Any]:
    """uvicorn's logging (on stderr), with the store's own loggers (``lightning_store.*``: the start, the
    watchdog, the listener, the error handlers) printed the same way at the same level."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["lightning_store"] = {"handlers": ["default"], "level": log_level.upper(), "propagate": False}
    return config
