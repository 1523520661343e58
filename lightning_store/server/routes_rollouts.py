"""Routes for rollouts, the queue, attempts and waits (``/v1/agl/…``, as Agent Lightning 0.3 serves them)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Request, Response

from lightning_store.contract import DocumentReads, LightningStore
from lightning_store.server import wire
from lightning_store.server.json_body import CheckedJsonRoute
from lightning_store.server.shutdown import LongPolls

router = APIRouter(prefix="/v1/agl", route_class=CheckedJsonRoute)
T = TypeVar("T")


async def get_store(request: Request) -> LightningStore:
    # async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop per request.
    store: LightningStore = request.app.state.store
    return store


Store = Annotated[LightningStore, Depends(get_store)]


def long_polls(request: Request) -> LongPolls:
    polls: LongPolls = request.app.state.long_polls
    return polls


@router.post("/queues/rollouts/enqueue", status_code=201)
async def enqueue(body: wire.EnqueueBody, store: Store) -> list[dict[str, Any]]:
    rollouts = await store.enqueue_many_rollouts(body.rollouts)
    return [wire.rollout_json(r, with_attempt=False) for r in rollouts]


@router.post("/queues/rollouts/dequeue")
async def dequeue(
    store: Store, request: Request, response: Response, body: Annotated[wire.DequeueBody | None, Body()] = None
) -> list[dict[str, Any]]:
    claimed = await _claiming(store.dequeue_many_rollouts, request, response, body)
    return [wire.rollout_json(r) for r in claimed]


@router.post("/queues/rollouts/claim")
async def claim(
    store: Store, request: Request, response: Response, body: Annotated[wire.DequeueBody | None, Body()] = None
) -> list[dict[str, Any]]:
    """**Addition.** As dequeue, each claimed rollout with the resources its attempt runs with:
    ``[{"rollout": …, "resources": … | null}]`` (one request where a runner made two)."""
    claimed = await _claiming(store.claim_rollouts, request, response, body)
    return [
        {"rollout": wire.rollout_json(c.rollout), "resources": c.resources and c.resources.model_dump(mode="json")}
        for c in claimed
    ]


async def _claiming(
    method: Callable[..., Awaitable[T]], request: Request, response: Response, body: wire.DequeueBody | None
) -> T:
    """``method`` (a dequeue) with the body's arguments; a blocking one is a long-poll, which answers [] at once
    when the server shuts down or its client leaves."""
    body = body or wire.DequeueBody()
    timeout = None if body.timeout is None else wire.long_poll(body.timeout)
    call = functools.partial(method, limit=body.limit, worker_id=body.worker_id, timeout=timeout)
    return await (long_polls(request).run(request, response, call) if timeout else call())


@router.post("/rollouts", status_code=201)
async def start_rollout(body: wire.StartRolloutBody, store: Store) -> dict[str, Any]:
    started = await store.start_rollout(
        body.input, body.mode, body.resources_id, body.config, body.metadata, body.worker_id
    )
    return wire.rollout_json(started)


@router.post("/rollouts/search", response_model=dict[str, Any])
async def search_rollouts(body: wire.QueryRolloutsBody, store: Store) -> Response:
    if isinstance(store, DocumentReads):
        return wire.documents_page_response(await store.query_rollout_documents(**body.model_dump()))
    return wire.page_response(await store.query_rollouts(**body.model_dump()))


@router.get("/rollouts/{rollout_id}")
async def get_rollout(rollout_id: str, store: Store) -> dict[str, Any] | None:
    rollout = await store.get_rollout_by_id(rollout_id)
    return None if rollout is None else wire.rollout_json(rollout)


@router.post("/rollouts/{rollout_id}")
async def update_rollout(rollout_id: str, body: wire.UpdateRolloutBody, store: Store) -> dict[str, Any]:
    # With its latest attempt: Agent Lightning's client reads a plain Rollout and ignores the extra key.
    return wire.rollout_json(await store.update_rollout(rollout_id, **body.changes()))


@router.post("/rollouts/{rollout_id}/attempts", status_code=201)
async def start_attempt(
    rollout_id: str, store: Store, body: Annotated[wire.StartAttemptBody | None, Body()] = None
) -> dict[str, Any]:
    started = await store.start_attempt(rollout_id, (body or wire.StartAttemptBody()).worker_id)
    return wire.rollout_json(started)


@router.post("/rollouts/{rollout_id}/attempts/search", response_model=dict[str, Any])
async def search_attempts(rollout_id: str, body: wire.QueryAttemptsBody, store: Store) -> Response:
    return wire.page_response(await store.query_attempts(rollout_id, **body.model_dump()))


@router.get("/rollouts/{rollout_id}/attempts/latest")
async def latest_attempt(rollout_id: str, store: Store) -> dict[str, Any] | None:
    attempt = await store.get_latest_attempt(rollout_id)
    return None if attempt is None else attempt.model_dump(mode="json")


@router.post("/rollouts/{rollout_id}/attempts/{attempt_id}")
async def update_attempt(
    rollout_id: str, attempt_id: str, body: wire.UpdateAttemptBody, store: Store, request: Request
) -> dict[str, Any]:
    changes = body.changes()
    if "status" in changes:
        # The attempt's LLM calls this server proxied are in the store before its status says it is done.
        await request.app.state.recorder.settled(attempt_id)
    attempt = await store.update_attempt(rollout_id, attempt_id, **changes)
    return attempt.model_dump(mode="json")


@router.post("/attempts/end")
async def end_attempts(body: wire.EndAttemptsBody, store: Store, request: Request) -> list[dict[str, Any] | None]:
    """Several attempts' final statuses in one transaction (an addition); null for an attempt no longer current."""
    recorder = request.app.state.recorder
    for end in body.ends:
        await recorder.settled(end.attempt_id)  # as for a single status: its proxied calls land first
    ended = await store.end_attempts(body.ends)
    return [None if attempt is None else attempt.model_dump(mode="json") for attempt in ended]


@router.post("/waits/rollouts")
async def wait_for_rollouts(
    body: wire.WaitBody, store: Store, request: Request, response: Response
) -> list[dict[str, Any]]:
    wait = functools.partial(
        store.wait_for_rollouts, rollout_ids=body.rollout_ids, timeout=wire.long_poll(body.timeout)
    )
    # Answers with the rollouts finished so far at once when the server shuts down or its client leaves.
    done = await long_polls(request).run(request, response, wait)
    return [wire.rollout_json(r, with_attempt=False) for r in done]


@router.post("/watchdog/scan")
async def scan_unhealthy(store: Store) -> dict[str, int]:
    """Run one watchdog scan now (an addition); returns how many attempts it marked."""
    return {"marked": await store.scan_unhealthy()}
