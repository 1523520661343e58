"""Fixtures shared by the acceptance tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[SqlStore, str]]:
    """A SQL store on the test's database (watchdog every 0.5 s) and a real ``store serve`` of it; its URL."""
    store = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    async with serving(store) as url:
        yield store, url
    await store.close()
