"""What every benchmark needs around its workload, in one place: free ports and child processes, ``store serve``
and ``store run`` as subprocesses, the stand-in LLM upstream, the reference peer (Agent Lightning 0.3's ``agl
store``, run from an interpreter that has it), the databases (a SQLite file, a Postgres database created for the
run and dropped after), and the CPU meters read from ``/proc``.

A benchmark file holds its workload and its table; it starts what it measures through these helpers so that
every benchmark starts servers, databases and peers the same way. Children run in process groups of their own
(:func:`child`), so that stopping one stops what it started (a server's workers, a runner's processes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from algorithms.local_stack import free_port, log_tail, store_command

__all__ = [
    "AGL_ENV",
    "DEFAULT_AGL_PYTHON",
    "DEFAULT_POSTGRES_URL",
    "REPO",
    "STARTUP_SECONDS",
    "Timed",
    "add_postgres_url",
    "agl_store",
    "async_postgres_database",
    "child",
    "database",
    "echo_upstream",
    "find_agl_python",
    "free_port",
    "group_cpu",
    "log",
    "log_tail",
    "nearest_rank",
    "postgres_admin",
    "postgres_answers",
    "postgres_cpu",
    "postgres_database",
    "postgres_reachable",
    "runner",
    "server",
    "server_process",
    "stop",
    "store_command",
    "wait_http",
    "wait_listening",
    "without_store_settings",
]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AGL_PYTHON = "/tmp/aglvenv/bin/python"
STARTUP_SECONDS = 120.0
AGL_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}
"""LiteLLM (under agentlightning) would fetch its model cost map from the network at import."""
AGL_LAUNCHER = "import sys; from agentlightning.cli import main; sys.argv[0] = 'agl'; sys.exit(main())"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def report_runs(results: Sequence[Mapping[str, Any]], work: Path) -> None:
    """After a benchmark's table: one JSON line per run on stdout (for docs/benchmarks.md and scripts), then where
    the runs' folders are kept, on stderr."""
    for result in results:
        print(json.dumps(result))
    print(f"runs kept in {work}", file=sys.stderr)


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile of ``values`` (NaN when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


class Timed:
    """Throughput and latency percentiles for a measurement (a dataclass) of ``calls`` calls that handled ``items``
    items in ``seconds``, with each call's latency in ``latencies`` (seconds)."""

    calls: int
    items: int
    seconds: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else math.inf

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile of the per-call latencies, in seconds."""
        return nearest_rank(self.latencies, q)

    def timing_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "items": self.items,
            "seconds": round(self.seconds, 4),
            "per_second": round(self.throughput, 1),
            "p50_ms": round(self.percentile(50) * 1000, 3),
            "p99_ms": round(self.percentile(99) * 1000, 3),
        }


def add_postgres_url(parser: argparse.ArgumentParser) -> None:
    """``--postgres-url``: the server the benchmark creates its databases on."""
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("LIGHTNING_STORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL),
        help="the Postgres server to create the benchmark's databases on "
        "(default $LIGHTNING_STORE_BENCH_POSTGRES_URL or the local trust-auth server)",
    )


# Processes -----------------------------------------------------------------------------------------------------


def without_store_settings() -> dict[str, str]:
    """This environment without ``LIGHTNING_STORE_*``: a child names its store on its command line only."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}


def stop(process: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group ``process`` leads (a server's workers, a runner's), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


@contextlib.contextmanager
def child(
    argv: Sequence[str], log_file: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in a process group of its own, its output in ``log_file``; stopped (:func:`stop`) on exit."""
    with log_file.open("wb") as sink:
        process = subprocess.Popen(
            list(argv), stdout=sink, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True
        )
    try:
        yield process
    finally:
        stop(process)


def wait_http(url: str, process: subprocess.Popen[Any], log_file: Path, timeout: float = STARTUP_SECONDS) -> None:
    """Returns once ``url`` answers 200; raises if ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}:\n{log_tail(log_file)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout:.0f} s:\n{log_tail(log_file)}")


def wait_listening(port: int, timeout: float = 30.0) -> None:
    """Returns once something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# Servers, runners, upstreams -----------------------------------------------------------------------------------


def server_argv(backend: str, port: int, database_url: str | None, agl_python: str | None) -> list[str]:
    """``agl store`` (in memory) for ``backend == "agl"``; else ``store serve`` on ``database_url``, migrated."""
    if backend == "agl":
        assert agl_python is not None
        return [agl_python, "-c", AGL_LAUNCHER, "store", "--host", "127.0.0.1", "--port", str(port)]
    assert database_url is not None
    serve = ["serve", "--port", str(port), "--database-url", database_url, "--migrate", "--log-level", "warning"]
    return [*store_command(), *serve]


@contextlib.contextmanager
def server_process(
    backend: str,
    directory: Path,
    database_url: str | None = None,
    agl_python: str | None = None,
    extra: Sequence[str] = (),
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A running server of ``backend`` (``sqlite``/``postgres``: ``store serve`` on ``database_url``; ``agl``:
    ``agl store``) on a free port, with ``extra`` arguments; yields its root URL and the process (the leader of
    its group), and stops it afterwards."""
    port = free_port()
    log_file = directory / f"{backend}-{port}.log"
    argv = [*server_argv(backend, port, database_url, agl_python), *extra]
    with child(argv, log_file, env=without_store_settings() | AGL_ENV, cwd=directory) as process:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/v1/agl/health", process, log_file)
        yield url, process


@contextlib.contextmanager
def server(
    backend: str, directory: Path, database_url: str | None = None, agl_python: str | None = None
) -> Iterator[str]:
    """As :func:`server_process`, yielding the URL only."""
    with server_process(backend, directory, database_url, agl_python) as (url, _):
        yield url


@contextlib.contextmanager
def agl_store(directory: Path, python: str = sys.executable) -> Iterator[str]:
    """``agl store`` (in memory) from ``python`` on a free port; yields its root URL."""
    with server("agl", directory, agl_python=python) as url:
        yield url


@contextlib.contextmanager
def runner(url: str, agent: str, workers: int, directory: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``store run AGENT --store URL --workers N`` (quiet, 5 s grace) from the repository root; yields the leader of
    its process group (its workers are in it)."""
    argv = [*store_command(), "run", agent, "--store", url, "--workers", str(workers), "--no-progress"]
    log_file = directory / f"runner-{workers}.log"
    with child([*argv, "--grace", "5", *extra], log_file, env=without_store_settings(), cwd=REPO) as process:
        yield process


@contextlib.contextmanager
def echo_upstream(directory: Path) -> Iterator[str]:
    """The stand-in OpenAI-compatible upstream of ``bench/echo_upstream.py`` (answers at once, echoing); yields
    its ``/v1`` URL once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.echo_upstream", str(port)]
    with child(argv, directory / "echo.log", cwd=REPO):
        wait_listening(port)
        yield f"http://127.0.0.1:{port}/v1"


def find_agl_python(configured: str | None) -> str | None:
    """An interpreter that has agentlightning (``configured``, ``$LIGHTNING_STORE_AGL_PYTHON`` or
    :data:`DEFAULT_AGL_PYTHON`), by its package metadata (importing it takes seconds); None if there is none."""
    candidate = configured or os.environ.get("LIGHTNING_STORE_AGL_PYTHON") or DEFAULT_AGL_PYTHON
    if not Path(candidate).exists() and shutil.which(candidate) is None:
        return None
    code = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('agentlightning') else 1)"
    done = subprocess.run([candidate, "-c", code], capture_output=True, timeout=60, check=False)
    return candidate if done.returncode == 0 else None


# Databases -----------------------------------------------------------------------------------------------------


async def postgres_admin(admin_url: str, sql: str) -> None:
    """Run ``sql`` on the server of ``admin_url`` (any SQLAlchemy or libpq spelling of it)."""
    import asyncpg  # the postgres extra

    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def postgres_reachable(admin_url: str) -> bool:
    """Whether a Postgres server answers at ``admin_url`` (said on stderr when not)."""
    try:
        await postgres_admin(admin_url, "SELECT 1")
    except Exception as exc:
        log(f"[postgres] skipped: no server answers at {make_url(admin_url)!r} ({exc})")
        return False
    return True


def postgres_answers(admin_url: str) -> bool:
    """:func:`postgres_reachable`, outside an event loop."""
    return asyncio.run(postgres_reachable(admin_url))


def _database_url(admin_url: str, name: str, driver: str) -> str:
    return make_url(admin_url).set(drivername=driver, database=name).render_as_string(hide_password=False)


@contextlib.asynccontextmanager
async def async_postgres_database(
    admin_url: str, prefix: str = "ls_bench", driver: str = "postgresql+asyncpg"
) -> AsyncIterator[str]:
    """A database created for this run on ``admin_url``'s server, dropped afterwards; yields its URL (with
    ``driver``). For code already in an event loop; :func:`postgres_database` otherwise."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await postgres_admin(admin_url, f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(admin_url, name, driver)
    finally:
        await postgres_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def postgres_database(admin_url: str, prefix: str = "ls_bench", driver: str = "postgresql+asyncpg") -> Iterator[str]:
    """As :func:`async_postgres_database`, outside an event loop."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(postgres_admin(admin_url, f'CREATE DATABASE "{name}"'))
    try:
        yield _database_url(admin_url, name, driver)
    finally:
        asyncio.run(postgres_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.contextmanager
def database(backend: str, admin_url: str, directory: Path) -> Iterator[str | None]:
    """The database of one server run: a new SQLite file in ``directory`` (``sqlite``), a new Postgres database
    dropped after (``postgres``), or none (``agl``: in memory)."""
    if backend == "agl":
        yield None
    elif backend == "sqlite":
        yield f"sqlite+aiosqlite:///{directory / f'bench-{uuid.uuid4().hex[:8]}.db'}"
    else:
        with postgres_database(admin_url, "ls_bench_http") as url:
            yield url


# CPU meters ----------------------------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def group_cpu(pgid: int) -> float:
    """CPU-seconds (user + system) used so far by the live processes of process group ``pgid``, and by the
    children they have reaped."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        # fields[2] is the process group; [11], [12] utime and stime; [13], [14] those of reaped children.
        if fields is not None and int(fields[2]) == pgid:
            total += sum(int(f) for f in fields[11:15])
    return total / TICKS


def postgres_cpu() -> float:
    """CPU-seconds used so far by every live process named ``postgres`` (the server and its backends)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        fields = _stat(pid) if name == "postgres" else None
        if fields is not None:
            total += sum(int(f) for f in fields[11:13])
    return total / TICKS
