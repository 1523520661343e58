"""Versioned resources and worker bookkeeping, on every backend."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError, NotFoundError
from lightning_store.models import AttemptStatus, EnqueueRolloutRequest, WorkerStatus
from lightning_store.resources import LLM, NamedResources, PromptTemplate, ProxyLLM
from tests.conftest import StoreFactory


def llm(model: str = "qwen-7b") -> NamedResources:
    return {"main_llm": LLM(endpoint="http://llm:8000/v1", model=model, sampling_parameters={"temperature": 0.7})}


# Resources -----------------------------------------------------------------------------------------------


async def test_add_resources_round_trips_every_resource_type(store: LightningStore) -> None:
    resources: NamedResources = {
        "llm": LLM(endpoint="http://llm:8000/v1", model="qwen", api_key="k", sampling_parameters={"top_p": 0.9}),
        "proxy": ProxyLLM(endpoint="http://proxy:9000/v1", model="qwen"),
        "prompt": PromptTemplate(template="Answer {question}", engine="f-string"),
    }

    added = await store.add_resources(resources)

    assert added.version == 1
    assert added.create_time == added.update_time
    stored = await store.get_resources_by_id(added.resources_id)
    assert stored is not None
    assert stored == added
    assert stored.resources == resources
    assert isinstance(stored.resources["proxy"], ProxyLLM)


async def test_add_resources_accepts_plain_dicts(store: LightningStore) -> None:
    payload: Any = {"prompt": {"resource_type": "prompt_template", "template": "Hi {name}", "engine": "f-string"}}

    added = await store.add_resources(payload)

    stored = await store.get_resources_by_id(added.resources_id)
    assert stored is not None
    assert stored.resources == {"prompt": PromptTemplate(template="Hi {name}", engine="f-string")}


async def test_add_resources_gives_each_snapshot_its_own_id(store: LightningStore) -> None:
    first = await store.add_resources(llm())
    second = await store.add_resources(llm())

    assert first.resources_id != second.resources_id


@pytest.mark.parametrize(
    "payload",
    [
        {"x": {"resource_type": "nope"}},
        {"x": {"resource_type": "llm", "endpoint": "http://llm"}},
        {"x": {"resource_type": "llm", "endpoint": "", "model": "m"}},
        {"x": {"resource_type": "llm", "endpoint": "javascript:alert(1)", "model": "m"}},
        {"x": {"resource_type": "proxy_llm", "endpoint": "127.0.0.1:8000/v1", "model": "m"}},
        {"x": {"resource_type": "prompt_template", "template": "t", "engine": "mustache"}},
        ["not", "a", "mapping"],
    ],
)
async def test_add_resources_rejects_invalid_payload_and_writes_nothing(store: LightningStore, payload: Any) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await store.add_resources(payload)

    assert caught.value.field is not None and caught.value.field.startswith("resources")
    assert (await store.query_resources()).total == 0
    if isinstance(payload, dict) and "endpoint" in payload["x"] and payload["x"].get("model"):
        assert caught.value.field.endswith(".endpoint")


async def test_update_resources_bumps_version_and_becomes_latest(store: LightningStore) -> None:
    first = await store.add_resources(llm("a"))
    second = await store.add_resources(llm("b"))
    latest = await store.get_latest_resources()
    assert latest is not None and latest.resources_id == second.resources_id

    updated = await store.update_resources(first.resources_id, llm("c"))

    assert updated.resources_id == first.resources_id
    assert updated.version == 2
    assert updated.create_time == first.create_time
    assert updated.update_time >= first.update_time
    assert updated.resources == llm("c")
    assert await store.get_latest_resources() == updated
    assert await store.get_resources_by_id(first.resources_id) == updated


async def test_update_resources_twice_counts_each_update(store: LightningStore) -> None:
    first = await store.add_resources(llm("a"))

    await store.update_resources(first.resources_id, llm("b"))
    third = await store.update_resources(first.resources_id, llm("c"))

    assert third.version == 3


async def test_update_resources_of_unknown_id_creates_it_at_version_1(store: LightningStore) -> None:
    await store.add_resources(llm("a"))

    created = await store.update_resources("my-resources", llm("b"))

    assert (created.resources_id, created.version) == ("my-resources", 1)
    assert await store.get_resources_by_id("my-resources") == created
    assert await store.get_latest_resources() == created


async def test_update_resources_with_invalid_payload_changes_nothing(store: LightningStore) -> None:
    first = await store.add_resources(llm("a"))
    bad: Any = {"x": {"resource_type": "nope"}}

    with pytest.raises(InvalidRequestError) as caught:
        await store.update_resources(first.resources_id, bad)

    assert caught.value.field is not None and caught.value.field.startswith("resources")
    assert await store.get_resources_by_id(first.resources_id) == first


async def test_update_resources_rejects_empty_id(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await store.update_resources("", llm())
    assert caught.value.field == "resources_id"


async def test_get_latest_resources_follows_the_latest_write(store: LightningStore) -> None:
    assert await store.get_latest_resources() is None
    first = await store.add_resources(llm("a"))
    second = await store.update_resources("named", llm("b"))
    third = await store.update_resources(first.resources_id, llm("c"))

    latest = await store.get_latest_resources()

    assert latest is not None
    assert latest.resources_id == third.resources_id != second.resources_id


async def test_get_resources_by_unknown_id_is_none(store: LightningStore) -> None:
    await store.add_resources(llm())

    assert await store.get_resources_by_id("rs-missing") is None


async def three_named_snapshots(store: LightningStore) -> None:
    await store.update_resources("alpha-1", llm())
    await store.update_resources("beta-2", llm())
    await store.update_resources("alpha-3", llm())
    await store.update_resources("alpha-3", llm("new"))


async def test_query_resources_by_exact_id(store: LightningStore) -> None:
    await three_named_snapshots(store)

    result = await store.query_resources(resources_id="beta-2")

    assert [r.resources_id for r in result] == ["beta-2"]
    assert result.total == 1


async def test_query_resources_by_id_substring(store: LightningStore) -> None:
    await three_named_snapshots(store)

    result = await store.query_resources(resources_id_contains="alpha", sort_by="resources_id")

    assert [r.resources_id for r in result] == ["alpha-1", "alpha-3"]


async def test_query_resources_sorts_by_version_descending(store: LightningStore) -> None:
    await three_named_snapshots(store)

    result = await store.query_resources(sort_by="version", sort_order="desc")

    assert (result[0].resources_id, result[0].version) == ("alpha-3", 2)
    assert [r.version for r in result] == [2, 1, 1]


async def test_query_resources_pages_with_total(store: LightningStore) -> None:
    await three_named_snapshots(store)

    page = await store.query_resources(sort_by="resources_id", limit=2, offset=1)

    assert [r.resources_id for r in page] == ["alpha-3", "beta-2"]
    assert (page.total, page.limit, page.offset) == (3, 2, 1)


async def test_query_resources_rejects_unknown_sort_field(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await store.query_resources(sort_by="resources")
    assert caught.value.field == "sort_by"


# Resources and the queue ---------------------------------------------------------------------------------


async def test_an_unknown_resources_id_is_kept_as_given(store: LightningStore) -> None:
    # As in Agent Lightning: the id is a reference that a snapshot may be written under later.
    queued = await store.enqueue_rollout({"q": 1}, resources_id="rs-later")
    many = await store.enqueue_many_rollouts([EnqueueRolloutRequest(input=2, resources_id="rs-later")])
    started = await store.start_rollout({"q": 3}, resources_id="rs-later")
    assert [r.resources_id for r in (queued, *many, started)] == ["rs-later"] * 3
    await store.update_resources("rs-later", llm("now"))
    claimed = await store.dequeue_rollout()
    assert claimed is not None and claimed.resources_id == "rs-later"
    resources = await store.get_resources_by_id(claimed.resources_id)
    assert resources is not None and resources.version == 1


async def test_enqueue_with_known_resources_id_keeps_it(store: LightningStore) -> None:
    old = await store.add_resources(llm("a"))
    await store.add_resources(llm("b"))

    rollout = await store.enqueue_rollout({"q": 1}, resources_id=old.resources_id)

    assert rollout.resources_id == old.resources_id


async def test_enqueue_without_resources_id_gets_the_latest(store: LightningStore) -> None:
    assert (await store.enqueue_rollout({"q": 0})).resources_id is None
    first = await store.add_resources(llm("a"))
    second = await store.add_resources(llm("b"))
    assert (await store.enqueue_rollout({"q": 1})).resources_id == second.resources_id

    await store.update_resources(first.resources_id, llm("c"))
    rollout = await store.enqueue_rollout({"q": 2})

    assert rollout.resources_id == first.resources_id
    claimed = [await store.dequeue_rollout() for _ in range(3)]
    assert [c.resources_id if c else "empty" for c in claimed] == [
        None,
        second.resources_id,
        first.resources_id,
    ]


async def test_an_attempt_runs_with_its_rollouts_snapshot_at_its_current_version(store: LightningStore) -> None:
    await store.update_resources("policy", llm("v1"))
    other = await store.add_resources(llm("other"))  # the latest, but not this rollout's
    rollout = await store.start_rollout({"q": 1}, resources_id="policy")
    await store.update_resources("policy", llm("v2"))

    found = await store.get_attempt_resources(rollout.rollout_id, rollout.attempt.attempt_id)

    assert found is not None
    assert (found.resources_id, found.version, found.resources) == ("policy", 2, llm("v2"))
    assert other.resources_id != found.resources_id


async def test_an_attempt_without_a_stored_snapshot_runs_with_the_latest(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1}, resources_id="not-written-yet")
    assert await store.get_attempt_resources(rollout.rollout_id, rollout.attempt.attempt_id) is None

    latest = await store.add_resources(llm("latest"))

    assert await store.get_attempt_resources(rollout.rollout_id, rollout.attempt.attempt_id) == latest


async def test_attempt_resources_of_an_unknown_rollout_or_attempt_is_not_found(store: LightningStore) -> None:
    first = await store.start_rollout({"q": 1})
    second = await store.start_rollout({"q": 2})
    retried = await store.start_attempt(first.rollout_id)

    with pytest.raises(NotFoundError) as error:
        await store.get_attempt_resources("ro-missing", first.attempt.attempt_id)
    assert error.value.field == "rollout_id"
    with pytest.raises(NotFoundError) as error:
        await store.get_attempt_resources(first.rollout_id, second.attempt.attempt_id)  # another rollout's
    assert error.value.field == "attempt_id"
    # Every attempt of the rollout counts, not only its latest.
    assert await store.get_attempt_resources(first.rollout_id, first.attempt.attempt_id) is None
    assert await store.get_attempt_resources(first.rollout_id, retried.attempt.attempt_id) is None


async def test_claim_rollouts_carries_the_resources_each_attempt_runs_with(store: LightningStore) -> None:
    assert await store.claim_rollouts(limit=3, worker_id="w1") == []
    first = await store.enqueue_rollout({"q": 0})
    assert [(c.rollout.rollout_id, c.resources) for c in await store.claim_rollouts(worker_id="w1")] == [
        (first.rollout_id, None)  # the store holds no resources yet
    ]
    latest = await store.add_resources(llm("latest"))
    await store.update_resources("policy", llm("v1"))
    policy = await store.update_resources("policy", llm("v2"))
    latest = await store.add_resources(llm("latest"))
    pinned = await store.enqueue_rollout({"q": 1}, resources_id="policy")
    unpinned = await store.enqueue_rollout({"q": 2})
    unknown = await store.enqueue_rollout({"q": 3}, resources_id="not-written-yet")

    claims = await store.claim_rollouts(limit=5, worker_id="w1")

    assert [c.rollout.rollout_id for c in claims] == [pinned.rollout_id, unpinned.rollout_id, unknown.rollout_id]
    assert [c.resources for c in claims] == [policy, latest, latest]
    for claim in claims:  # each is a claim as dequeue makes it: a new preparing attempt of this worker
        assert claim.rollout.status == "preparing" and claim.rollout.attempt.status == "preparing"
        assert claim.rollout.attempt.worker_id == "w1"
        attempt = claim.rollout.attempt
        assert claim.resources == await store.get_attempt_resources(claim.rollout.rollout_id, attempt.attempt_id)
    assert await store.dequeue_rollout() is None


async def test_a_blocking_claim_waits_for_an_enqueue(store: LightningStore) -> None:
    assert await store.claim_rollouts(timeout=0.05) == []
    waiting = asyncio.ensure_future(store.claim_rollouts(worker_id="w1", timeout=10))
    await asyncio.sleep(0.2)
    enqueued = await store.enqueue_rollout({"q": 1})
    (claim,) = await asyncio.wait_for(waiting, 10)
    assert claim.rollout.rollout_id == enqueued.rollout_id and claim.resources is None


# Workers -------------------------------------------------------------------------------------------------


async def test_update_worker_creates_it_with_heartbeat_stats(store: LightningStore) -> None:
    before = time.time()

    worker = await store.update_worker("w1", {"gpu_util": 0.5, "queue": [1, 2]})

    assert worker.worker_id == "w1"
    assert worker.status == "unknown"
    assert worker.heartbeat_stats == {"gpu_util": 0.5, "queue": [1, 2]}
    assert worker.last_heartbeat_time is not None
    assert before <= worker.last_heartbeat_time <= time.time()
    assert await store.get_worker_by_id("w1") == worker


async def test_update_worker_without_stats_keeps_them_and_refreshes_heartbeat(store: LightningStore) -> None:
    first = await store.update_worker("w1", {"n": 1})

    second = await store.update_worker("w1")

    assert second.heartbeat_stats == {"n": 1}
    assert first.last_heartbeat_time is not None and second.last_heartbeat_time is not None
    assert second.last_heartbeat_time >= first.last_heartbeat_time


async def test_update_worker_replaces_stats(store: LightningStore) -> None:
    await store.update_worker("w1", {"n": 1, "old": True})

    worker = await store.update_worker("w1", {"n": 2})

    assert worker.heartbeat_stats == {"n": 2}


async def test_update_worker_rejects_empty_id(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await store.update_worker("")
    assert caught.value.field == "worker_id"
    assert (await store.query_workers()).total == 0


async def test_get_worker_by_unknown_id_is_none(store: LightningStore) -> None:
    assert await store.get_worker_by_id("nobody") is None


async def test_dequeue_with_worker_id_makes_the_worker_busy(store: LightningStore) -> None:
    await store.update_worker("w1", {"n": 1})
    rollout = await store.enqueue_rollout({"q": 1})
    before = time.time()

    claimed = await store.dequeue_rollout(worker_id="w1")

    assert claimed is not None and claimed.rollout_id == rollout.rollout_id
    assert claimed.attempt.worker_id == "w1"
    worker = await store.get_worker_by_id("w1")
    assert worker is not None
    assert worker.status == "busy"
    assert (worker.current_rollout_id, worker.current_attempt_id) == (rollout.rollout_id, claimed.attempt.attempt_id)
    assert worker.last_dequeue_time is not None and before <= worker.last_dequeue_time <= time.time()
    assert worker.last_busy_time is not None and before <= worker.last_busy_time
    assert worker.heartbeat_stats == {"n": 1}


async def test_dequeue_creates_an_unknown_worker(store: LightningStore) -> None:
    await store.enqueue_rollout({"q": 1})

    await store.dequeue_rollout(worker_id="fresh")

    worker = await store.get_worker_by_id("fresh")
    assert worker is not None and worker.status == "busy"


async def test_start_rollout_with_worker_id_makes_the_worker_busy(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1}, worker_id="w1")

    worker = await store.get_worker_by_id("w1")

    assert worker is not None and worker.status == "busy"
    assert worker.current_attempt_id == rollout.attempt.attempt_id


async def test_heartbeat_keeps_a_busy_worker_busy(store: LightningStore) -> None:
    await store.enqueue_rollout({"q": 1})
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None

    worker = await store.update_worker("w1", {"n": 2})

    assert worker.status == "busy"
    assert worker.current_attempt_id == claimed.attempt.attempt_id


@pytest.mark.parametrize(
    ("attempt_status", "worker_status"),
    [("succeeded", "idle"), ("failed", "idle"), ("timeout", "unknown"), ("unresponsive", "unknown")],
)
async def test_finished_attempt_releases_its_worker(
    store: LightningStore, attempt_status: AttemptStatus, worker_status: WorkerStatus
) -> None:
    await store.enqueue_rollout({"q": 1})
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None
    before = time.time()

    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status=attempt_status)

    worker = await store.get_worker_by_id("w1")
    assert worker is not None
    assert worker.status == worker_status
    assert (worker.current_rollout_id, worker.current_attempt_id) == (None, None)
    assert worker.last_idle_time is not None and worker.last_idle_time >= before


async def test_running_attempt_keeps_its_worker_busy(store: LightningStore) -> None:
    await store.enqueue_rollout({"q": 1})
    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None

    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")

    worker = await store.get_worker_by_id("w1")
    assert worker is not None and worker.status == "busy"
    assert worker.current_attempt_id == claimed.attempt.attempt_id


async def test_assigning_a_worker_to_an_attempt_makes_it_busy(store: LightningStore) -> None:
    rollout = await store.start_rollout({"q": 1})

    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, worker_id="w2")

    worker = await store.get_worker_by_id("w2")
    assert worker is not None and worker.status == "busy"
    assert worker.current_rollout_id == rollout.rollout_id


async def test_empty_dequeue_marks_a_new_worker_idle(store: LightningStore) -> None:
    before = time.time()

    assert await store.dequeue_rollout(worker_id="w1") is None

    worker = await store.get_worker_by_id("w1")
    assert worker is not None
    assert worker.status == "idle"
    assert worker.last_dequeue_time is not None and before <= worker.last_dequeue_time <= time.time()
    assert worker.last_idle_time is not None


async def test_empty_dequeue_marks_a_busy_worker_idle(store: LightningStore) -> None:
    await store.enqueue_rollout({"q": 1})
    await store.dequeue_rollout(worker_id="w1")

    assert await store.dequeue_rollout(worker_id="w1") is None

    worker = await store.get_worker_by_id("w1")
    assert worker is not None
    assert worker.status == "idle"
    assert (worker.current_rollout_id, worker.current_attempt_id) == (None, None)


async def test_empty_dequeue_of_an_idle_worker_keeps_its_idle_since_time(store: LightningStore) -> None:
    await store.dequeue_rollout(worker_id="w1")
    first = await store.get_worker_by_id("w1")
    assert first is not None

    await store.dequeue_rollout(worker_id="w1")

    second = await store.get_worker_by_id("w1")
    assert second is not None
    assert second.last_idle_time == first.last_idle_time
    assert second.last_dequeue_time is not None and first.last_dequeue_time is not None
    assert second.last_dequeue_time >= first.last_dequeue_time


async def test_empty_dequeue_without_worker_id_records_no_worker(store: LightningStore) -> None:
    assert await store.dequeue_rollout() is None

    assert (await store.query_workers()).total == 0


async def three_workers(store: LightningStore) -> None:
    """gpu-a busy, gpu-b idle, cpu-c unknown."""
    await store.enqueue_rollout({"q": 1})
    await store.dequeue_rollout(worker_id="gpu-a")
    await store.dequeue_rollout(worker_id="gpu-b")
    await store.update_worker("cpu-c")


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, ["cpu-c", "gpu-a", "gpu-b"]),
        ({"status_in": ["busy"]}, ["gpu-a"]),
        ({"status_in": ["idle", "unknown"]}, ["cpu-c", "gpu-b"]),
        ({"status_in": []}, []),
        ({"worker_id_contains": "gpu"}, ["gpu-a", "gpu-b"]),
        ({"worker_id_contains": "gpu", "status_in": ["idle"]}, ["gpu-b"]),
        ({"worker_id_contains": "cpu", "status_in": ["busy"], "filter_logic": "or"}, ["cpu-c", "gpu-a"]),
        ({"worker_id_contains": "-"}, ["cpu-c", "gpu-a", "gpu-b"]),
        ({"worker_id_contains": "%"}, []),
    ],
)
async def test_query_workers_filters(store: LightningStore, filters: dict[str, Any], expected: list[str]) -> None:
    await three_workers(store)

    result = await store.query_workers(**filters, sort_by="worker_id")

    assert [w.worker_id for w in result] == expected
    assert result.total == len(expected)


async def test_query_workers_sorts_descending(store: LightningStore) -> None:
    await three_workers(store)

    result = await store.query_workers(sort_by="status", sort_order="desc")

    assert [w.status for w in result] == ["unknown", "idle", "busy"]


async def test_query_workers_pages_with_total(store: LightningStore) -> None:
    await three_workers(store)

    page = await store.query_workers(sort_by="worker_id", limit=1, offset=2)

    assert [w.worker_id for w in page] == ["gpu-b"]
    assert (page.total, page.limit, page.offset) == (3, 1, 2)


async def test_query_workers_rejects_unknown_status(store: LightningStore) -> None:
    bad: Any = ["busy", "sleeping"]

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_workers(status_in=bad)
    assert caught.value.field == "status_in.1"


async def test_query_workers_rejects_a_bare_status_string(store: LightningStore) -> None:
    bad: Any = "idle"

    with pytest.raises(InvalidRequestError) as caught:
        await store.query_workers(status_in=bad)
    assert caught.value.field == "status_in"


async def test_query_workers_rejects_unknown_sort_field(store: LightningStore) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        await store.query_workers(sort_by="heartbeat_stats")
    assert caught.value.field == "sort_by"


async def test_concurrent_updates_of_one_existing_snapshot_count_every_update(
    store: LightningStore, store_factory: StoreFactory
) -> None:
    await store.update_resources("shared", llm("v0"))
    other = await store_factory()

    await asyncio.gather(*(s.update_resources("shared", llm(f"v{i}")) for i in range(5) for s in (store, other)))

    latest = await store.get_resources_by_id("shared")
    assert latest is not None and latest.version == 11


async def test_concurrent_first_updates_of_a_new_snapshot_all_succeed(
    store: LightningStore, store_factory: StoreFactory
) -> None:
    other = await store_factory()

    results = await asyncio.gather(
        *(s.update_resources("brand-new", llm(f"v{i}")) for i in range(4) for s in (store, other)),
        return_exceptions=True,
    )

    assert [r for r in results if isinstance(r, BaseException)] == []
    latest = await store.get_resources_by_id("brand-new")
    assert latest is not None and latest.version == 8
