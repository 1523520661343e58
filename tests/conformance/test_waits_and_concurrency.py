"""Blocking waits that wake on change, and concurrent claimers that never share a rollout."""

from __future__ import annotations

import asyncio
import time

import pytest

from lightning_store import EnqueueRolloutRequest
from lightning_store.contract import LightningStore
from tests.conftest import StoreFactory


async def test_wait_returns_at_once_for_finished_rollouts(store: LightningStore) -> None:
    started = await store.start_rollout(1)
    await store.update_attempt(started.rollout_id, "latest", status="succeeded")
    begin = time.monotonic()
    done = await store.wait_for_rollouts(rollout_ids=[started.rollout_id], timeout=10)
    assert [r.rollout_id for r in done] == [started.rollout_id]
    assert time.monotonic() - begin < 5


async def test_wait_times_out_with_the_finished_subset(store: LightningStore) -> None:
    finished = await store.start_rollout(1)
    await store.update_attempt(finished.rollout_id, "latest", status="failed")
    pending = await store.enqueue_rollout(2)
    begin = time.monotonic()
    done = await store.wait_for_rollouts(rollout_ids=[pending.rollout_id, finished.rollout_id], timeout=0.3)
    elapsed = time.monotonic() - begin
    assert [r.rollout_id for r in done] == [finished.rollout_id]
    assert 0.25 <= elapsed < 5
    assert await store.wait_for_rollouts(rollout_ids=[pending.rollout_id], timeout=0) == []


async def test_a_rollout_requeued_during_a_wait_is_waited_for_again(store: LightningStore) -> None:
    first, second = await store.start_rollout(1), await store.start_rollout(2)
    await store.update_attempt(first.rollout_id, "latest", status="succeeded")
    waiting = asyncio.ensure_future(
        # It runs to its timeout (``first`` never finishes again): long enough that a loaded machine still
        # finishes ``second`` within it, short enough to keep the test quick.
        store.wait_for_rollouts(rollout_ids=[first.rollout_id, second.rollout_id], timeout=3)
    )
    await asyncio.sleep(0.2)  # the wait has seen `first` finished
    await store.update_rollout(first.rollout_id, status="queuing")  # and now it is not
    await store.update_attempt(second.rollout_id, "latest", status="succeeded")
    done = await waiting
    assert [(r.rollout_id, r.status) for r in done] == [(second.rollout_id, "succeeded")]


async def test_wait_is_woken_by_completion_from_another_store(store_factory: StoreFactory) -> None:
    waiter, worker = await store_factory(), await store_factory()
    rollouts = [await waiter.enqueue_rollout(i) for i in range(3)]
    ids = [r.rollout_id for r in rollouts]

    async def finish_all() -> None:
        for _ in ids:
            claimed = await worker.dequeue_rollout()
            assert claimed is not None
            await asyncio.sleep(0.05)
            await worker.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    begin = time.monotonic()
    done, _ = await asyncio.gather(waiter.wait_for_rollouts(rollout_ids=ids, timeout=30), finish_all())
    assert sorted(r.rollout_id for r in done) == sorted(ids)
    assert all(r.status == "succeeded" for r in done)
    assert time.monotonic() - begin < 10


async def test_cancel_wakes_waiters(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)

    async def cancel_later() -> None:
        await asyncio.sleep(0.1)
        await store.update_rollout(rollout.rollout_id, status="cancelled")

    done, _ = await asyncio.gather(
        store.wait_for_rollouts(rollout_ids=[rollout.rollout_id], timeout=30), cancel_later()
    )
    assert [r.status for r in done] == ["cancelled"]


async def test_an_unknown_rollout_never_finishes(store: LightningStore) -> None:
    finished = await store.start_rollout(1)
    await store.update_attempt(finished.rollout_id, "latest", status="succeeded")
    begin = time.monotonic()
    done = await store.wait_for_rollouts(rollout_ids=["ro-missing", finished.rollout_id], timeout=0.3)
    assert [r.rollout_id for r in done] == [finished.rollout_id]
    assert time.monotonic() - begin >= 0.25


async def test_blocking_dequeue_times_out_empty(store: LightningStore) -> None:
    begin = time.monotonic()
    assert await store.dequeue_rollout(timeout=0.3) is None
    assert 0.25 <= time.monotonic() - begin < 5
    assert await store.dequeue_rollout() is None  # without a timeout it never waits


async def test_blocking_dequeue_is_woken_by_enqueue_in_another_store(store_factory: StoreFactory) -> None:
    consumer, producer = await store_factory(), await store_factory()

    async def enqueue_later() -> str:
        await asyncio.sleep(0.2)
        return (await producer.enqueue_rollout("late")).rollout_id

    begin = time.monotonic()
    claimed, rollout_id = await asyncio.gather(consumer.dequeue_rollout(worker_id="w", timeout=30), enqueue_later())
    assert claimed is not None and claimed.rollout_id == rollout_id
    assert time.monotonic() - begin < 10


async def test_blocking_dequeue_is_woken_by_requeue(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)
    assert await store.dequeue_rollout() is not None

    async def requeue_later() -> None:
        await asyncio.sleep(0.1)
        await store.update_rollout(rollout.rollout_id, status="requeuing")

    claimed, _ = await asyncio.gather(store.dequeue_rollout(timeout=30), requeue_later())
    assert claimed is not None and claimed.attempt.sequence_id == 2


@pytest.mark.slow
async def test_concurrent_dequeue_claims_each_rollout_exactly_once(store_factory: StoreFactory) -> None:
    # Four stores (standing for processes), four claiming tasks each: 16 concurrent dequeuers.
    stores = [await store_factory() for _ in range(4)]
    requests = [EnqueueRolloutRequest(input=i) for i in range(500)]
    enqueued = await stores[0].enqueue_many_rollouts(requests)

    async def drain(store: LightningStore, worker_id: str) -> list[tuple[str, str]]:
        claims: list[tuple[str, str]] = []
        while True:
            batch = await store.dequeue_many_rollouts(limit=3, worker_id=worker_id)
            if not batch:
                return claims
            claims.extend((r.rollout_id, r.attempt.attempt_id) for r in batch)

    results = await asyncio.gather(*(drain(stores[i % 4], f"w{i}") for i in range(16)))
    claimed = [rollout_id for claims in results for rollout_id, _ in claims]
    assert len(claimed) == 500
    assert sorted(claimed) == sorted(r.rollout_id for r in enqueued)
    # More than one claimer took part, and every rollout has exactly one attempt.
    assert sum(1 for claims in results if claims) > 1
    stats = await stores[0].statistics()
    assert stats["total_attempts"] == 500
    assert stats["rollouts_by_status"] == {"preparing": 500}


async def test_concurrent_enqueues_each_get_their_own_rollouts(store: LightningStore) -> None:
    # Concurrent calls may share a transaction (the SQL store coalesces them): each still gets its own answer, in
    # its own order, and a rollout id named by two concurrent calls is stored once and returned to both.
    def batch(call: int) -> list[EnqueueRolloutRequest]:
        return [EnqueueRolloutRequest(input={"call": call, "item": item}) for item in range(call % 3 + 1)]

    named = [EnqueueRolloutRequest(input={"named": call}, rollout_id="ro-named-twice") for call in range(2)]
    batches, twice, singles = await asyncio.gather(
        asyncio.gather(*(store.enqueue_many_rollouts(batch(call)) for call in range(24))),
        asyncio.gather(*(store.enqueue_many_rollouts([request]) for request in named)),
        asyncio.gather(*(store.enqueue_rollout({"single": call}) for call in range(8))),
    )
    for call, answer in enumerate(batches):
        assert [r.input for r in answer] == [{"call": call, "item": item} for item in range(call % 3 + 1)]
    assert [answer[0].rollout_id for answer in twice] == ["ro-named-twice"] * 2
    assert twice[0][0].input == twice[1][0].input in ({"named": 0}, {"named": 1})
    assert [r.input for r in singles] == [{"single": call} for call in range(8)]
    ids = [r.rollout_id for answer in batches for r in answer] + [r.rollout_id for r in singles]
    assert len(set(ids)) == len(ids) == sum(call % 3 + 1 for call in range(24)) + 8
    stats = await store.statistics()
    assert stats["rollouts_by_status"] == {"queuing": len(ids) + 1}


async def test_concurrent_claims_each_get_their_own_rollouts_under_their_own_worker(store: LightningStore) -> None:
    # Concurrent claims may share a transaction (the SQL store coalesces them): each takes at most its limit, its
    # attempts name its worker, no rollout goes to two, and a claim that finds the queue empty marks its worker idle.
    enqueued = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(20)])
    limits = [1, 3, 2, 5, 1, 4, 2, 6]  # 24 wanted, 20 queued
    claims = await asyncio.gather(
        *(store.dequeue_many_rollouts(limit=limit, worker_id=f"w{i}") for i, limit in enumerate(limits))
    )
    for i, (limit, claimed) in enumerate(zip(limits, claims, strict=True)):
        assert len(claimed) <= limit
        assert {r.attempt.worker_id for r in claimed} <= {f"w{i}"}
        assert all(r.status == "preparing" and r.attempt.status == "preparing" for r in claimed)
    taken = [r.rollout_id for claimed in claims for r in claimed]
    assert sorted(taken) == sorted(r.rollout_id for r in enqueued)
    for i, claimed in enumerate(claims):
        worker = await store.get_worker_by_id(f"w{i}")
        assert worker is not None
        if claimed:
            assert worker.status == "busy" and worker.current_rollout_id in {r.rollout_id for r in claimed}
    empty = await store.dequeue_many_rollouts(limit=2, worker_id="w-late")
    assert empty == []
    late = await store.get_worker_by_id("w-late")
    assert late is not None and late.status == "idle"


async def test_concurrent_enqueue_and_dequeue_lose_nothing(store_factory: StoreFactory) -> None:
    producer, consumer = await store_factory(), await store_factory()
    produced: list[str] = []
    consumed: list[str] = []

    async def produce() -> None:
        for i in range(50):
            produced.append((await producer.enqueue_rollout(i)).rollout_id)

    async def consume() -> None:
        while len(consumed) < 50:
            claimed = await consumer.dequeue_rollout(timeout=5)
            assert claimed is not None
            consumed.append(claimed.rollout_id)

    await asyncio.gather(produce(), consume(), return_exceptions=False)
    assert sorted(consumed) == sorted(produced)


async def test_wakeups_cross_stores_without_waiting_for_the_safety_poll(store_factory: StoreFactory) -> None:
    # With a 30 s safety re-check, only a real wake-up (NOTIFY on Postgres) can make these return quickly.
    consumer = await store_factory(postgres_poll_interval=30)
    producer = await store_factory(postgres_poll_interval=30)

    async def enqueue_then_finish() -> None:
        await asyncio.sleep(0.3)
        await producer.enqueue_rollout("x")

    begin = time.monotonic()
    claimed, _ = await asyncio.gather(consumer.dequeue_rollout(timeout=30), enqueue_then_finish())
    assert claimed is not None
    assert time.monotonic() - begin < 5

    async def finish_later() -> None:
        await asyncio.sleep(0.3)
        await producer.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

    begin = time.monotonic()
    done, _ = await asyncio.gather(
        consumer.wait_for_rollouts(rollout_ids=[claimed.rollout_id], timeout=30), finish_later()
    )
    assert [r.status for r in done] == ["succeeded"]
    assert time.monotonic() - begin < 5
