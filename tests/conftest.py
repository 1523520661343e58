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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``long`` tests (several learning runs each) run only when LIGHTNING_STORE_TEST_LONG=1."""
    if os.environ.get("LIGHTNING_STORE_TEST_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="a long learning test: set LIGHTNING_STORE_TEST_LONG=1 to run it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test under tests/conformance runs once per backend.
    if "backend" in metafunc.fixturenames and "conformance" in str(metafunc.definition.path):
        metafunc.parametrize(
            "backend",
            [pytest.param(b, marks=[pytest.mark.postgres] if "postgres" in b else []) for b in BACKENDS],
            indirect=True,
            ids=BACKENDS,
        )
