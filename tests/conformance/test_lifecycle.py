"""The retry policy, heartbeats and the watchdog, end to end through the store."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from lightning_store import AttemptEnd, ConflictError, InvalidRequestError, NotFoundError, RolloutConfig
from lightning_store.contract import LightningStore
from lightning_store.models import Attempt, AttemptStatus
from lightning_store.spans import Span
from tests.conftest import StoreFactory


def span_for(rollout_id: str, attempt_id: str, span_id: str = "s1", sequence_id: int = 1) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="t" * 32,
        span_id=span_id,
        name="work",
    )


@pytest.mark.parametrize("status", ["failed", "timeout", "unresponsive"])
async def test_retryable_status_requeues_until_attempts_run_out(store: LightningStore, status: AttemptStatus) -> None:
    config = RolloutConfig(max_attempts=2, retry_condition=[status])
    rollout = await store.enqueue_rollout(1, config=config)
    first = await store.dequeue_rollout()
    assert first is not None
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status=status)
    requeued = await store.get_rollout_by_id(rollout.rollout_id)
    assert requeued is not None and requeued.status == "requeuing" and requeued.end_time is None
    second = await store.dequeue_rollout()
    assert second is not None and second.rollout_id == rollout.rollout_id and second.attempt.sequence_id == 2
    await store.update_attempt(rollout.rollout_id, second.attempt.attempt_id, status=status)
    final = await store.get_rollout_by_id(rollout.rollout_id)
    assert final is not None and final.status == "failed" and final.end_time is not None
    assert await store.dequeue_rollout() is None


@pytest.mark.parametrize("status", ["failed", "timeout", "unresponsive"])
async def test_status_outside_retry_condition_fails_the_rollout(store: LightningStore, status: AttemptStatus) -> None:
    retryable: tuple[AttemptStatus, ...] = ("failed", "timeout", "unresponsive")
    others = [s for s in retryable if s != status]
    rollout = await store.enqueue_rollout(1, config=RolloutConfig(max_attempts=5, retry_condition=others))
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status=status)
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "failed"


@pytest.mark.parametrize("status", ["preparing", "running", "succeeded"])
async def test_other_statuses_carry_over_to_the_rollout(store: LightningStore, status: AttemptStatus) -> None:
    started = await store.start_rollout(1)
    attempt = await store.update_attempt(started.rollout_id, "latest", status=status)
    rollout = await store.get_rollout_by_id(started.rollout_id)
    assert rollout is not None and rollout.status == status
    assert (attempt.end_time is not None) == (status == "succeeded")
    assert (rollout.end_time is not None) == (status == "succeeded")


async def test_only_the_latest_attempt_decides(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1, config=RolloutConfig(max_attempts=3, retry_condition=["failed"]))
    first = await store.dequeue_rollout()
    assert first is not None
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="failed")
    second = await store.dequeue_rollout()
    assert second is not None
    await store.update_attempt(rollout.rollout_id, second.attempt.attempt_id, status="succeeded")
    # A late report from the superseded attempt changes that attempt only.
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="failed")
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "succeeded"


@pytest.mark.parametrize("status", ["running", "succeeded", "failed", "timeout"])
async def test_a_cancelled_rollout_stays_cancelled_whatever_its_attempt_becomes(
    store: LightningStore, status: AttemptStatus
) -> None:
    rollout = await store.enqueue_rollout(1, config=RolloutConfig(max_attempts=3, retry_condition=["failed"]))
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.update_rollout(rollout.rollout_id, status="cancelled")
    attempt: Attempt | None
    if status == "running":
        attempt = await store.update_attempt(rollout.rollout_id, "latest", status=status)
    else:
        end = AttemptEnd(rollout_id=rollout.rollout_id, attempt_id="latest", status=status)
        [attempt] = await store.end_attempts([end])
    assert attempt is not None and attempt.status == status  # the attempt ends as its runner says
    await store.add_span(span_for(rollout.rollout_id, claimed.attempt.attempt_id))
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "cancelled" and stored.end_time is not None
    assert await store.dequeue_rollout() is None  # a failed attempt did not put it back in the queue


async def test_a_cancelled_rollout_runs_again_once_requeued(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)
    await store.update_rollout(rollout.rollout_id, status="cancelled")
    assert await store.dequeue_rollout() is None
    await store.update_rollout(rollout.rollout_id, status="requeuing")
    claimed = await store.dequeue_rollout()
    assert claimed is not None and claimed.rollout_id == rollout.rollout_id and claimed.attempt.sequence_id == 1
    await store.update_attempt(rollout.rollout_id, "latest", status="succeeded")
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "succeeded"


async def test_a_span_is_a_heartbeat(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    before = time.time()
    await store.add_span(span_for(rollout.rollout_id, claimed.attempt.attempt_id))
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert attempt is not None and attempt.status == "running"
    assert attempt.last_heartbeat_time is not None and attempt.last_heartbeat_time >= before
    assert stored is not None and stored.status == "running"


async def test_a_span_revives_an_unresponsive_attempt(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=2, retry_condition=["unresponsive"])
    rollout = await store.enqueue_rollout(1, config=config)
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="unresponsive")
    await store.add_span(span_for(rollout.rollout_id, claimed.attempt.attempt_id))
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert attempt is not None and attempt.status == "running"
    # The rollout left the queue: the attempt came back before anyone claimed the retry.
    assert stored is not None and stored.status == "running"
    assert await store.dequeue_rollout() is None


async def test_a_span_does_not_revive_a_finished_rollout(store: LightningStore) -> None:
    started = await store.start_rollout(1)
    await store.update_attempt(started.rollout_id, "latest", status="succeeded")
    await store.add_span(span_for(started.rollout_id, started.attempt.attempt_id))
    stored = await store.get_rollout_by_id(started.rollout_id)
    attempt = await store.get_latest_attempt(started.rollout_id)
    assert stored is not None and stored.status == "succeeded"
    assert attempt is not None and attempt.status == "succeeded"


async def latest_status_once_not(store: LightningStore, rollout_id: str, status: str, *, within: float = 30) -> str:
    """The rollout's latest attempt's status once it is no longer ``status`` (or, after ``within`` s, as it is).
    Why poll: the watchdog acts within its interval of a limit passing on an idle machine, and seconds later on
    a loaded one; the contract is the outcome, not the moment."""
    deadline = time.monotonic() + within
    while True:
        attempt = await store.get_latest_attempt(rollout_id)
        assert attempt is not None
        if attempt.status != status or time.monotonic() > deadline:
            return attempt.status
        await asyncio.sleep(0.05)


async def test_watchdog_times_out_and_requeues_without_any_call(store_factory: StoreFactory) -> None:
    store = await store_factory(watchdog_interval=0.05)
    config = RolloutConfig(timeout_seconds=0.2, max_attempts=2, retry_condition=["timeout"])
    rollout = await store.enqueue_rollout(1, config=config)
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None
    await store.add_span(span_for(rollout.rollout_id, claimed.attempt.attempt_id))
    assert await latest_status_once_not(store, rollout.rollout_id, "running") == "timeout"
    attempt = (await store.query_attempts(rollout.rollout_id))[0]
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert attempt.status == "timeout" and attempt.end_time is not None
    assert attempt.end_time - attempt.start_time >= 0.2  # not before its limit
    assert stored is not None and stored.status == "requeuing"
    worker = await store.get_worker_by_id("w1")
    assert worker is not None and worker.status == "unknown"


async def test_watchdog_marks_silent_attempts_unresponsive(store_factory: StoreFactory) -> None:
    store = await store_factory(watchdog_interval=0.05)
    rollout = await store.enqueue_rollout(1, config=RolloutConfig(unresponsive_seconds=0.2))
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    assert await latest_status_once_not(store, rollout.rollout_id, "preparing") == "unresponsive"
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert attempt is not None and attempt.status == "unresponsive" and attempt.end_time is None
    assert stored is not None and stored.status == "failed"


async def test_heartbeats_keep_an_attempt_responsive(store: LightningStore) -> None:
    # A scan right after a heartbeat finds the attempt alive, however slow the machine, as long as a heartbeat and
    # the scan after it take less than the limit (1 s); the scan after a silence longer than it finds it silent.
    rollout = await store.enqueue_rollout(1, config=RolloutConfig(unresponsive_seconds=1.0))
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    for i in range(4):
        await asyncio.sleep(0.3)
        await store.add_span(span_for(rollout.rollout_id, claimed.attempt.attempt_id, f"s{i}", i + 1))
        assert await store.scan_unhealthy() == 0
    await asyncio.sleep(1.1)
    assert await store.scan_unhealthy() == 1
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "unresponsive"
    # Already unresponsive: a second scan leaves it be.
    assert await store.scan_unhealthy() == 0


async def test_watchdog_ignores_rollouts_without_limits(store: LightningStore) -> None:
    await store.enqueue_rollout(1)
    assert await store.dequeue_rollout() is not None
    await asyncio.sleep(0.05)
    assert await store.scan_unhealthy() == 0


async def test_only_one_of_several_stores_scans_at_a_time(store_factory: StoreFactory) -> None:
    stores = [await store_factory() for _ in range(3)]
    rollouts = [await stores[0].enqueue_rollout(i, config=RolloutConfig(timeout_seconds=0.05)) for i in range(5)]
    for _ in rollouts:
        assert await stores[0].dequeue_rollout() is not None
    await asyncio.sleep(0.1)
    marked = await asyncio.gather(*(s.scan_unhealthy() for s in stores))
    assert sum(marked) == 5
    attempts = [await stores[0].get_latest_attempt(r.rollout_id) for r in rollouts]
    assert all(a is not None and a.status == "timeout" for a in attempts)


@pytest.mark.parametrize("status", ["preparing", "running", "unresponsive"])
async def test_conditional_update_applies_to_the_current_attempt(store: LightningStore, status: AttemptStatus) -> None:
    rollout = await store.enqueue_rollout(1)
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    attempt_id = claimed.attempt.attempt_id
    await store.update_attempt(rollout.rollout_id, attempt_id, status=status)
    updated = await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded", if_current=True)
    assert updated.status == "succeeded"
    final = await store.get_rollout_by_id(rollout.rollout_id)
    assert final is not None and final.status == "succeeded"


@pytest.mark.parametrize("status", ["succeeded", "failed", "timeout"])
async def test_conditional_update_of_an_ended_attempt_conflicts(store: LightningStore, status: AttemptStatus) -> None:
    rollout = await store.enqueue_rollout(1)
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    attempt_id = claimed.attempt.attempt_id
    await store.update_attempt(rollout.rollout_id, attempt_id, status=status)
    with pytest.raises(ConflictError) as raised:
        await store.update_attempt(
            rollout.rollout_id, attempt_id, status="succeeded", metadata={"late": True}, if_current=True
        )
    assert raised.value.field == "status"
    attempt = await store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == status and attempt.metadata != {"late": True}


async def test_conditional_update_of_a_superseded_attempt_conflicts(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=2, retry_condition=["unresponsive"])
    rollout = await store.enqueue_rollout(1, config=config)
    first = await store.dequeue_rollout()
    assert first is not None
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="unresponsive")
    second = await store.dequeue_rollout()
    assert second is not None and second.attempt.sequence_id == 2
    # The first attempt is still "unresponsive" (not ended), but it is no longer the latest.
    with pytest.raises(ConflictError) as raised:
        await store.update_attempt(
            rollout.rollout_id, first.attempt.attempt_id, last_heartbeat_time=time.time(), if_current=True
        )
    assert raised.value.field == "attempt_id"
    attempts = (await store.query_attempts(rollout.rollout_id)).items
    assert [a.status for a in attempts] == ["unresponsive", "preparing"]
    assert attempts[0].last_heartbeat_time == first.attempt.last_heartbeat_time


async def test_ending_attempts_together_applies_each_as_a_conditional_update(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=2, retry_condition=["failed"])
    for i in range(4):
        await store.enqueue_rollout(i, config=config)
    claimed = await store.dequeue_many_rollouts(limit=4)
    done, retried, late, released = claimed
    await store.update_attempt(late.rollout_id, late.attempt.attempt_id, status="timeout")  # the watchdog was first

    ended = await store.end_attempts(
        [
            AttemptEnd(rollout_id=done.rollout_id, attempt_id=done.attempt.attempt_id, status="succeeded"),
            AttemptEnd(rollout_id=retried.rollout_id, attempt_id=retried.attempt.attempt_id, status="failed"),
            AttemptEnd(rollout_id=late.rollout_id, attempt_id=late.attempt.attempt_id, status="succeeded"),
            AttemptEnd(
                rollout_id=released.rollout_id,
                attempt_id=released.attempt.attempt_id,
                status="failed",
                metadata={"released": "worker stopped"},
            ),
        ]
    )

    assert [a.status if a else None for a in ended] == ["succeeded", "failed", None, "failed"]
    assert ended[3] is not None and ended[3].metadata == {"released": "worker stopped"}
    statuses = {r.rollout_id: r.status for r in await store.wait_for_rollouts(rollout_ids=[done.rollout_id], timeout=0)}
    assert statuses == {done.rollout_id: "succeeded"}
    rollouts = {r.rollout_id: r for r in (await store.query_rollouts()).items}
    assert rollouts[retried.rollout_id].status == "requeuing"  # the retry policy decided, as for one update
    late_attempt = await store.get_latest_attempt(late.rollout_id)
    assert late_attempt is not None and late_attempt.status == "timeout" and late_attempt.metadata is None
    assert await store.end_attempts([]) == []


async def test_a_released_attempt_requeues_its_rollout_whatever_the_policy_and_in_one_step(
    store: LightningStore,
) -> None:
    """``requeue``: the runner gave the attempt back (not the agent's fault). The rollout goes straight back to the
    queue, even with no retries left, and never through ``failed``, where a waiter would take it as finished; a
    cancelled rollout stays cancelled; an attempt that is no longer current is left as the store decided."""
    for i in range(3):
        await store.enqueue_rollout(i)  # no retries
    released, cancelled, late = await store.dequeue_many_rollouts(limit=3, worker_id="w1")
    await store.update_rollout(cancelled.rollout_id, status="cancelled")
    await store.update_attempt(late.rollout_id, late.attempt.attempt_id, status="timeout")  # the watchdog was first
    waiting = asyncio.ensure_future(store.wait_for_rollouts(rollout_ids=[released.rollout_id], timeout=1.0))
    await asyncio.sleep(0.2)  # the waiter is waiting

    ended = await store.end_attempts(
        [
            AttemptEnd(
                rollout_id=r.rollout_id,
                attempt_id=r.attempt.attempt_id,
                status="failed",
                metadata={"released": "worker stopped"},
                requeue=True,
            )
            for r in (released, cancelled, late)
        ]
    )

    assert [(a.status, a.metadata) if a else None for a in ended] == [
        ("failed", {"released": "worker stopped"}),
        ("failed", {"released": "worker stopped"}),
        None,
    ]
    assert await waiting == []  # it never finished
    rollouts = {r.rollout_id: r for r in (await store.query_rollouts()).items}
    assert rollouts[released.rollout_id].status == "requeuing" and rollouts[released.rollout_id].end_time is None
    assert rollouts[cancelled.rollout_id].status == "cancelled"
    assert rollouts[late.rollout_id].status == "failed"
    again = await store.dequeue_rollout(worker_id="w2")
    assert again is not None and again.rollout_id == released.rollout_id and again.attempt.sequence_id == 2
    workers = {w.worker_id: w for w in (await store.query_workers()).items}
    assert workers["w1"].status == "idle"


async def test_entries_of_one_batch_see_the_ones_before_them(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=3, retry_condition=["failed"])
    await store.enqueue_rollout("twice", config=config)
    await store.enqueue_rollout("superseded", config=config)
    twice, superseded = await store.dequeue_many_rollouts(limit=2, worker_id="w1")
    await store.update_attempt(superseded.rollout_id, superseded.attempt.attempt_id, status="failed")  # requeued
    newer = await store.dequeue_rollout(worker_id="w2")
    assert newer is not None and newer.rollout_id == superseded.rollout_id

    ended = await store.end_attempts(
        [
            AttemptEnd(rollout_id=twice.rollout_id, attempt_id=twice.attempt.attempt_id, status="failed"),
            AttemptEnd(rollout_id=twice.rollout_id, attempt_id=twice.attempt.attempt_id, status="succeeded"),
            AttemptEnd(rollout_id=newer.rollout_id, attempt_id=superseded.attempt.attempt_id, status="succeeded"),
            AttemptEnd(rollout_id=newer.rollout_id, attempt_id="latest", status="succeeded", metadata={"n": 2}),
        ]
    )

    assert [a.status if a else None for a in ended] == ["failed", None, None, "succeeded"]
    assert ended[3] is not None and ended[3].attempt_id == newer.attempt.attempt_id and ended[3].metadata == {"n": 2}
    rollouts = {r.rollout_id: r.status for r in (await store.query_rollouts()).items}
    assert rollouts == {twice.rollout_id: "requeuing", newer.rollout_id: "succeeded"}
    attempts = (await store.query_attempts(newer.rollout_id)).items
    assert [(a.status, a.metadata) for a in attempts] == [("failed", None), ("succeeded", {"n": 2})]
    workers = {w.worker_id: w for w in (await store.query_workers()).items}
    assert workers["w1"].status == workers["w2"].status == "idle"
    assert workers["w2"].current_attempt_id is None


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"status": "running"}, "ends.1.status"),
        ({"status": "succeeded", "attempt_id": ""}, "ends.1.attempt_id"),
        ({"status": "succeeded", "extra": 1}, "ends.1.extra"),
        ({"status": "succeeded", "attempt_id": "at-missing"}, "ends.1.attempt_id"),
        ({"status": "succeeded", "rollout_id": "ro-missing"}, "ends.1.rollout_id"),
    ],
)
async def test_a_bad_entry_refuses_the_whole_batch_naming_it(
    store: LightningStore, entry: dict[str, object], field: str
) -> None:
    for i in range(2):
        await store.enqueue_rollout(i)
    first, second = await store.dequeue_many_rollouts(limit=2)
    good = {"rollout_id": first.rollout_id, "attempt_id": first.attempt.attempt_id, "status": "succeeded"}
    bad = {"rollout_id": second.rollout_id, "attempt_id": second.attempt.attempt_id, **entry}

    with pytest.raises((InvalidRequestError, NotFoundError)) as raised:
        await store.end_attempts([good, bad])  # type: ignore[list-item]

    assert raised.value.field == field
    for claimed in (first, second):  # nothing written, not even the good entry
        attempt = await store.get_latest_attempt(claimed.rollout_id)
        assert attempt is not None and attempt.status == "preparing"


async def test_an_end_carries_its_attempts_last_spans_into_the_same_transaction(store: LightningStore) -> None:
    for i in range(3):
        await store.enqueue_rollout(i)
    first, second, late = await store.dequeue_many_rollouts(limit=3)
    await store.add_many_spans(
        [span_for(first.rollout_id, first.attempt.attempt_id, "s0", 0)], allocate_sequence_ids=True
    )
    await store.update_attempt(late.rollout_id, late.attempt.attempt_id, status="timeout")  # the watchdog was first

    carried = [span_for(first.rollout_id, first.attempt.attempt_id, f"s{n}", 0) for n in (1, 2)]
    ended = await store.end_attempts(
        [
            AttemptEnd(
                rollout_id=first.rollout_id, attempt_id=first.attempt.attempt_id, status="succeeded", spans=carried
            ),
            AttemptEnd(rollout_id=second.rollout_id, attempt_id=second.attempt.attempt_id, status="failed", spans=[]),
            AttemptEnd(
                rollout_id=late.rollout_id,
                attempt_id=late.attempt.attempt_id,
                status="succeeded",
                spans=[span_for(late.rollout_id, late.attempt.attempt_id, "late", 0)],
            ),
        ]
    )

    assert [a.status if a else None for a in ended] == ["succeeded", "failed", None]
    spans = (await store.query_spans(first.rollout_id)).items
    assert [(s.span_id, s.sequence_id) for s in spans] == [("s0", 1), ("s1", 2), ("s2", 3)]  # counter continued
    late_spans = (await store.query_spans(late.rollout_id)).items
    assert [(s.span_id, s.sequence_id) for s in late_spans] == [("late", 1)]  # kept although the end was not
    late_attempt = await store.get_latest_attempt(late.rollout_id)
    assert late_attempt is not None and late_attempt.status == "timeout"  # carried spans are no heartbeat
    assert (await store.query_spans(second.rollout_id)).items == []


@pytest.mark.parametrize(
    ("spans", "attempt", "field"),
    [
        ("other-attempt", None, "ends.1.spans.0.attempt_id"),
        ("other-rollout", None, "ends.1.spans.0.rollout_id"),
        ("no-name", None, "ends.1.spans.0.name"),
        ("own", "latest", "ends.1.spans"),
    ],
)
async def test_a_bad_span_in_an_end_refuses_the_whole_batch_naming_it(
    store: LightningStore, spans: str, attempt: str | None, field: str
) -> None:
    for i in range(2):
        await store.enqueue_rollout(i)
    first, second = await store.dequeue_many_rollouts(limit=2)
    own = span_for(second.rollout_id, second.attempt.attempt_id, "s1", 0).model_dump(mode="json")
    span = {
        "other-attempt": {**own, "attempt_id": first.attempt.attempt_id},
        "other-rollout": {**own, "rollout_id": first.rollout_id},
        "no-name": {k: v for k, v in own.items() if k != "name"},
        "own": own,
    }[spans]
    good = {"rollout_id": first.rollout_id, "attempt_id": first.attempt.attempt_id, "status": "succeeded"}
    bad: dict[str, Any] = {"rollout_id": second.rollout_id, "attempt_id": attempt or second.attempt.attempt_id}
    bad |= {"status": "succeeded", "spans": [span]}

    with pytest.raises(InvalidRequestError) as raised:
        await store.end_attempts([good, bad])  # type: ignore[list-item]

    assert raised.value.field == field
    for claimed in (first, second):  # nothing written: no status, no span
        attempt_now = await store.get_latest_attempt(claimed.rollout_id)
        assert attempt_now is not None and attempt_now.status == "preparing"
        assert (await store.query_spans(claimed.rollout_id)).items == []
