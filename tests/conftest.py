"""Shared fixtures. ``store`` is the conformance fixture: one store contract, every backend."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_store.sql import SqlStore, open_store
from tests.postgres import TemplateDatabases, server_answers

# Small torch/BLAS workloads slow down badly when another process holds the CPU; keep tests polite.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BACKENDS = ["sqlite", "postgres"]

StoreFactory = Callable[..., Awaitable[SqlStore]]


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
async def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, pg_templates: TemplateDatabases | None
) -> AsyncIterator[str]:
    """A fresh, migrated database of the backend named by the test's ``backend`` parameter."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
        return
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = await pg_templates.clone()
    yield url
    await pg_templates.drop(url)


@pytest.fixture
async def store_factory(database_url: str) -> AsyncIterator[StoreFactory]:
    """Opens stores over the test's database; several stores stand for several processes."""
    opened: list[SqlStore] = []

    async def factory(**settings: Any) -> SqlStore:
        settings.setdefault("watchdog_interval", 0)
        store = await open_store(database_url, migrate=True, **settings)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(store_factory: StoreFactory) -> SqlStore:
    return await store_factory()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test under tests/conformance runs once per backend.
    if "database_url" in metafunc.fixturenames and "conformance" in str(metafunc.definition.path):
        metafunc.parametrize(
            "database_url",
            [pytest.param(b, marks=[pytest.mark.postgres] if b == "postgres" else []) for b in BACKENDS],
            indirect=True,
            ids=BACKENDS,
        )
