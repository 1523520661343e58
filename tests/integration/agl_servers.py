"""Servers for the tests that check wire compatibility with Agent Lightning 0.3: an interpreter that has
``agentlightning`` installed (never this environment: ``$LIGHTNING_STORE_AGL_PYTHON``, else ``/tmp/aglvenv``,
which ``.ci/run`` builds), a real ``store serve`` subprocess per backend, and Agent Lightning's own ``agl store``
(its reference server, in memory) to compare with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.postgres import TemplateDatabases

AGL_PYTHON_ENV = "LIGHTNING_STORE_AGL_PYTHON"
DEFAULT_AGL_PYTHON = Path("/tmp/aglvenv/bin/python")
STARTUP_SECONDS = 60.0


def probe(python: str) -> str | None:
    """The agentlightning version ``python`` has installed, or None. Reads package metadata only: importing
    agentlightning takes several seconds, and the driver does that itself."""
    code = "import importlib.metadata as m, importlib.util as u; assert u.find_spec('agentlightning'); "
    code += "print(m.version('agentlightning'))"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_agl_python() -> str:
    """An interpreter that can import agentlightning; skips the test when there is none."""
    configured = os.environ.get(AGL_PYTHON_ENV)
    if configured:
        if probe(configured) is None:
            pytest.skip(f"${AGL_PYTHON_ENV}={configured} cannot import agentlightning")
        return configured
    if DEFAULT_AGL_PYTHON.exists() and probe(str(DEFAULT_AGL_PYTHON)) is not None:
        return str(DEFAULT_AGL_PYTHON)
    pytest.skip(
        f"no interpreter with agentlightning: set ${AGL_PYTHON_ENV}, or create {DEFAULT_AGL_PYTHON} "
        f"(python3 -m venv /tmp/aglvenv && /tmp/aglvenv/bin/pip install agentlightning==0.3.0)"
    )


@pytest.fixture(scope="module")
def agl_python() -> str:
    """:func:`find_agl_python`, once per module."""
    return find_agl_python()


def agl_package_dir(python: str) -> Path:
    """Where ``python`` has the ``agentlightning`` package (found without importing it, which takes seconds)."""
    code = "import importlib.util as u; print(list(u.find_spec('agentlightning').submodule_search_locations)[0])"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def store_command() -> list[str]:
    """The installed ``store`` script beside this interpreter, else the module."""
    script = shutil.which("store", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "lightning_store.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Served:
    """A running ``store serve``: its URL, its database and its log file."""

    url: str
    database_url: str
    log: Path
    process: subprocess.Popen[bytes]

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def wait_healthy(served: Served) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            pytest.fail(f"store serve exited with {served.process.returncode}:\n{served.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{served.url}/v1/agl/health", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    pytest.fail(f"store serve did not answer /v1/agl/health within {STARTUP_SECONDS:.0f}s:\n{served.log_tail()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@contextlib.contextmanager
def store_serve(database_url: str, directory: Path, *extra: str) -> Iterator[Served]:
    """``store serve`` on ``database_url`` (``extra``: more of its options), until the block ends."""
    port = free_port()
    log = directory / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}
    argv = [*store_command(), "serve", "--port", str(port), "--database-url", database_url, "--log-level", "warning"]
    argv += extra
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=directory)
    served = Served(f"http://127.0.0.1:{port}", database_url, log, process)
    try:
        wait_healthy(served)
        yield served
    finally:
        stop(process)


@pytest.fixture
def server_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database for the server: a SQLite file, or a Postgres clone of the migrated template."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 's.db'}"
        return
    pg_templates: TemplateDatabases | None = request.getfixturevalue("pg_templates")  # only Postgres needs it
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = asyncio.run(pg_templates.clone())
    try:
        yield url
    finally:
        asyncio.run(pg_templates.drop(url))


@pytest.fixture
def served(server_database: str, tmp_path: Path) -> Iterator[Served]:
    with store_serve(server_database, tmp_path) as running:
        yield running


@contextlib.contextmanager
def reference_server(agl_python: str, directory: Path) -> Iterator[Served]:
    """Agent Lightning's own ``agl store`` (its in-memory store), as its users start it."""
    port = free_port()
    log = directory / "agl-store.log"
    agl = Path(agl_python).parent / "agl"
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")  # agentlightning imports litellm, which else stalls
    with log.open("wb") as sink:
        argv = [str(agl), "store", "--host", "127.0.0.1", "--port", str(port)]
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=directory)
    served = Served(f"http://127.0.0.1:{port}", "memory", log, process)
    try:
        wait_healthy(served)
        yield served
    finally:
        stop(process)
