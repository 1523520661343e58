"""ASGI middleware that turns away bad requests before any route runs: no token, too large, wrong type.

Each guard answers with a JSON error and never touches the store, so a refused request writes nothing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

from lightning_store.dashboard import auth as dashboard_auth

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/v1/agl/health", "/")  # "/" only redirects to the dashboard, which asks for the token itself
JSON_TYPES = ("application/json",)
OTLP_TYPES = ("application/x-protobuf", "application/json")


async def _reply(
    send: Send,
    status: int,
    detail: str,
    error_type: str,
    field: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An error in the server's one shape (see ``server/app.py``)."""
    body = json.dumps({"detail": detail, "field": field, "error_type": error_type}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class Guards:
    """Bearer token (when configured), a path or query with a NUL character (422), body size limit (413) and
    content type (415), in that order."""

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.token is not None and path not in OPEN_PATHS:
            given = _header(scope, b"authorization") or ""
            scheme, _, credentials = given.partition(" ")
            bearer = scheme.lower() == "bearer" and secrets.compare_digest(credentials.encode(), self.token.encode())
            if not bearer and dashboard_auth.is_dashboard(path):
                # The dashboard's pages also take the session cookie its login sets (see dashboard/auth.py).
                if not (
                    dashboard_auth.is_open(path) or dashboard_auth.cookie_matches(_header(scope, b"cookie"), self.token)
                ):
                    await self._to_login(scope, send)
                    return
            elif not bearer:
                await _reply(
                    send,
                    401,
                    "missing or wrong bearer token",
                    "Unauthorized",
                    headers=[(b"www-authenticate", b"Bearer")],
                )
                return
        # Starlette decodes %00 into the path; no id or filter may hold a NUL (see lightning_store.limits).
        if "\x00" in path or b"%00" in scope.get("query_string", b""):
            field = "path" if "\x00" in path else "query"
            await _reply(send, 422, f"{field}: contains a NUL character", "InvalidRequestError", field)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        too_large = f"request body over the limit of {self.max_body_bytes} bytes"
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, 413, too_large, "PayloadTooLarge", "body")
            return
        streamed: bytes | None = None
        if length is None:
            # A streamed (chunked) body has no Content-Length: read it here, counting, before any route sees it.
            streamed = await self._read_limited(receive)
            if streamed is None:
                await _reply(send, 413, too_large, "PayloadTooLarge", "body")
                return
        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        allowed = OTLP_TYPES if path == "/v1/traces" else JSON_TYPES
        if content_type not in allowed and (length not in (None, "0") or streamed):
            await _reply(
                send, 415, f"content type must be one of: {', '.join(allowed)}", "UnsupportedMediaType", "body"
            )
            return
        await self.app(scope, receive if streamed is None else _replay(streamed, receive), send)

    async def _to_login(self, scope: Scope, send: Send) -> None:
        """A page load without the token goes to the login page (which comes back here); anything else is a 401."""
        if scope["method"] not in ("GET", "HEAD"):
            await _reply(send, 401, "missing or wrong token", "Unauthorized")
            return
        here = scope["path"] + (f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else "")
        location = f"{dashboard_auth.LOGIN_PATH}?next={quote(here, safe='')}"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [(b"location", location.encode("latin-1")), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    async def _read_limited(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read ahead, then the connection's own messages (so that a disconnect is seen when it happens)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
