"""Rollout CRUD, queue order, idempotent enqueue, updates, queries and their errors."""

from __future__ import annotations

import pytest

from lightning_store import EnqueueRolloutRequest, InvalidRequestError, NotFoundError, RolloutConfig
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout


async def test_enqueue_stores_every_field(store: LightningStore) -> None:
    config = RolloutConfig(max_attempts=3, retry_condition=["failed"], timeout_seconds=10)
    rollout = await store.enqueue_rollout(
        {"q": "2+2", "nested": [1, {"a": None}]}, mode="train", config=config, metadata={"task": "t1"}
    )
    assert rollout.rollout_id.startswith("ro-")
    assert rollout.status == "queuing"
    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored == rollout
    assert stored is not None and stored.config == config and stored.input == {"q": "2+2", "nested": [1, {"a": None}]}


async def test_rollouts_read_back_as_written_with_their_latest_attempt(store: LightningStore) -> None:
    """Reads of rollouts (by id, a page) give back every field as the writes returned them: JSON null and absent
    metadata, a config that is not the default, and the latest attempt with its own metadata."""
    config = RolloutConfig(max_attempts=2, retry_condition=["failed", "timeout"], unresponsive_seconds=2.5)
    bare = await store.enqueue_rollout(None)
    full = await store.enqueue_rollout(
        {"deep": [1.5, {"é": None}], "big": 2**53 + 1}, mode="val", config=config, metadata={"k": [True, None]}
    )
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None and claimed.rollout_id == bare.rollout_id
    attempt = await store.update_attempt(
        bare.rollout_id, claimed.attempt.attempt_id, last_heartbeat_time=12.25, metadata={"note": "x"}
    )
    expected = {
        bare.rollout_id: AttemptedRollout(**{**bare.model_dump(), "status": claimed.status, "attempt": attempt}),
        full.rollout_id: full,
    }
    page = await store.query_rollouts(sort_by="start_time", sort_order="desc", limit=2)
    assert {r.rollout_id: r for r in page} == expected and page.total == 2
    assert [type(r) for r in page] == [type(expected[r.rollout_id]) for r in page]
    for rollout_id, rollout in expected.items():
        assert await store.get_rollout_by_id(rollout_id) == rollout


async def test_get_unknown_rollout_is_none(store: LightningStore) -> None:
    assert await store.get_rollout_by_id("ro-missing") is None


async def test_dequeue_is_fifo(store: LightningStore) -> None:
    ids = [(await store.enqueue_rollout(i)).rollout_id for i in range(5)]
    claimed = [await store.dequeue_rollout() for _ in range(5)]
    assert [c.rollout_id for c in claimed if c] == ids


async def test_dequeue_many_claims_in_order_and_respects_limit(store: LightningStore) -> None:
    ids = [r.rollout_id for r in await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=i) for i in range(5)])]
    first = await store.dequeue_many_rollouts(limit=3, worker_id="w")
    rest = await store.dequeue_many_rollouts(limit=10)
    assert [r.rollout_id for r in first] == ids[:3]
    assert [r.rollout_id for r in rest] == ids[3:]
    assert await store.dequeue_many_rollouts(limit=0) == []


async def test_enqueue_many_returns_in_input_order(store: LightningStore) -> None:
    rollouts = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=i, mode="val", metadata={"i": i}) for i in range(20)]
    )
    assert [r.input for r in rollouts] == list(range(20))
    assert all(r.mode == "val" for r in rollouts)


async def test_enqueue_with_rollout_id_is_idempotent(store: LightningStore) -> None:
    first = await store.enqueue_rollout({"a": 1}, rollout_id="task-1")
    again = await store.enqueue_rollout({"a": 2}, rollout_id="task-1", mode="test")
    assert again == first
    assert (await store.query_rollouts()).total == 1
    claimed = await store.dequeue_rollout()
    assert claimed is not None and claimed.rollout_id == "task-1"
    # A repeat after the claim does not requeue it either.
    await store.enqueue_rollout({"a": 1}, rollout_id="task-1")
    assert await store.dequeue_rollout() is None


async def test_enqueue_many_with_duplicate_ids_in_one_batch(store: LightningStore) -> None:
    result = await store.enqueue_many_rollouts(
        [EnqueueRolloutRequest(input=1, rollout_id="x"), EnqueueRolloutRequest(input=2, rollout_id="x")]
    )
    assert [r.input for r in result] == [1, 1]
    assert (await store.query_rollouts()).total == 1


async def test_invalid_enqueue_writes_nothing(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError) as error:
        await store.enqueue_many_rollouts(
            [EnqueueRolloutRequest(input=1), {"input": 2, "mode": "bogus"}]  # type: ignore[list-item]
        )
    assert error.value.field == "rollouts.1.mode"
    with pytest.raises(InvalidRequestError) as error:
        await store.enqueue_rollout(1, config={"max_attempts": 0})  # type: ignore[arg-type]
    assert error.value.field == "config.max_attempts"
    assert (await store.query_rollouts()).total == 0


async def test_start_rollout_creates_first_attempt(store: LightningStore) -> None:
    started = await store.start_rollout({"x": 1}, mode="test", worker_id="w1")
    assert isinstance(started, AttemptedRollout)
    assert started.status == "preparing"
    assert started.attempt.sequence_id == 1 and started.attempt.status == "preparing"
    assert started.attempt.worker_id == "w1"
    # It never visits the queue.
    assert await store.dequeue_rollout() is None
    latest = await store.get_latest_attempt(started.rollout_id)
    assert latest == started.attempt


async def test_start_attempt_adds_the_next_attempt(store: LightningStore) -> None:
    started = await store.start_rollout(1)
    second = await store.start_attempt(started.rollout_id, worker_id="w2")
    assert second.attempt.sequence_id == 2
    attempts = await store.query_attempts(started.rollout_id)
    assert [a.sequence_id for a in attempts] == [1, 2]
    with pytest.raises(NotFoundError):
        await store.start_attempt("ro-missing")


async def test_query_rollouts_returns_latest_attempts(store: LightningStore) -> None:
    queued = await store.enqueue_rollout(1)
    started = await store.start_rollout(2)
    result = await store.query_rollouts()
    by_id = {r.rollout_id: r for r in result}
    assert not isinstance(by_id[queued.rollout_id], AttemptedRollout)
    attempted = by_id[started.rollout_id]
    assert isinstance(attempted, AttemptedRollout) and attempted.attempt == started.attempt


async def test_query_rollouts_filters(store: LightningStore) -> None:
    a = await store.enqueue_rollout(1, mode="train", metadata={"task": "a", "n": 1, "ok": True})
    b = await store.enqueue_rollout(2, mode="val", metadata={"task": "b", "n": 2, "ok": False})
    c = await store.start_rollout(3, mode="train", metadata={"task": "c", "tags": ["x"]})

    async def ids(**kwargs: object) -> set[str]:
        return {r.rollout_id for r in await store.query_rollouts(**kwargs)}  # type: ignore[arg-type]

    assert await ids(status_in=["queuing"]) == {a.rollout_id, b.rollout_id}
    assert await ids(status=["preparing"]) == {c.rollout_id}
    assert await ids(rollout_id_in=[a.rollout_id, "nope"]) == {a.rollout_id}
    assert await ids(rollout_id_contains=c.rollout_id[3:9]) == {c.rollout_id}
    assert await ids(status_in=["preparing"], rollout_id_in=[a.rollout_id], filter_logic="or") == {
        a.rollout_id,
        c.rollout_id,
    }
    assert await ids(mode_in=["train"]) == {a.rollout_id, c.rollout_id}
    assert await ids(metadata_match={"task": "b"}) == {b.rollout_id}
    assert await ids(metadata_match={"n": 1, "ok": True}) == {a.rollout_id}
    assert await ids(metadata_match={"ok": False}) == {b.rollout_id}
    assert await ids(metadata_match={"tags": ["x"]}) == {c.rollout_id}
    assert await ids(start_time_from=c.start_time) == {c.rollout_id}
    assert await ids(start_time_to=a.start_time) == set()
    assert await ids(rollout_id_contains="%") == set()


async def test_query_rollouts_sorts_and_paginates(store: LightningStore) -> None:
    ids = [(await store.enqueue_rollout(i, rollout_id=f"r{i:02d}")).rollout_id for i in range(10)]
    page = await store.query_rollouts(sort_by="rollout_id", sort_order="desc", limit=3, offset=2)
    assert [r.rollout_id for r in page] == list(reversed(ids))[2:5]
    assert page.total == 10 and page.limit == 3 and page.offset == 2
    everything = await store.query_rollouts(limit=-1)
    assert [r.rollout_id for r in everything] == ids  # insertion order by default


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sort_by": "input"}, "sort_by"),
        ({"sort_order": "up"}, "sort_order"),
        ({"limit": -2}, "limit"),
        ({"offset": -1}, "offset"),
        ({"status_in": ["done"]}, "status_in.0"),
        ({"mode_in": ["prod"]}, "mode_in.0"),
        ({"filter_logic": "xor"}, "filter_logic"),
    ],
)
async def test_query_rollouts_rejects_bad_arguments(
    store: LightningStore, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequestError) as error:
        await store.query_rollouts(**kwargs)  # type: ignore[arg-type]
    assert error.value.field == field


async def test_update_rollout_replaces_given_fields_only(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1, mode="train", metadata={"a": 1})
    updated = await store.update_rollout(rollout.rollout_id, input={"new": True}, metadata=None)
    assert updated.input == {"new": True} and updated.metadata is None and updated.mode == "train"
    updated = await store.update_rollout(rollout.rollout_id, mode=None, config=RolloutConfig(max_attempts=2))
    assert updated.mode is None and updated.config.max_attempts == 2


async def test_update_rollout_terminal_status_stamps_end_time(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)
    cancelled = await store.update_rollout(rollout.rollout_id, status="cancelled")
    assert cancelled.status == "cancelled" and cancelled.end_time is not None
    assert await store.dequeue_rollout() is None


async def test_update_rollout_requeue_goes_to_the_tail(store: LightningStore) -> None:
    first = await store.enqueue_rollout(1)
    second = await store.enqueue_rollout(2)
    claimed = await store.dequeue_rollout()
    assert claimed is not None and claimed.rollout_id == first.rollout_id
    requeued = await store.update_rollout(first.rollout_id, status="requeuing")
    assert requeued.end_time is None
    order = [await store.dequeue_rollout() for _ in range(2)]
    assert [r.rollout_id for r in order if r] == [second.rollout_id, first.rollout_id]
    assert order[1] is not None and order[1].attempt.sequence_id == 2


async def test_update_rollout_errors_write_nothing(store: LightningStore) -> None:
    rollout = await store.enqueue_rollout(1)
    with pytest.raises(NotFoundError):
        await store.update_rollout("ro-missing", status="cancelled")
    with pytest.raises(InvalidRequestError) as error:
        await store.update_rollout(rollout.rollout_id, input=5, status="finished")  # type: ignore[arg-type]
    assert error.value.field == "status"
    with pytest.raises(InvalidRequestError):
        await store.update_rollout(rollout.rollout_id, mode="prod")  # type: ignore[arg-type]
    assert await store.get_rollout_by_id(rollout.rollout_id) == rollout


async def test_attempt_queries(store: LightningStore) -> None:
    started = await store.start_rollout(1)
    for _ in range(3):
        await store.start_attempt(started.rollout_id)
    attempts = await store.query_attempts(started.rollout_id, sort_order="desc", limit=2)
    assert [a.sequence_id for a in attempts] == [4, 3] and attempts.total == 4
    latest = await store.get_latest_attempt(started.rollout_id)
    assert latest is not None and latest.sequence_id == 4
    queued = await store.enqueue_rollout(2)
    assert await store.get_latest_attempt(queued.rollout_id) is None
    # Reads of an unknown rollout find nothing (as in Agent Lightning), they do not raise.
    missing = await store.query_attempts("ro-missing")
    assert (list(missing), missing.total) == ([], 0)
    assert await store.get_latest_attempt("ro-missing") is None


async def test_update_attempt_fields_and_errors(store: LightningStore) -> None:
    started = await store.start_rollout(1)
    attempt_id = started.attempt.attempt_id
    updated = await store.update_attempt(
        started.rollout_id, attempt_id, worker_id="w9", last_heartbeat_time=123.0, metadata={"k": "v"}
    )
    assert (updated.worker_id, updated.last_heartbeat_time, updated.metadata) == ("w9", 123.0, {"k": "v"})
    latest = await store.update_attempt(started.rollout_id, "latest", status="running")
    assert latest.attempt_id == attempt_id and latest.status == "running"
    with pytest.raises(NotFoundError) as error:
        await store.update_attempt(started.rollout_id, "at-missing", status="failed")
    assert error.value.field == "attempt_id"
    with pytest.raises(NotFoundError):
        await store.update_attempt("ro-missing", "latest", status="failed")
    queued = await store.enqueue_rollout(2)
    with pytest.raises(NotFoundError):
        await store.update_attempt(queued.rollout_id, "latest", status="failed")
    with pytest.raises(InvalidRequestError) as invalid:
        await store.update_attempt(started.rollout_id, attempt_id, status="done")  # type: ignore[arg-type]
    assert invalid.value.field == "status"
    other = await store.start_rollout(3)
    with pytest.raises(NotFoundError):
        await store.update_attempt(started.rollout_id, other.attempt.attempt_id, status="failed")
    assert (await store.get_latest_attempt(started.rollout_id)) == latest


async def test_statistics_counts(store: LightningStore) -> None:
    await store.enqueue_rollout(1)
    await store.start_rollout(2)
    stats = await store.statistics()
    assert stats["total_rollouts"] == 2 and stats["total_attempts"] == 1
    assert stats["rollouts_by_status"] == {"queuing": 1, "preparing": 1}
