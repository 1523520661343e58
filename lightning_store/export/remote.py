"""``store export --store http://…``: the export's events from a ``store serve`` (``POST /v1/export``), for
:func:`~lightning_store.export.exporter.write_export` to write as it writes a local export.

Errors before the stream begins are the server's answers, raised as this process would raise them locally: a 400
naming a filter is :class:`ExportFilterError` (its option), a 401 ``UnauthorizedError``, a 503 or an unreachable
server ``DatabaseUnavailableError``-like :class:`RemoteExportError` with one line.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import httpx

from lightning_store.errors import UnauthorizedError
from lightning_store.export.events import Event, RemoteExportError, decode
from lightning_store.export.queries import ExportFilterError, ExportFilters

READ_TIMEOUT = 600.0
"""Seconds between two lines of the answer: a batch of a large file on a busy database may take a while."""


def request_body(filters: ExportFilters, what: list[str] | None, batch_size: int | None) -> dict[str, Any]:
    return {
        "what": what,
        "mode": list(filters.modes),
        "since": filters.since,
        "until": filters.until,
        "resources_id": list(filters.resources_ids),
        "resources_version": list(filters.resources_versions),
        "run": filters.run,
        "batch_size": batch_size,
    }


async def server_events(url: str, token: str | None, body: dict[str, Any]) -> AsyncGenerator[Event]:
    """The events the server at ``url`` streams for ``body``; raises before the first event when it refuses."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout) as client:
        try:
            async with client.stream("POST", "/v1/export", json=body) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    _refusal(url, answer)
                async for line in answer.aiter_lines():
                    if line.strip():
                        yield decode(line)
        except httpx.TransportError as exc:
            raise RemoteExportError(
                f"cannot reach the store at {url} ({type(exc).__name__}): is `store serve` running there?"
            ) from None


def _refusal(url: str, answer: httpx.Response) -> None:
    try:
        detail = answer.json()
    except ValueError:
        detail = {}
    message = str(detail.get("detail") or answer.text[:200]) if isinstance(detail, dict) else answer.text[:200]
    if answer.status_code == 401:
        raise UnauthorizedError(message)
    field = detail.get("field") if isinstance(detail, dict) else None
    if answer.status_code in (400, 422) and isinstance(field, str):
        raise ExportFilterError(f"--{field.replace('_', '-')}", message)
    if answer.status_code == 404:
        message = "this server has no /v1/export route (an older store serve, or not a store serve)"
    raise RemoteExportError(f"{url} answered {answer.status_code}: {message}")
