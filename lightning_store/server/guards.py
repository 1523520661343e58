"""ASGI middleware that turns away bad requests before any route runs: no token, too large, wrong type.

Each guard answers with a JSON error and never touches the store, so a refused request writes nothing.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/v1/agl/health",)
JSON_TYPES = ("application/json",)
OTLP_TYPES = ("application/x-protobuf", "application/json")


async def _reply(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
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
    """Bearer token (when configured), body size limit (413) and content type (415), in that order."""

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
            if scheme.lower() != "bearer" or not secrets.compare_digest(credentials.encode(), self.token.encode()):
                await _reply(send, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")])
                return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, 413, f"request body over the limit of {self.max_body_bytes} bytes")
            return
        if scope["method"] in ("POST", "PUT", "PATCH") and length not in (None, "0"):
            content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            allowed = OTLP_TYPES if path == "/v1/traces" else JSON_TYPES
            if content_type not in allowed:
                await _reply(send, 415, f"content type must be one of: {', '.join(allowed)}")
                return
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            # A streamed (chunked) body has no Content-Length: read it here, counting, before any route sees it.
            body = await self._read_limited(receive)
            if body is None:
                await _reply(send, 413, f"request body over the limit of {self.max_body_bytes} bytes")
                return
            await self.app(scope, _replay(body), send)
            return
        await self.app(scope, receive, send)

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


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
