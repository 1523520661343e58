"""A listening socket of its own for each worker process (``SO_REUSEPORT``), so that connections spread evenly.

uvicorn's worker processes share the one socket its supervisor binds, and whichever process wakes first accepts
every connection waiting: a burst of connections opened at once (runners starting, a benchmark's clients) lands
on one process while the others idle. Measured on ``store serve --workers 2``: of 12 bursts of 8 connections,
two went 8/0 and five 7/1, and span ingest ran at one process's speed in one run of three. With a socket per
process, all bound to the address with ``SO_REUSEPORT``, Linux hashes each new connection to one of them.

Linux only (elsewhere ``SO_REUSEPORT`` does not balance): :func:`supports_reuse_port` says whether to use it.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from uvicorn.config import STARTUP_FAILURE


def supports_reuse_port() -> bool:
    return sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


class ReusePortListener:
    """Stands in uvicorn's supervisor for the listening socket: pickled into each worker process, it becomes a
    socket of that process's own, bound to the same address with ``SO_REUSEPORT`` (uvicorn makes it listen).

    Made in the supervisor, it binds the address first, which refuses a port already taken (by any server,
    ``SO_REUSEPORT`` or not) and picks the port when it is 0. It keeps a socket bound there, without listening,
    so that the port stays the workers' while one is replaced: a connection only ever goes to a socket that
    listens, so this one never takes any.
    """

    def __init__(self, host: str, port: int) -> None:
        if port != 0:
            _bind(host, port, reuse_port=False).close()  # raises OSError when anything holds the port
        self._held = _bind(host, port, reuse_port=True)
        self.host = host
        self.port: int = self._held.getsockname()[1]

    def __reduce__(self) -> tuple[Any, tuple[str, int]]:
        return _worker_socket, (self.host, self.port)

    def close(self) -> None:
        self._held.close()


def _worker_socket(host: str, port: int) -> socket.socket:
    """The worker's own socket, made as the worker unpickles its arguments; a worker that cannot bind it exits
    as one that failed to start, which stops the supervisor rather than having it restart the worker forever."""
    try:
        return _bind(host, port, reuse_port=True)
    except OSError as exc:
        print(f"cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        raise SystemExit(STARTUP_FAILURE) from None


def _bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart over TIME_WAIT
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
