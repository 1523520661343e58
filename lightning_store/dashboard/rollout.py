"""One rollout: ``GET /dashboard/rollouts/{rollout_id}``, and the token ids of one of its LLM calls, a fragment
the page loads when the reader opens them (``…/calls/{span_id}/tokens``).

An unknown rollout (or call) is a 404 HTML page (fragment), never JSON: a person follows these links.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from lightning_store.dashboard.reader import reader_of
from lightning_store.dashboard.rollout_data import MAX_SPANS, call_tokens, rollout_view
from lightning_store.dashboard.templating import render
from lightning_store.dashboard.timing import TimedReader

router = APIRouter()


@router.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
async def rollout(request: Request, rollout_id: str) -> Response:
    """The rollout's page (200), or a page saying the store has no such rollout (404)."""
    reader = TimedReader(reader_of(request))
    view = await rollout_view(reader, request.app.state.store, rollout_id)
    if view is None:
        return reader.stamp(
            render(request, "rollout_missing.html", {"page": "rollouts", "rollout_id": rollout_id}, status_code=404)
        )
    base = f"/dashboard/rollouts/{quote(rollout_id, safe='')}"
    for attempt in view.attempts:
        for call in attempt.calls:
            call["tokens_url"] = f"{base}/calls/{quote(call['span_id'] or '', safe='')}/tokens"
    context = {"page": "rollouts", "v": view, "r": view.rollout, "max_spans": MAX_SPANS}
    return reader.stamp(render(request, "rollout.html", context))


@router.get("/rollouts/{rollout_id}/calls/{span_id:path}/tokens", response_class=HTMLResponse)
async def tokens(request: Request, rollout_id: str, span_id: str) -> Response:
    """The token ids (and logprobs) of the call whose span is ``span_id``: an HTML fragment (404 when the
    rollout has no such call)."""
    reader = TimedReader(reader_of(request))
    found = await call_tokens(reader, request.app.state.store, rollout_id, span_id)
    context = {"rollout_id": rollout_id, "span_id": span_id, "t": found}
    return reader.stamp(render(request, "rollout_tokens.html", context, status_code=200 if found else 404))


@router.get("/rollouts/{rollout_id:path}", response_class=HTMLResponse)
async def no_such_rollout(request: Request, rollout_id: str) -> Response:
    """Any other path under ``/dashboard/rollouts/``: a rollout id cannot hold a ``/``, so no rollout is there."""
    reader = TimedReader(reader_of(request))
    context = {"page": "rollouts", "rollout_id": rollout_id}
    return reader.stamp(render(request, "rollout_missing.html", context, status_code=404))
