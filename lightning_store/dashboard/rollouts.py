"""The rollouts page: every rollout in the store, filtered, sorted and paged (50 a page).

``GET /dashboard/rollouts`` takes its filters from the query string (:mod:`~lightning_store.dashboard.rollout_filters`
says which, and how they are checked) and reads the store with the statements of
:mod:`~lightning_store.dashboard.rollouts_query`. A bad filter value re-renders the page with the form as typed
and a message naming each bad field, with HTTP 422; nothing a user types can cause a 500.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from lightning_store.dashboard.reader import reader_of
from lightning_store.dashboard.rollout_filters import MODES, PAGE_SIZE, SORTS, RolloutFilters, parse_filters
from lightning_store.dashboard.rollouts_query import rollout_page, store_is_empty
from lightning_store.dashboard.templating import render
from lightning_store.dashboard.timing import TimedReader
from lightning_store.models import ROLLOUT_STATUSES

router = APIRouter()

SORT_LABELS = {
    "start_time": "start time",
    "end_time": "end time",
    "duration": "duration",
    "reward": "reward",
    "status": "status",
}


@router.get("/rollouts", response_class=HTMLResponse)
async def rollouts(request: Request) -> Response:
    """The rollouts table (200), or the form with the errors of the filters given (422)."""
    reader = TimedReader(reader_of(request))
    f, errors = parse_filters(request.query_params.multi_items())
    context: dict[str, Any] = {
        "page": "rollouts",
        "f": f,
        "errors": errors,
        "statuses": ROLLOUT_STATUSES,
        "modes": MODES,
        "sorts": [(name, SORT_LABELS[name]) for name in SORTS],
        "since_value": _input_time(f, "since"),
        "until_value": _input_time(f, "until"),
        "page_size": PAGE_SIZE,
    }
    if errors:
        return reader.stamp(render(request, "rollouts.html", context, status_code=422))
    result = await rollout_page(reader, f)
    context["result"] = result
    context["empty_store"] = not result.rows and await store_is_empty(reader)
    context["header_links"] = {name: _sort_link(f, name) for name in SORTS}
    return reader.stamp(render(request, "rollouts.html", context))


def _sort_link(f: RolloutFilters, name: str) -> str:
    """The link of a column header: sort by it (newest or largest first), or flip the order when it is the sort."""
    order = ("asc" if f.order == "desc" else "desc") if f.sort == name else "desc"
    return f.link(sort=name, order=order, page=None)


def _input_time(f: RolloutFilters, name: str) -> str:
    """What a ``datetime-local`` input shows for ``name``: the time in UTC when it was valid, else as typed."""
    value = f.since if name == "since" else f.until
    if value is None:
        return f.given(name)
    return dt.datetime.fromtimestamp(value, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
