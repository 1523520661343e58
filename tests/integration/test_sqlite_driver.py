"""The one-trip SQLite driver under SQLAlchemy, on a real database file: what each transaction costs in trips to
the database thread, and that holding ``BEGIN`` back changes nothing a transaction can observe. Also the other
two things that keep SQLite's store from pausing: writes on a connection of their own, and a frozen startup
heap."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from lightning_store.resources import LLM
from lightning_store.sql import open_store, sqlite_driver
from lightning_store.sql.engine import WRITE_OPTION, make_engine

one_trip = pytest.mark.skipif(not sqlite_driver.ONE_TRIP, reason="this aiosqlite release has no one-trip cursors")


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'driver.db'}", pool_size=1)  # one connection, reused
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"))
    yield engine
    await engine.dispose()


async def trips(engine: AsyncEngine) -> list[str]:
    """The names of the functions the engine's one connection sends to its thread from now on."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        aiosqlite_connection: Any = raw.driver_connection
    sent: list[str] = []
    send = aiosqlite_connection._execute

    async def counting(function: Any, *args: Any) -> Any:
        named = function.func if isinstance(function, functools.partial) else function
        sent.append(getattr(named, "__name__", repr(named)))
        return await send(function, *args)

    aiosqlite_connection._execute = counting
    return sent


@one_trip
async def test_a_one_statement_read_is_two_trips_and_its_return_to_the_pool_none(engine: AsyncEngine) -> None:
    sent = await trips(engine)
    async with engine.connect() as conn, conn.begin():
        assert (await conn.execute(sa.text("SELECT count(*) FROM items"))).scalar() == 0
    assert sent == ["_execute", "_finish"]


@one_trip
async def test_a_transaction_without_statements_costs_no_trip(engine: AsyncEngine) -> None:
    sent = await trips(engine)
    async with engine.connect() as conn, conn.begin():
        pass
    async with engine.connect() as conn:
        await conn.execution_options(**{WRITE_OPTION: True})
        async with conn.begin():
            pass
    assert sent == []


@one_trip
async def test_the_held_back_begin_is_sent_a_rollback_undoes_every_statement(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        async with conn.begin() as transaction:
            await conn.execute(sa.text("INSERT INTO items (name) VALUES ('a')"))
            await conn.execute(sa.text("INSERT INTO items (name) VALUES ('b')"))
            await transaction.rollback()
        assert (await conn.execute(sa.text("SELECT count(*) FROM items"))).scalar() == 0
        await conn.commit()


@one_trip
async def test_a_writer_holds_the_write_lock_from_its_first_statement(engine: AsyncEngine, tmp_path: Path) -> None:
    """``BEGIN IMMEDIATE`` still precedes the first statement: another connection cannot write until the
    transaction ends, even when the first statement only reads."""
    other = sqlite3.connect(tmp_path / "driver.db", timeout=0, isolation_level=None)
    try:
        async with engine.connect() as conn:
            await conn.execution_options(**{WRITE_OPTION: True})
            async with conn.begin():
                await conn.execute(sa.text("SELECT count(*) FROM items"))
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("INSERT INTO items (name) VALUES ('other')")
                await conn.execute(sa.text("INSERT INTO items (name) VALUES ('mine')"))
        other.execute("INSERT INTO items (name) VALUES ('other')")
        assert [r[0] for r in other.execute("SELECT name FROM items ORDER BY id")] == ["mine", "other"]
    finally:
        other.close()


@one_trip
async def test_a_failed_first_statement_leaves_the_connection_usable(engine: AsyncEngine) -> None:
    sent = await trips(engine)
    async with engine.connect() as conn:
        with pytest.raises(OperationalError):
            async with conn.begin():
                await conn.execute(sa.text("SELECT * FROM no_such_table"))
        # The failed trip left the transaction's state unknown: the rollback asked the database.
        assert sent == ["_execute", "_finish"]
        async with conn.begin():
            await conn.execute(sa.text("INSERT INTO items (name) VALUES ('after')"))
    async with engine.connect() as conn:
        assert (await conn.execute(sa.text("SELECT name FROM items"))).scalars().all() == ["after"]


async def test_a_store_write_does_not_wait_for_the_readers_pool(tmp_path: Path) -> None:
    """Writes on SQLite have a connection of their own: with every pooled reader connection taken, a write
    still completes (it used to queue for a pooled connection while holding the store's write lock)."""
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}", watchdog=False, pool_size=1)
    try:
        async with store.engine.connect() as held:  # the readers' only connection
            await held.execute(sa.text("SELECT 1"))
            update = await asyncio.wait_for(store.add_resources({"policy": LLM(endpoint="http://x/v1", model="m")}), 5)
        assert (await store.get_latest_resources()) == update
    finally:
        await store.close()


@one_trip
async def test_the_writer_and_the_short_reads_take_no_trip_to_a_thread(tmp_path: Path) -> None:
    """The store's writer runs its statements, commit included, on the event loop's thread, and so do its reads
    (the proxy's resources per call, a claim's): nothing goes to a connection's thread while no lock is taken and
    no read runs long."""
    store = await open_store(f"sqlite:///{tmp_path / 'store.db'}", watchdog=False)
    try:
        written, read = await trips(store.writer), await trips(store.engine)
        update = await store.add_resources({"policy": LLM(endpoint="http://x/v1", model="m")})
        await store.enqueue_many_rollouts([{"input": {"i": 1}}])  # type: ignore[list-item]
        [claim] = await store.claim_rollouts(limit=1, worker_id="w")
        assert await store.get_attempt_resources(claim.rollout.rollout_id, claim.rollout.attempt.attempt_id) == update
        assert written == [] and read == []
    finally:
        await store.close()


@one_trip
async def test_a_writer_waits_for_another_process_lock_without_stalling_the_event_loop(tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock, a write waits for it on its connection's thread (as
    long as the busy timeout), and the event loop goes on serving everything else meanwhile; once the lock is
    released the write completes."""
    path = tmp_path / "store.db"
    store = await open_store(f"sqlite:///{path}", watchdog=False)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        sent = await trips(store.writer)
        other.execute("BEGIN IMMEDIATE")
        write = asyncio.ensure_future(store.enqueue_many_rollouts([{"input": {"i": 1}}]))  # type: ignore[list-item]
        await asyncio.sleep(0)  # the write starts, and finds the lock taken
        started = asyncio.get_running_loop().time()
        for _ in range(20):
            await asyncio.sleep(0.01)
        # Had the write waited on the loop's thread, the loop would have stood still for its busy timeout (30 s).
        assert asyncio.get_running_loop().time() - started < 5
        assert not write.done()
        assert (await store.query_rollouts()).items == []  # a read is served meanwhile
        other.execute("COMMIT")
        enqueued = await asyncio.wait_for(write, 10)
        assert [r.rollout_id for r in (await store.query_rollouts()).items] == [enqueued[0].rollout_id]
        assert sent == ["_on_own_thread"]
        await store.enqueue_many_rollouts([{"input": {"i": 2}}])  # type: ignore[list-item]
        assert sent == ["_on_own_thread"]  # the lock is free again: no trip
    finally:
        other.close()
        await store.close()


@one_trip
async def test_a_long_select_moves_to_its_thread_and_a_long_write_does_not(tmp_path: Path) -> None:
    """An inline ``SELECT`` that runs past its budget of SQLite steps is interrupted and run again on its
    connection's thread, with the same answer and its transaction intact; a write is never interrupted (SQLite
    would roll its transaction back), however long it runs."""
    engine = make_engine(f"sqlite:///{tmp_path / 'budget.db'}", pool_size=1, inline=True, budget=1_000)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"))
        sent = await trips(engine)
        async with engine.begin() as conn:  # a write transaction whose statements each run past the budget
            numbers = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000)"
            await conn.execute(sa.text(f"INSERT INTO items (name) {numbers} SELECT 'n' || i FROM n"))
            await conn.execute(sa.text("UPDATE items SET name = name || '!'"))
        assert sent == []
        async with engine.connect() as conn, conn.begin():
            assert (await conn.execute(sa.text("SELECT count(*) FROM items WHERE id = 1"))).scalar() == 1
            assert sent == []  # short: inline
            total = (await conn.execute(sa.text("SELECT count(*), min(name) FROM items WHERE name LIKE '%!'"))).one()
            assert tuple(total) == (5000, "n1!")
            assert sent == ["_on_own_thread"]
            assert (await conn.execute(sa.text("SELECT count(*) FROM items WHERE id = 2"))).scalar() == 1
        assert sent == ["_on_own_thread"]  # the transaction went on inline, and ended without a trip
    finally:
        await engine.dispose()


def test_a_frozen_startup_heap_still_collects_what_is_made_later() -> None:
    """``aio.freeze_startup_heap`` in a process of its own (freezing is for good): what existed is exempt from
    collection, a reference cycle made afterwards is still collected."""
    program = """
import gc, weakref
from lightning_store import aio
class Node: pass
aio.freeze_startup_heap()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
a, b = Node(), Node()
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
gc.collect()
assert alive() is None
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_server_collects_young_cycles_less_often_but_still_collects_them() -> None:
    """``aio.collect_requests_young`` (``store serve``): the young generation is collected every
    ``SERVER_YOUNG_GENERATION`` allocations, the older ones as before, and a cycle is still freed without an
    explicit ``gc.collect`` once that many objects have been made."""
    program = """
import gc, weakref
from lightning_store import aio
older = gc.get_threshold()[1:]
aio.collect_requests_young()
assert gc.get_threshold() == (aio.SERVER_YOUNG_GENERATION, *older), gc.get_threshold()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
alive = weakref.ref(a)
del a, b
kept = [[] for _ in range(aio.SERVER_YOUNG_GENERATION // 10)]
assert alive() is not None  # fewer allocations than the threshold: not yet collected
kept += [[] for _ in range(aio.SERVER_YOUNG_GENERATION)]
assert alive() is None
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
