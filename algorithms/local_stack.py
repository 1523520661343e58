"""The processes of a training run on one machine: ``store serve`` on an embedded SQLite database and ``store run``
with its worker processes, each a subprocess of the trainer.

Why subprocesses: it is the layout of a deployment, where the store is a service of its own that runners reach
over HTTP, and ``store train``, the learning tests and the benchmarks all measure that one layout. (It is not
faster than serving the store inside the trainer's process on 2 vCPUs: there the bound is ``store serve``'s cost
per request, not the interpreter lock; see docs/benchmarks.md.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

T = TypeVar("T")

if TYPE_CHECKING:
    from lightning_store.client import HttpStore


class ProcessFailed(RuntimeError):
    """A stack process exited or never answered; the message ends with the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nothing listens on now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host.strip("[]"), 0))
        port: int = probe.getsockname()[1]
        return port


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def store_command() -> list[str]:
    """The ``store`` CLI of this interpreter's environment (the module form where no script is installed)."""
    script = shutil.which("store", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "lightning_store.cli"]


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def terminate(process: subprocess.Popen[bytes], grace: float = 60.0) -> None:
    """SIGTERM (a graceful shutdown), then SIGKILL if ``process`` still runs after ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


PR_SET_PDEATHSIG = 1
"""``prctl`` option (linux/prctl.h): the signal the calling process gets when its parent dies."""


def die_with_parent() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` that has the child sent SIGTERM when this process dies, SIGKILL included (else
    ``store serve`` and ``store run`` would outlive a killed trainer, orphaned); None elsewhere. The "parent" is
    the thread that starts the child: start them from a thread that lives as long as they should (the main one)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it (no dlopen after fork)

    def preexec() -> None:  # in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@contextlib.contextmanager
def subprocess_in(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Runs ``argv`` with its output appended to ``log`` and ``env`` added to this process's environment; on exit,
    :func:`terminate`. It gets SIGTERM should this process die without stopping it (:func:`die_with_parent`)."""
    environment = None if env is None else os.environ | env
    with log.open("ab") as sink:
        process = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=environment, preexec_fn=die_with_parent()
        )
    try:
        yield process
    finally:
        terminate(process)


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    """Returns once ``store serve`` at ``url`` answers its health route; raises :class:`ProcessFailed` if the
    process exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ProcessFailed(f"store serve exited with {process.returncode}:\n{log_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/agl/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise ProcessFailed(f"store serve did not answer at {url} within {timeout:.0f} s:\n{log_tail(log)}")


@contextlib.contextmanager
def embedded_store(directory: Path, *, log_level: str = "info") -> Iterator[str]:
    """``store serve`` on ``directory/store.db`` (created and migrated if new), logging to
    ``directory/serve.log`` at ``log_level`` (at info: its start, the watchdog's findings, warnings and errors;
    a line per request only at debug); yields its URL and stops it on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    database = f"sqlite+aiosqlite:///{(directory / 'store.db').resolve()}"
    argv = [*store_command(), "serve", "--port", str(port), "--database-url", database, "--log-level", log_level]
    log = directory / "serve.log"
    with subprocess_in(argv, log) as process:
        wait_healthy(url, process, log)
        yield url


@contextlib.asynccontextmanager
async def embedded_store_client(directory: Path) -> AsyncIterator[tuple[HttpStore, str]]:
    """:func:`embedded_store` and a client of it (closed on exit); yields the client and the URL."""
    from lightning_store.client import HttpStore

    with embedded_store(directory) as url:
        client = HttpStore(url)
        try:
            yield client, url
        finally:
            await client.close()


@contextlib.contextmanager
def runners(
    agent: str,
    url: str,
    *,
    workers: int,
    log: Path,
    concurrency: int = 1,
    log_level: str = "info",
    token: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``store run agent`` against the store at ``url`` with ``workers`` worker processes, each running
    ``concurrency`` attempts at once, until exit; its log (a JSON line per finished attempt at info) goes to
    ``log``. ``token``: the server's bearer token, handed over in the environment (not on a command line that
    ``ps`` shows)."""
    argv = [*store_command(), "run", agent, "--store", url, "--workers", str(workers), "--no-progress"]
    argv += ["--concurrency", str(concurrency), "--log-level", log_level]
    with subprocess_in(argv, log, env={"LIGHTNING_STORE_TOKEN": token} if token else None) as process:
        yield process


class ProcessExited(RuntimeError):
    """A process the run depends on exited before the run ended; the message ends with its log's last line."""


async def unless_exited(work: Coroutine[Any, Any, T], process: subprocess.Popen[bytes], log: Path, what: str) -> T:
    """``work``'s result, unless ``process`` exits first: then ``work`` is cancelled and :class:`ProcessExited`
    raised, naming ``what`` and the last line of ``log``. ``store train`` runs its training under it: a runner
    that stopped (an agent that does not load) leaves no one to run the rollouts the training waits for."""
    running = asyncio.ensure_future(work)
    while not running.done():
        await asyncio.wait({running}, timeout=0.5)
        if not running.done() and process.poll() is not None:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(running, 30)  # its own cleanup (closing the store), bounded
            lines = [line for line in log_tail(log, 5).splitlines() if line.strip()]
            last = lines[-1] if lines else "(no log)"
            raise ProcessExited(f"{what} exited (status {process.returncode}): {last}")
    return running.result()
