"""A store on Postgres opens at most ``pool_size`` connections for its requests and keeps them.

With overflow connections (SQLAlchemy's default), every burst of more than ``pool_size`` requests opened
connections and closed them as they were returned: a Postgres backend started and ended per burst, which cost a
fifth of the rollouts/s at 16 runner workers (docs/benchmarks.md, ninth round).
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from lightning_store import EnqueueRolloutRequest
from lightning_store.sql.store import open_store

pytestmark = pytest.mark.postgres

POOL_SIZE = 3


async def _sessions(admin: asyncpg.Connection, database: str) -> tuple[int, int]:
    """Sessions ever started on ``database`` (Postgres counts them), and those connected now."""
    started = await admin.fetchval("SELECT sessions FROM pg_stat_database WHERE datname = $1", database)
    connected = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database)
    return int(started), int(connected)


async def _settled(admin: asyncpg.Connection, database: str) -> tuple[int, int]:
    """:func:`_sessions` once every connection the store keeps is open and counted: the one that LISTENs opens in
    the background (on a loaded machine after the first burst: seen in CI as 3 sessions, then 4), and a backend's
    start reaches ``pg_stat_database`` when it flushes its statistics. Two equal reads half a second apart, with
    the pool and the listener connected, or what the last read said after 15 s."""
    deadline = asyncio.get_running_loop().time() + 15
    previous = await _sessions(admin, database)
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.5)
        current = await _sessions(admin, database)
        if current == previous and current[1] == POOL_SIZE + 1:
            break
        previous = current
    return previous


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_bursts_of_requests_reuse_the_pools_connections(database_url: str) -> None:
    url = make_url(database_url)
    admin = await asyncpg.connect(user=url.username, host=url.host, port=url.port, database="postgres")
    store = await open_store(database_url, pool_size=POOL_SIZE, watchdog=False)
    try:
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(40)])

        async def burst() -> None:  # far more requests at once than the pool has connections
            reads = [store.query_rollouts(limit=5) for _ in range(20)]
            claims = [store.dequeue_rollout() for _ in range(4)]
            await asyncio.gather(*reads, *claims)

        await burst()
        started_before, connected = await _settled(admin, str(url.database))
        assert connected <= POOL_SIZE + 1, connected  # the pool, and the connection that LISTENs
        for _ in range(5):
            await burst()
            await asyncio.sleep(0.2)  # pg_stat_database's counters are updated within a moment
        started_after, connected = await _sessions(admin, str(url.database))
        assert connected <= POOL_SIZE + 1, connected
        assert started_after == started_before, "connections were opened and closed per burst"
    finally:
        await store.close()
        await admin.close()
