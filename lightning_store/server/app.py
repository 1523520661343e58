"""The FastAPI application behind ``store serve``.

Error contract: a caller's mistake is a 4xx whose JSON body names the field (``{"detail", "field",
"error_type"}``): 404 for an unknown id, 422 for invalid input (400 where Agent Lightning's server answers 400:
an impossible page or sort, ``null`` for a field an update cannot clear; see ``BadRequestError``), 401 without
the token, 413 over the size limit, 415 for a wrong content type. A database that cannot be reached is a 503 on
every route that needs it until it is back (clients retry it; ``/v1/agl/health`` says so too): the store raises
every outage as ``DatabaseUnavailableError`` (:func:`lightning_store.sql.engine.unavailable_reason` decides what
is one). Anything else is a bug and a 500; it is logged with its traceback, never sent to the client.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from lightning_store import aio
from lightning_store.contract import LightningStore
from lightning_store.dashboard import routes as dashboard
from lightning_store.errors import (
    BadRequestError,
    ConflictError,
    DatabaseUnavailableError,
    InvalidRequestError,
    NotFoundError,
    StoreError,
)
from lightning_store.server import (
    openapi,
    otlp,
    proxy,
    routes_export,
    routes_lists,
    routes_rollouts,
    routes_sql,
    routes_store,
)
from lightning_store.server import otlp_grpc as otlp_grpc_server
from lightning_store.server.direct_proxy import DirectProxy
from lightning_store.server.guards import Guards
from lightning_store.server.metrics import Metrics
from lightning_store.server.outage import unavailable_response
from lightning_store.server.recorder import CallRecorder, RecordCounts
from lightning_store.server.shutdown import CutOff, LongPolls
from lightning_store.settings import ServerSettings
from lightning_store.sql import commit_mark
from lightning_store.sql.engine import unavailable_reason

logger = logging.getLogger(__name__)


def create_app(
    settings: ServerSettings,
    store: LightningStore | None = None,
    *,
    freeze_heap: bool = False,
    otlp_grpc: bool = False,
    share_ports: bool = False,
) -> Any:
    """The ASGI application. Without ``store``, it opens one from ``settings`` at start-up and closes it at
    shutdown; with one, the caller owns it. ``freeze_heap``: the process is ``store serve``'s own, and what
    exists once it has started is exempted from full garbage collections (:func:`aio.freeze_startup_heap`), and
    young objects are collected less often (:func:`aio.collect_requests_young`). ``otlp_grpc``: serve OTLP/gRPC
    too while the app runs, when ``settings.otlp_grpc`` says so (its port then in ``app.state.otlp_grpc_port``);
    ``share_ports``: this is one of several processes on that port."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if store is None:
                from lightning_store.sql import open_store

                opened = await open_store(settings=settings)
                stack.push_async_callback(opened.close)
                app.state.store = opened
            else:
                app.state.store = store
            app.state.upstream_http = proxy.upstream_client(settings.upstream_timeout)
            if freeze_heap:
                aio.freeze_startup_heap()
                aio.collect_requests_young()
            stack.push_async_callback(app.state.upstream_http.close)
            app.state.recorder = CallRecorder(
                app.state.store, window=settings.call_record_window, counts=app.state.record_counts
            )
            # Last in, first out: LLM-call records still queued are written before the store closes.
            stack.push_async_callback(app.state.recorder.close)
            app.state.otlp_grpc_port = None
            if otlp_grpc and settings.otlp_grpc:
                started = await otlp_grpc_server.start(
                    app.state.store,
                    host=settings.host,
                    port=settings.otlp_grpc_port,
                    token=settings.token,
                    max_message_bytes=settings.max_body_bytes,
                    share_port=share_ports,
                )
                if started is not None:
                    stack.push_async_callback(otlp_grpc_server.stop, started[0])
                    app.state.otlp_grpc_port = started[1]
            # Long-polls end when SIGINT/SIGTERM arrives, before uvicorn's graceful shutdown waits for requests.
            stack.callback(app.state.long_polls.on_signals())
            stack.callback(app.state.long_polls.end_all)
            yield

    # /docs and /redoc with their scripts and styles served by this server (fastapi-offline ships them), not a
    # CDN: the API page works on a machine with no internet.
    app = FastAPIOffline(title="lightning-store", version="0.1.0", lifespan=lifespan)
    app.state.max_body = settings.max_body_bytes
    app.state.token = settings.token
    app.state.long_polls = LongPolls()
    app.state.llm_fallback = proxy.fallback_llm(settings)
    app.state.record_counts = RecordCounts()
    routers = (routes_store, routes_rollouts, routes_lists, routes_sql, routes_export, otlp, proxy)
    for router in (module.router for module in routers):
        app.include_router(router)
    dashboard.install(app)
    _add_error_handlers(app)
    openapi.install_openapi(app, bearer_token=settings.token is not None)
    # The guards come first: /metrics needs the token too, and refused requests never reach the app. The proxy's
    # calls are answered before FastAPI's router (DirectProxy), the other requests by FastAPI.
    app_cut_off = CutOff(DirectProxy(app), app.state.long_polls)  # cancelled at shutdown: a 503, not a 500
    guarded = Guards(
        Metrics(app_cut_off, app.state.record_counts), token=settings.token, max_body_bytes=settings.max_body_bytes
    )
    if not settings.cors_origins:
        return guarded
    # Outermost: a browser's preflight (OPTIONS, no token) is answered here, and every answer, a refusal of the
    # guards included, carries the headers that let the page read it. As Agent Lightning's --cors-origin.
    return CORSMiddleware(
        guarded,
        allow_origins=["*"] if "*" in settings.cors_origins else settings.cors_origins,
        allow_methods=["*"],
        allow_headers=["*"],
        allow_credentials=True,
        expose_headers=["*"],
    )


def _error(status: int, exc: StoreError | Exception, field: str | None = None) -> JSONResponse:
    return JSONResponse({"detail": str(exc), "field": field, "error_type": type(exc).__name__}, status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(NotFoundError)
    async def not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return _error(404, exc, exc.field)

    @app.exception_handler(ConflictError)
    async def conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return _error(409, exc, exc.field)

    @app.exception_handler(InvalidRequestError)
    async def invalid(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return _error(422, exc, exc.field)

    @app.exception_handler(BadRequestError)  # Starlette picks the handler of the most specific class
    async def bad_request(_: Request, exc: BadRequestError) -> JSONResponse:
        return _error(400, exc, exc.field)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's and Starlette's own refusals (unknown route, wrong method) in the same shape as ours.
        return JSONResponse(
            {"detail": str(exc.detail), "field": None, "error_type": "HTTPError"},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        # Named as the caller wrote it: `limit`, not `query.limit` (FastAPI's location first).
        loc = list(first["loc"])
        field = ".".join(str(part) for part in (loc[1:] if loc[:1] in (["body"], ["query"], ["path"]) else loc)) or None
        return JSONResponse(
            {
                "detail": f"{field}: {first['msg']}" if field else first["msg"],
                "field": field,
                "error_type": "ValidationError",
                "errors": _jsonable(errors),
            },
            status_code=422,
        )

    @app.exception_handler(DatabaseUnavailableError)
    async def unavailable(_: Request, exc: DatabaseUnavailableError) -> JSONResponse:
        # Not logged per request (an outage would flood the log): the watchdog logs one line per outage.
        logger.debug("answered 503: %s", exc)
        return unavailable_response(maybe_written=commit_mark.may_have_written())

    @app.exception_handler(ClientDisconnect)
    async def disconnected(request: Request, _: ClientDisconnect) -> Response:
        # The client went away before its body had arrived: nothing was read, nothing written, no one to answer.
        # One line at debug (a client that gives up is not the server's fault), no traceback; the status is the
        # one nginx logs for this (499), for the access log and the metrics.
        logger.debug("%s %s: the client disconnected before sending its whole body", request.method, request.url.path)
        return Response(status_code=499)

    @app.exception_handler(DBAPIError)
    async def database_error(_: Request, exc: DBAPIError) -> JSONResponse:
        # The store raises outages as DatabaseUnavailableError; one that comes here another way is one still.
        if unavailable_reason(exc) is not None:
            return unavailable_response(maybe_written=commit_mark.may_have_written())
        logger.error("database error", exc_info=exc)
        return JSONResponse(
            {"detail": "internal server error", "field": None, "error_type": "DatabaseError"}, status_code=500
        )


def _jsonable(errors: Any) -> Any:
    import json

    return json.loads(json.dumps(errors, default=str))
