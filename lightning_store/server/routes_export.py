"""``POST /v1/export``: the store's export files as a stream of JSON lines (an addition).

What ``store export --store http://…`` sends, so that a user exports the server's store from any directory or
machine, with the server's token, instead of opening a database file that may not be the server's. The server
reads its own database as ``store export`` would (the documented views, one read-only snapshot, streamed a batch at
a time: memory stays flat) and sends the events of :mod:`lightning_store.export.events`; the client writes the
files. A filter that selects nothing as given (an unknown ``run``) is a 400 naming it before anything is sent; a
failure midway ends the stream with an ``error`` event, and a stream without its ``done`` event is incomplete.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from lightning_store.errors import BadRequestError, InvalidRequestError
from lightning_store.export.events import Event, checked_names, encode, error_line, export_events
from lightning_store.export.queries import ExportFilterError, ExportFilters
from lightning_store.limits import MAX_INT32, Id
from lightning_store.server import wire
from lightning_store.server.json_body import CheckedJsonRoute

router = APIRouter(prefix="/v1", route_class=CheckedJsonRoute)
logger = logging.getLogger(__name__)

MAX_BATCH = 100_000
EVENT_LINE = {
    "type": "object",
    "description": "One line of the stream: begin, then per file `file`, `rows` (the file's columns) and `end_file`, "
    "then done; `error` ends a stream that failed midway.",
    "properties": {
        "event": {"type": "string", "enum": ["begin", "file", "rows", "end_file", "done", "error"]},
        "schema_revision": {"type": ["string", "null"]},
        "database": {"type": "string"},
        "file": {"type": "string"},
        "batch_size": {"type": "integer"},
        "columns": {"type": "array", "items": {"type": "array"}},
        "message": {"type": "string"},
    },
    "required": ["event"],
}
"""The schema of one line of ``POST /v1/export``'s answer (for the OpenAPI document)."""
FileName = Literal["rollouts", "attempts", "llm_calls", "spans", "training_steps"]


class ExportBody(wire.Body):
    what: list[FileName] | None = Field(default=None, description="The files to export; default every file.")
    mode: list[Literal["train", "val", "test"]] = Field(default=[], description="Only rollouts of these modes.")
    since: float | None = Field(default=None, description="Only rollouts enqueued at or after (epoch seconds).")
    until: float | None = Field(default=None, description="Only rollouts enqueued before (epoch seconds).")
    resources_id: list[Id] = Field(default=[], description="Only rollouts run against these resources ids.")
    resources_version: list[int] = Field(
        default=[], description="Only rollouts whose latest attempt ran on these resources versions."
    )
    run: Id | None = Field(default=None, description="Only this training or APO run (its run_id).")
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH, description="Rows a batch; default per file.")


@router.post(
    "/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-ndjson": {"schema": EVENT_LINE}},
            "description": "The export's events, one JSON line each (docs/reference/http.md).",
        },
        400: {"description": "A filter that cannot select as given: `detail` and `field`."},
    },
)
async def export(body: ExportBody, request: Request) -> StreamingResponse:
    """Stream the export's events (addition: `store export --store URL` sends it)."""
    store = request.app.state.store
    database: Any = getattr(store, "engine", None) or getattr(store, "url", None)
    if database is None:  # a store without a database of its own
        raise InvalidRequestError("this server's store has no database to export", field="what")
    try:
        if any(not 0 <= version <= MAX_INT32 for version in body.resources_version):
            raise ExportFilterError("--resources-version", f"a resources version is between 0 and {MAX_INT32}")
        filters = ExportFilters(
            modes=tuple(dict.fromkeys(body.mode)),
            since=body.since,
            until=body.until,
            resources_ids=tuple(dict.fromkeys(body.resources_id)),
            resources_versions=tuple(dict.fromkeys(body.resources_version)),
            run=body.run,
        )
        events = export_events(database, filters=filters, names=checked_names(body.what), batch_size=body.batch_size)
        first = await anext(events)  # the filters resolved and the database checked before the answer starts
    except ExportFilterError as exc:
        raise BadRequestError(exc.message, field=exc.option.removeprefix("--").replace("-", "_")) from None
    return StreamingResponse(_lines(first, events), media_type="application/x-ndjson")


async def _lines(first: Event, events: AsyncGenerator[Event]) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(events):
        yield encode(first)
        try:
            async for event in events:
                yield encode(event)
        except Exception as exc:  # the answer has begun: the error travels as its last line
            logger.warning("export failed midway: %s: %s", type(exc).__name__, exc)
            yield error_line(f"{type(exc).__name__}: {exc}")
