"""Request bodies and response shapes of the HTTP API, wire-compatible with Agent Lightning 0.3.

Update bodies tell an absent key (leave the field alone) from an explicit ``null`` (set it to None) through
``model_fields_set``. Rollouts are serialized with an ``attempt`` key only when they have one: the Agent
Lightning client decides between ``Rollout`` and ``AttemptedRollout`` by the key's presence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic_core import to_json

from lightning_store.contract import UNSET
from lightning_store.errors import BadRequestError
from lightning_store.limits import Id, Int64
from lightning_store.models import (
    AttemptEnd,
    AttemptStatus,
    EnqueueRolloutRequest,
    FilterLogic,
    PaginatedResult,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    SortOrder,
    WorkerStatus,
)

MAX_LONG_POLL_SECONDS = 25.0
"""The longest one request waits (below the 30 s read timeout of Agent Lightning's client); clients loop."""


class Body(BaseModel):
    """A request body: unknown keys refused, and no coercion of its own fields (``false`` is not an offset)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class EnqueueBody(Body):
    rollouts: list[EnqueueRolloutRequest]


class DequeueBody(Body):
    limit: Int64 = 1
    worker_id: Id | None = None
    timeout: float | None = Field(default=None, ge=0, description="Long-poll up to this many seconds (addition).")


class StartRolloutBody(Body):
    input: Any = None
    mode: RolloutMode | None = None
    resources_id: Id | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    worker_id: Id | None = None


class PageBody(Body):
    sort_by: str | None = None
    sort_order: SortOrder = "asc"
    # Any 64-bit integer gets through the door: the store answers 400 for a limit below -1 or a negative offset,
    # as Agent Lightning's server does (not the 422 of a type check).
    limit: Int64 = -1
    offset: Int64 = 0


class QueryRolloutsBody(PageBody):
    status_in: list[RolloutStatus] | None = None
    rollout_id_in: list[str] | None = None
    rollout_id_contains: str | None = None
    filter_logic: FilterLogic = "and"
    mode_in: list[RolloutMode] | None = None
    metadata_match: dict[str, Any] | None = None
    start_time_from: float | None = None
    start_time_to: float | None = None


class UpdateRolloutBody(Body):
    input: Any = None
    mode: RolloutMode | None = None
    resources_id: Id | None = None
    status: RolloutStatus | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None

    def changes(self) -> dict[str, Any]:
        return _changes(self, not_null=("status", "config"))


class StartAttemptBody(Body):
    worker_id: Id | None = None


class QueryAttemptsBody(PageBody):
    sort_by: str | None = "sequence_id"


class UpdateAttemptBody(Body):
    status: AttemptStatus | None = None
    worker_id: Id | Literal[""] | None = Field(default=None, description='`""` clears it (no worker).')
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None
    if_current: bool = False

    def changes(self) -> dict[str, Any]:
        changes = _changes(self, not_null=("status", "worker_id", "last_heartbeat_time", "metadata", "if_current"))
        changes["if_current"] = self.if_current
        return changes


class EndAttemptsBody(Body):
    ends: list[AttemptEnd]


class QuerySpansBody(PageBody):
    rollout_id: str
    attempt_id: str | None = None
    trace_id: str | None = None
    trace_id_contains: str | None = None
    span_id: str | None = None
    span_id_contains: str | None = None
    parent_id: str | None = None
    parent_id_contains: str | None = None
    name: str | None = None
    name_contains: str | None = None
    filter_logic: FilterLogic = "and"
    sort_by: str | None = "sequence_id"


class SearchSpansBody(PageBody):
    """Span search across rollouts (an addition); see ``LightningStore.search_spans``."""

    rollout_ids: list[str] | None = None
    attempt_ids: list[str] | None = None
    names: list[str] | None = None
    name_prefix: str | None = None
    mode_in: list[RolloutMode] | None = None
    status_code: Literal["UNSET", "OK", "ERROR"] | None = None
    attributes_match: dict[str, Any] | None = None
    start_time_from: float | None = None
    start_time_to: float | None = None
    limit: Int64 = 1000


class SpansBody(Body):
    spans: list[dict[str, Any]] = Field(description="Spans as JSON objects; the store validates each one.")
    allocate_sequence_ids: bool = Field(
        default=False,
        description="Give each span the next value of its rollout's span counter (its own sequence_id is ignored).",
    )
    return_spans: bool = Field(
        default=True,
        description=(
            'False: answer `{"added": [index, …], "sequence_ids": [n, …]}`, the positions in `spans` of the '
            "spans that were new and the sequence id each was stored with, instead of the new spans themselves "
            "(a client that holds the spans it sent saves encoding and decoding them again)."
        ),
    )


class NextSequenceBody(Body):
    rollout_id: str
    attempt_id: str


class NextSequencesBody(Body):
    pairs: list[NextSequenceBody]


class LlmCallsBody(Body):
    calls: list[dict[str, Any]]


class QueryLlmCallsBody(Body):
    rollout_ids: list[str]
    attempt_id: str | None = None


class WaitBody(Body):
    rollout_ids: list[str]
    timeout: float | None = None


class QueryWorkersBody(PageBody):
    status_in: list[WorkerStatus] | None = None
    worker_id_contains: str | None = None
    filter_logic: FilterLogic = "and"


class UpdateWorkerBody(Body):
    heartbeat_stats: dict[str, Any] | None = None

    def changes(self) -> dict[str, Any]:
        return _changes(self, not_null=("heartbeat_stats",))


def _changes(body: BaseModel, not_null: Sequence[str]) -> dict[str, Any]:
    """The fields the caller sent (absent ones stay ``UNSET``); ``null`` is refused (400) where the store needs a
    value."""
    changes: dict[str, Any] = {}
    for name in type(body).model_fields:
        if name not in body.model_fields_set:
            changes[name] = UNSET
            continue
        value = getattr(body, name)
        if value is None and name in not_null:
            raise BadRequestError(f"{name} cannot be null; leave it out to keep the current value", field=name)
        changes[name] = value
    return changes


def rollout_json(rollout: Rollout, *, with_attempt: bool = True) -> dict[str, Any]:
    data = rollout.model_dump(mode="json")
    if not with_attempt:
        data.pop("attempt", None)
    return data


_ANY_JSON: TypeAdapter[Any] = TypeAdapter(Any)
"""Encodes a model where it finds one as that model's own class dumps it (a subclass's fields included)."""


def page_response(page: PaginatedResult[Any]) -> Response:
    """A page as the answer's JSON (``items``, ``limit``, ``offset``, ``total``), each item as its own model
    dumps it (a rollout with its latest attempt, where it has one), encoded in one call of pydantic's serializer.
    Why not a dict for FastAPI to encode: a dict per item, then FastAPI's pass over the whole answer, cost more
    than the query on a page of 100 rollouts."""
    page_fields = {"items": page.items, "limit": page.limit, "offset": page.offset, "total": page.total}
    return Response(_ANY_JSON.dump_json(page_fields), media_type="application/json")


def documents_page_response(page: PaginatedResult[str]) -> Response:
    """:func:`page_response` of a page whose items are JSON documents already (sent as they are)."""
    items = ",".join(page.items)
    tail = to_json({"limit": page.limit, "offset": page.offset, "total": page.total}).decode()[1:]
    return Response(f'{{"items":[{items}],{tail}'.encode(), media_type="application/json")


def long_poll(timeout: float | None) -> float:
    """A requested wait, capped so that one request never outlives a client's read timeout."""
    return MAX_LONG_POLL_SECONDS if timeout is None else min(max(timeout, 0.0), MAX_LONG_POLL_SECONDS)
