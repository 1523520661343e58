"""Shared fixtures. ``store`` is the conformance fixture: one store contract, every backend.

Backends: the SQL store on SQLite and on Postgres, and the HTTP client talking to a real ``store serve``
application (uvicorn on 127.0.0.1, an ephemeral port) over each of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.server import create_app
from lightning_store.settings import ServerSettings
from lightning_store.sql import SqlStore, open_store
from tests.postgres import TemplateDatabases, server_answers

# Small torch/BLAS workloads slow down badly when another process holds the CPU; keep tests polite.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 set (execnet's doing): a rich console built at import
# would keep that width for good, where the tests' CliRunner(env={"COLUMNS": ...}) expects it read per command.
if "PYTEST_XDIST_WORKER" in os.environ:
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

BACKENDS = ["sqlite", "postgres", "http-sqlite", "http-postgres"]

StoreFactory = Callable[..., Awaitable[LightningStore]]


@pytest.fixture(scope="session")
def postgres_available() -> bool:
    return server_answers()


@pytest.fixture(scope="session")
def pg_templates(postgres_available: bool) -> Iterator[TemplateDatabases | None]:
    if not postgres_available:
        yield None
        return
    templates = TemplateDatabases()
    asyncio.run(templates.create_template())
    yield templates
    asyncio.run(templates.drop_all())


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test; conformance tests are parametrized over all of them (see below)."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
async def database_url(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, pg_templates: TemplateDatabases | None
) -> AsyncIterator[str]:
    """A fresh, migrated database of the test's backend (or of the one given as this fixture's parameter)."""
    kind = str(getattr(request, "param", None) or backend).removeprefix("http-")
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
        return
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = await pg_templates.clone()
    yield url
    await pg_templates.drop(url)


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[str]:
    """A real HTTP server for an ASGI app on 127.0.0.1 (an ephemeral port), in this event loop; yields its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def serving(store: LightningStore, **settings: Any) -> AsyncIterator[str]:
    """``store serve`` for ``store`` (which the caller owns), with these server settings; yields its URL."""
    async with serve_app(create_app(ServerSettings(**settings), store=store)) as url:
        yield url


SQL_BACKENDS = pytest.mark.parametrize(
    "database_url",
    [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
"""A test (or, as ``pytestmark``, a module) run once on SQLite and once on Postgres."""


@pytest.fixture
async def sql_store(database_url: str) -> AsyncIterator[SqlStore]:
    """A SQL store over the test's database (no watchdog); tests that define their own keep theirs."""
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    yield store
    await store.close()


@contextlib.asynccontextmanager
async def behind_a_stand_in(database_url: str, arguments: dict[str, Any]) -> AsyncIterator[tuple[SqlStore, str]]:
    """A SQL store, ``store serve`` of it (yields the store and the server's URL) and the scripted STAND-IN LLM
    (``tests.scripted_upstream``, calling tools with ``arguments``) registered as its ``main_llm``."""
    from lightning_store import LLM
    from tests.scripted_upstream import create_app as scripted

    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    try:
        async with serve_app(scripted(arguments)) as upstream, serving(store) as url:
            await store.add_resources({"main_llm": LLM(endpoint=f"{upstream}/v1", model="scripted")})
            yield store, url
    finally:
        await store.close()


@pytest.fixture
async def store_factory(backend: str, database_url: str) -> AsyncIterator[StoreFactory]:
    """Opens stores over the test's database; several stores stand for several processes (for HTTP backends:
    several servers, each with its own SQL store, and a client for each)."""
    async with contextlib.AsyncExitStack() as stack:

        async def factory(**settings: Any) -> LightningStore:
            settings.setdefault("watchdog_interval", 0)
            sql_store: SqlStore = await open_store(database_url, migrate=True, **settings)
            stack.push_async_callback(sql_store.close)
            if not backend.startswith("http-"):
                return sql_store
            url = await stack.enter_async_context(serving(sql_store))
            client = HttpStore(url)
            stack.push_async_callback(client.close)
            return client

        yield factory


@pytest.fixture
async def store(store_factory: StoreFactory) -> LightningStore:
    return await store_factory()


PAGES = "tests/pages/"
"""Docs pages run as written (tests/pages/__init__.py), the longest tests: they go out first."""
ON_DEFAULT_PORTS = (
    "tests/pages/test_bring_your_own_agent.py",  # store serve on 4747, store policy serve on 8000
    "tests/pages/test_switch_from_agent_lightning.py",  # store serve on 4747
    "tests/pages/test_tutorial.py",  # store train's servers on their default ports
)
"""The pages that listen on the default ports: one unit of work, so that they never run at the same time. Every
other page names ports of its own (the framework how-tos: 4790-4796 and 8790-8796)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The docs pages first (the longest unit of work, see :func:`pytest_xdist_make_scheduler`), then the rest in
    collection order; ``long`` tests (several learning runs each) run only when LIGHTNING_STORE_TEST_LONG=1.

    Why not every slow module first: tried (2026-12-04), its tests took 47.5 minutes, where CI's run of this order
    had taken about 30 (on another machine; not like for like, but a large gap). On two cores, three workers that
    all train or drive browsers at once queue for the CPU, and the quick tests left for the end wait on sleeps and
    subprocesses with the cores idle; mixed, the waiting tests fill the cores the heavy ones leave."""
    items.sort(key=lambda item: not item.nodeid.startswith(PAGES))  # stable: the rest keeps its order
    if os.environ.get("LIGHTNING_STORE_TEST_LONG") == "1":
        return
    skip = pytest.mark.skip(
        reason="a long test (a learning run, or each fault of the cluster): set LIGHTNING_STORE_TEST_LONG=1 to run it"
    )
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than there are cores (most tests wait on subprocesses, servers and sockets
    more than they compute), at most 8 (each worker with its servers and models takes about 1.5 GiB)."""
    return max(2, min(8, (os.cpu_count() or 1) + 1))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadscope`` (pyproject.toml's default), pytest-xdist sends each worker whole modules, not
    single tests, so that a module's fixtures are built once; the pages of :data:`ON_DEFAULT_PORTS` go together as
    one unit, so that two of them never listen at once; and the modules go out in collection order (the pages,
    the longest, first: :func:`pytest_collection_modifyitems`). (``xdist_group`` would say the same with a
    marker, but pytest-xdist 3.8 cannot apply it under pytest 9, whose node ids it no longer rewrites.)"""
    if config.getvalue("dist") != "loadscope":  # another --dist asked for on the command line: xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class Modules(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "pages on the default ports" if module in ON_DEFAULT_PORTS else module

    config.option.loadscopereorder = False  # keep collection order: the longest work first
    return Modules(config, log)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test under tests/conformance runs once per backend.
    if "backend" in metafunc.fixturenames and "conformance" in str(metafunc.definition.path):
        metafunc.parametrize(
            "backend",
            [pytest.param(b, marks=[pytest.mark.postgres] if "postgres" in b else []) for b in BACKENDS],
            indirect=True,
            ids=BACKENDS,
        )
