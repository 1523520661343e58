"""The LLM proxy's routes served as plain ASGI, ahead of FastAPI's router.

Why: every proxied call paid FastAPI's way to its endpoint: five middlewares, a router that tries the server's
routes in order (the proxy's come last), dependency solving. That was about 0.2 ms of CPU per call, a fifth of
the proxy's own work (ADR 0017, docs/benchmarks.md), for a body FastAPI never validates (it is the agent's
OpenAI request, forwarded as it came).

Contract: a ``POST`` to ``/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions`` (or
``…/v1/completions``), or to ``/v1/chat/completions`` or ``/v1/completions``, is answered here exactly as its
FastAPI route would answer it: the same body door (:class:`~lightning_store.server.json_body.CheckedJsonRequest`),
the same function (:func:`~lightning_store.server.proxy.forward`), the application's own exception handlers
for its errors, and the route's template in ``scope["route"]`` for the metrics' label. An exception no handler
takes goes up as it would from FastAPI: uvicorn logs it and answers 500. Every other request goes to FastAPI,
whose proxy routes stay: they document the proxy in the OpenAPI document and answer the paths this does not take
(another ``…/v1/{kind}`` is their 404).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from lightning_store.server import proxy
from lightning_store.server.guards import Receive, Scope, Send
from lightning_store.server.json_body import CheckedJsonRequest

_BOUND = re.compile(r"/rollout/([^/]+)/attempt/([^/]+)/v1/(chat/completions|completions)")
_BY_HEADERS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions"}


class DirectProxy:
    """ASGI middleware over ``app`` (the FastAPI application) that answers the proxy's calls itself."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        routes = {route.endpoint: route for route in proxy.router.routes if isinstance(route, APIRoute)}
        self._bound_route = routes[proxy.proxy_bound]
        self._header_routes = {
            "chat/completions": routes[proxy.proxy_chat],
            "completions": routes[proxy.proxy_completions],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = self._match(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if call is None:
            await self.app(scope, receive, send)
            return
        route, rollout_id, attempt_id, kind = call
        scope["app"], scope["route"] = self.app, route  # what request.app and the metrics' label read
        request = CheckedJsonRequest(scope, receive)
        try:
            response = await proxy.forward(request, self.app.state.store, rollout_id, attempt_id, kind)
        except Exception as exc:
            handler = _handler(self.app.exception_handlers, exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[APIRoute, str | None, str | None, str] | None:
        path = scope["path"]
        if (bound := _BOUND.fullmatch(path)) is not None:
            return self._bound_route, bound.group(1), bound.group(2), bound.group(3)
        if (kind := _BY_HEADERS.get(path)) is None:
            return None
        return self._header_routes[kind], _header(scope, b"x-rollout-id"), _header(scope, b"x-attempt-id"), kind


def _header(scope: Scope, name: bytes) -> str | None:
    """The first value of header ``name``, as Starlette's ``request.headers.get`` reads it."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The handler Starlette would pick for ``exc``: the first of its classes, most specific first, with one."""
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
