"""Routes for spans, resources, workers, statistics and health (``/v1/agl/…``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter

from lightning_store.contract import DocumentReads
from lightning_store.errors import DatabaseUnavailableError, InvalidRequestError
from lightning_store.limits import MAX_INT, MIN_INT
from lightning_store.resources import NamedResources
from lightning_store.server import wire
from lightning_store.server.json_body import CheckedJsonRoute
from lightning_store.server.outage import HEALTH_TIMEOUT, unavailable_response
from lightning_store.server.routes_rollouts import Store
from lightning_store.spans import Span

router = APIRouter(prefix="/v1/agl", route_class=CheckedJsonRoute)
_resources: TypeAdapter[NamedResources] = TypeAdapter(NamedResources)
_SPAN_LIST: TypeAdapter[list[Span]] = TypeAdapter(list[Span])
_POSITIONS: TypeAdapter[dict[str, list[int]]] = TypeAdapter(dict[str, list[int]])


@router.get(
    "/health",
    response_model=dict[str, str],
    responses={503: {"description": "The database cannot be reached: `status` unavailable, `database` unreachable"}},
)
async def health(request: Request) -> Any:
    """`{"status": "ok", "database": "ok"}` when the database answers `SELECT 1` within a short timeout, else 503.
    Open without the token (Agent Lightning's client probes it before it retries)."""
    check = getattr(request.app.state.store, "check_database", None)
    if check is None:  # a store without a database of its own
        return {"status": "ok"}
    try:
        await check(timeout=HEALTH_TIMEOUT)
    except DatabaseUnavailableError:
        return unavailable_response(status="unavailable", database="unreachable")
    return {"status": "ok", "database": "ok"}


@router.get("/statistics")
async def statistics(store: Store) -> dict[str, Any]:
    return dict(await store.statistics())


@router.post("/spans", status_code=201)
async def add_span(body: Annotated[Any, Body()], store: Store) -> JSONResponse:
    try:
        added = await store.add_many_spans([body])  # the store validates and names fields
    except InvalidRequestError as exc:  # named as the batch's first span: name it as this body's field
        field = (exc.field or "").removeprefix("spans.0.") or None
        raise InvalidRequestError(exc.message.removeprefix("spans.0."), field=field) from None
    return JSONResponse(added[0].model_dump(mode="json") if added else None, status_code=201)


@router.post("/spans/batch", status_code=201, response_model=dict[str, Any])
async def add_many_spans(body: wire.SpansBody, store: Store) -> Response:
    """Store a batch of spans in one request and one transaction (an addition); answers the new ones, or where
    they were in the batch (`return_spans: false`)."""
    spans: Any = body.spans  # the store validates and names fields
    added: list[Span] = list(await store.add_many_spans(spans, allocate_sequence_ids=body.allocate_sequence_ids))
    if body.return_spans:
        # Encoded in one call of pydantic's serializer: a dict per span, then FastAPI's encoding of the whole
        # answer, took 8% of the server's CPU on span ingest.
        answer = b'{"spans":' + _SPAN_LIST.dump_json(added) + b"}"
    else:
        positions = _positions(body.spans, added)
        answer = _POSITIONS.dump_json({"added": positions, "sequence_ids": [span.sequence_id for span in added]})
    return Response(answer, status_code=201, media_type="application/json")


def _positions(sent: list[dict[str, Any]], added: list[Span]) -> list[int]:
    """The index in ``sent`` of each span of ``added``. The store answers the new spans in the order they were sent,
    and where a span is sent twice the first is the new one, so the earliest match of each key is the right one."""
    positions = []
    index = 0
    for span in added:
        key = (span.rollout_id, span.attempt_id, span.span_id)
        while (sent[index].get("rollout_id"), sent[index].get("attempt_id"), sent[index].get("span_id")) != key:
            index += 1  # an IndexError here would be a store that broke its contract: a 500, as it should be
        positions.append(index)
        index += 1
    return positions


@router.post("/spans/search", response_model=dict[str, Any])
async def search_spans(body: wire.QuerySpansBody, store: Store) -> Response:
    fields = body.model_dump()
    rollout_id, attempt_id = fields.pop("rollout_id"), fields.pop("attempt_id")
    if isinstance(store, DocumentReads):
        return wire.documents_page_response(await store.query_span_documents(rollout_id, attempt_id, **fields))
    return wire.page_response(await store.query_spans(rollout_id, attempt_id, **fields))


@router.post("/spans/query", response_model=dict[str, Any])
async def search_spans_across_rollouts(body: wire.SearchSpansBody, store: Store) -> Response:
    """Read-only span search across rollouts (an addition): every given filter applies."""
    return wire.page_response(await store.search_spans(**body.model_dump()))


@router.post("/spans/next")
async def next_sequence_id(body: wire.NextSequenceBody, store: Store) -> dict[str, int]:
    return {"sequence_id": await store.get_next_span_sequence_id(body.rollout_id, body.attempt_id)}


@router.post("/spans/next/batch")
async def next_sequence_ids(body: wire.NextSequencesBody, store: Store) -> dict[str, list[int]]:
    """Allocate several sequence ids in one transaction (an addition): all or none."""
    pairs = [(pair.rollout_id, pair.attempt_id) for pair in body.pairs]
    return {"sequence_ids": list(await store.get_many_span_sequence_ids(pairs))}


@router.post("/llm_calls/batch", status_code=201)
async def add_llm_calls(body: wire.LlmCallsBody, store: Store) -> dict[str, int]:
    """Record typed LLM calls (an addition); duplicates are ignored."""
    await store.add_llm_calls(body.calls)  # type: ignore[arg-type]  # the store validates and names fields
    return {"received": len(body.calls)}


@router.post("/llm_calls/search")
async def query_llm_calls(body: wire.QueryLlmCallsBody, store: Store) -> dict[str, Any]:
    calls = await store.query_llm_calls(body.rollout_ids, attempt_id=body.attempt_id)
    return {"items": [call.model_dump(mode="json") for call in calls]}


@router.get("/resources", response_model=dict[str, Any])
async def query_resources(
    store: Store,
    resources_id: str | None = None,
    resources_id_contains: str | None = None,
    sort_by: str | None = None,
    sort_order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    limit: Annotated[int, Query(ge=MIN_INT, le=MAX_INT)] = -1,  # past 64 bits: 422; the store says 400 within
    offset: Annotated[int, Query(ge=MIN_INT, le=MAX_INT)] = 0,
) -> Response:
    page = await store.query_resources(
        resources_id=resources_id,
        resources_id_contains=resources_id_contains,
        sort_by=sort_by,
        sort_order=sort_order,  # type: ignore[arg-type]
        limit=limit,
        offset=offset,
    )
    return wire.page_response(page)


@router.post("/resources", status_code=201)
async def add_resources(body: Annotated[Any, Body()], store: Store) -> dict[str, Any]:
    return (await store.add_resources(body)).model_dump(mode="json")


@router.get("/resources/latest")
async def latest_resources(store: Store) -> dict[str, Any] | None:
    latest = await store.get_latest_resources()
    return None if latest is None else latest.model_dump(mode="json")


@router.post("/resources/{resources_id}")
async def update_resources(resources_id: str, body: Annotated[Any, Body()], store: Store) -> dict[str, Any]:
    return (await store.update_resources(resources_id, body)).model_dump(mode="json")


@router.get("/resources/{resources_id}")
async def get_resources(resources_id: str, store: Store) -> dict[str, Any] | None:
    found = await store.get_resources_by_id(resources_id)
    return None if found is None else found.model_dump(mode="json")


@router.get("/rollouts/{rollout_id}/attempts/{attempt_id}/resources")
async def attempt_resources(rollout_id: str, attempt_id: str, store: Store) -> dict[str, Any] | None:
    """The resources an attempt runs with (an addition)."""
    found = await store.get_attempt_resources(rollout_id, attempt_id)
    return None if found is None else found.model_dump(mode="json")


@router.post("/workers/search", response_model=dict[str, Any])
async def search_workers(body: wire.QueryWorkersBody, store: Store) -> Response:
    return wire.page_response(await store.query_workers(**body.model_dump()))


@router.get("/workers/{worker_id}")
async def get_worker(worker_id: str, store: Store) -> dict[str, Any] | None:
    worker = await store.get_worker_by_id(worker_id)
    return None if worker is None else worker.model_dump(mode="json")


@router.post("/workers/{worker_id}")
async def update_worker(
    worker_id: str, store: Store, body: Annotated[wire.UpdateWorkerBody | None, Body()] = None
) -> dict[str, Any]:
    changes = (body or wire.UpdateWorkerBody()).changes()
    return (await store.update_worker(worker_id, changes["heartbeat_stats"])).model_dump(mode="json")
