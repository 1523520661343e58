"""What the server answers while its database cannot be reached: 503 on every route that needs it (the client
retries), and ``/v1/agl/health`` says which part is down."""

from __future__ import annotations

from fastapi.responses import JSONResponse

HEALTH_TIMEOUT = 2.0
"""Seconds ``/v1/agl/health`` waits for the database's ``SELECT 1`` before it reports it unreachable."""


def unavailable_response(*, maybe_written: bool = False, **extra: str) -> JSONResponse:
    """503 with the error body every route uses (plus ``extra`` keys) and ``Retry-After``. It says nothing of why:
    the reason (an address, a role) is the server log's, not the client's. ``maybe_written``: a write of the request
    had sent its commit when the database went away, so it may have been done (:mod:`~lightning_store.sql.commit_mark`);
    only an idempotent request is then safe to send again."""
    body: dict[str, object] = {**extra, "detail": "database unavailable, retry", "field": None}
    body |= {"error_type": "Unavailable", "maybe_written": maybe_written}
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})
