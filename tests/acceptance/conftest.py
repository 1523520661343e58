"""Fixtures shared by the acceptance tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from algorithms.local_stack import embedded_store_client
from lightning_store.client import HttpStore
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[SqlStore, str]]:
    """A SQL store on the test's database (watchdog every 0.5 s) and a real ``store serve`` of it; its URL."""
    store = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    async with serving(store) as url:
        yield store, url
    await store.close()


@pytest.fixture
async def trainer_store(tmp_path: Path) -> AsyncIterator[tuple[HttpStore, str]]:
    """``store serve`` on SQLite as a subprocess, as ``store train`` runs it (the learning tests' store)."""
    async with embedded_store_client(tmp_path / "store") as served:
        yield served
