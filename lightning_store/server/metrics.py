"""Prometheus metrics of the HTTP server, as plain ASGI middleware (no per-request task or body copy)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

from lightning_store.server.guards import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    """Counts requests and observes latency per method, route template and status; serves ``GET /metrics``
    with those and what the ``collectors`` report (the LLM proxy's record counts)."""

    def __init__(self, app: ASGIApp, *collectors: Collector) -> None:
        self.app = app
        self.registry = CollectorRegistry()
        for collector in collectors:
            self.registry.register(collector)
        self.requests = Counter(
            "lightning_store_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "lightning_store_http_request_seconds", "HTTP request latency", ["method", "route"], registry=self.registry
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/metrics" and scope["method"] == "GET":
            await self._serve(send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = _route_label(scope)
            self.requests.labels(scope["method"], route, str(status)).inc()
            self.latency.labels(scope["method"], route).observe(time.perf_counter() - started)

    async def _serve(self, send: Send) -> None:
        body = generate_latest(self.registry)
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _route_label(scope: Scope) -> str:
    """The template of the route that answered: FastAPI's routes name themselves; the plain Starlette routes
    (``/openapi.json``, ``/docs``) by their fixed path; a mount (the docs' static files) by its prefix, never the
    file asked for (a client could make up unbounded labels); ``unmatched`` when nothing matched."""
    route: Any = scope.get("route")
    if route is not None:
        return str(route.path)
    if scope.get("endpoint") is None:
        return "unmatched"
    if "app_root_path" in scope:  # a Mount set it, and root_path to the app's root plus the mount's prefix
        return f"{scope['root_path'][len(scope['app_root_path']) :]}/{{path}}"
    return str(scope["path"])
