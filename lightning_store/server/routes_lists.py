"""The GET list routes of Agent Lightning 0.3 (``/v1/agl/rollouts``, ``…/attempts``, ``/spans``, ``/workers``).

Its dashboard, and scripts written against its server, list with query parameters where its Python client POSTs
a search body. Each route here reads the same fields from the query string (a list field as a repeated key:
``status_in=running&status_in=queuing``), checks them through the same body model as its POST search (the same
limits, the same 400 for an impossible page or sort), and answers from the same handler, so both run the same
statements. Unknown query keys are ignored, as Agent Lightning's server ignores them.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError

from lightning_store.limits import check_json
from lightning_store.models import FilterLogic, RolloutMode, RolloutStatus, SortOrder, WorkerStatus
from lightning_store.server import routes_rollouts, routes_store, wire
from lightning_store.server.routes_rollouts import Store

router = APIRouter(prefix="/v1/agl")


class _Params(BaseModel):
    """Query parameters: converted from text (``limit=3``), unknown keys ignored; checked again, strictly, by the
    body model of the matching POST search."""

    model_config = ConfigDict(extra="ignore")
    sort_by: str | None = None
    sort_order: SortOrder = "asc"
    limit: int = -1
    offset: int = 0

    def body(self, model: type[wire.Body]) -> Any:
        """The parameters as ``model``, through the door a JSON body passes (no NUL, no lone surrogate, no
        integer past 64 bits): a 422 naming the parameter otherwise."""
        fields = self.model_dump(exclude_unset=True)
        check_json(fields)
        try:
            return model.model_validate(fields)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None


class RolloutParams(_Params):
    status_in: list[RolloutStatus] | None = None
    rollout_id_in: list[str] | None = None
    rollout_id_contains: str | None = None
    filter_logic: FilterLogic = "and"
    mode_in: list[RolloutMode] | None = None
    start_time_from: float | None = None
    start_time_to: float | None = None


class AttemptParams(_Params):
    sort_by: str | None = "sequence_id"


# Field for field ``wire.QuerySpansBody``, on purpose: these are the GET form's parameters, read from text and
# unknown keys ignored, then checked again by that strict model (``body``), which the POST form is.
class SpanParams(_Params):
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


class WorkerParams(_Params):
    status_in: list[WorkerStatus] | None = None
    worker_id_contains: str | None = None
    filter_logic: FilterLogic = "and"


@router.get("/rollouts", response_model=dict[str, Any])
async def list_rollouts(params: Annotated[RolloutParams, Query()], store: Store) -> Response:
    """A page of rollouts, each with its latest attempt where it has one: ``POST /rollouts/search`` as a GET."""
    return await routes_rollouts.search_rollouts(params.body(wire.QueryRolloutsBody), store)


@router.get("/rollouts/{rollout_id}/attempts", response_model=dict[str, Any])
async def list_attempts(rollout_id: str, params: Annotated[AttemptParams, Query()], store: Store) -> Response:
    """A page of a rollout's attempts: ``POST /rollouts/{rollout_id}/attempts/search`` as a GET."""
    return await routes_rollouts.search_attempts(rollout_id, params.body(wire.QueryAttemptsBody), store)


@router.get("/spans", response_model=dict[str, Any])
async def list_spans(params: Annotated[SpanParams, Query()], store: Store) -> Response:
    """A page of a rollout's spans: ``POST /spans/search`` as a GET."""
    return await routes_store.search_spans(params.body(wire.QuerySpansBody), store)


@router.get("/workers", response_model=dict[str, Any])
async def list_workers(params: Annotated[WorkerParams, Query()], store: Store) -> Response:
    """A page of workers: ``POST /workers/search`` as a GET."""
    return await routes_store.search_workers(params.body(wire.QueryWorkersBody), store)
