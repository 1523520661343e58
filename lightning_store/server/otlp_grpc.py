"""OTLP over gRPC: the ``TraceService/Export`` of ``store serve``, on its own port (4317 by default).

OpenTelemetry's SDK exporters and the Collector send gRPC by default; this accepts what ``POST /v1/traces``
accepts and answers the same way, since both go through :func:`lightning_store.server.otlp.ingest`: the same
conversion, limits and partial-success answers (a span without ids or past the limits is rejected alone). The
bearer token, when the server has one, comes in the ``authorization`` metadata (``Bearer TOKEN``), as the
exporters' ``headers`` send it. A request is at most ``max_body_bytes`` (gRPC's own limit is 4 MiB).

Errors are gRPC statuses an exporter knows what to do with: a missing or wrong token ``UNAUTHENTICATED``, an
unknown rollout or attempt ``NOT_FOUND``, anything else the store refuses ``INVALID_ARGUMENT`` (none of them
retried), a database that cannot be reached ``UNAVAILABLE`` (retried, as OTLP says).

The server runs in the HTTP server's event loop (started and stopped by the app's lifespan), so a ``store serve``
of several processes has one in each, sharing the port as they share the HTTP one (``SO_REUSEPORT``); a single
process binds it alone, so that a second ``store serve`` on the same machine cannot take half its traffic.
"""

from __future__ import annotations

import logging
import os
import secrets

# gRPC's C core prints its own errors on stderr (a port it cannot bind, in three lines): ours say it in one.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
import grpc  # (after the line above, which the core reads when it starts)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from lightning_store.contract import LightningStore
from lightning_store.errors import DatabaseUnavailableError, NotFoundError, StoreError
from lightning_store.server.otlp import ingest

logger = logging.getLogger(__name__)
Context = grpc.aio.ServicerContext[ExportTraceServiceRequest, ExportTraceServiceResponse]

GRACE_SECONDS = 1.0
"""How long a stopping server lets exports in flight finish."""


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    """``opentelemetry.proto.collector.trace.v1.TraceService`` over ``store``."""

    def __init__(self, store: LightningStore, token: str | None) -> None:
        self.store = store
        self.token = token

    async def Export(  # (the name gRPC's generated servicer gives it)
        self, request: ExportTraceServiceRequest, context: Context
    ) -> ExportTraceServiceResponse:
        if self.token is not None and not self._authorized(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required (authorization metadata)")
        try:
            return await ingest(self.store, request)
        except NotFoundError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.message)
        except DatabaseUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the store's database cannot be reached: {exc}")
        except StoreError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        raise AssertionError("unreachable: abort raises")

    def _authorized(self, context: Context) -> bool:
        assert self.token is not None
        for key, value in context.invocation_metadata() or ():
            if key.lower() != "authorization" or not isinstance(value, str):
                continue
            scheme, _, credentials = value.partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(credentials.encode(), self.token.encode()):
                return True
        return False


async def start(
    store: LightningStore, *, host: str, port: int, token: str | None, max_message_bytes: int, share_port: bool
) -> tuple[grpc.aio.Server, int] | None:
    """Serve OTLP/gRPC on ``host:port`` (0: a free port); the server and its port, or ``None`` (with a warning)
    when the port cannot be bound: the HTTP API, OTLP/HTTP included, still serves."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 1 if share_port else 0),
        ]
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]  # generated code
        TraceService(store, token), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        bound = 0
        reason = str(exc)
    else:
        reason = "in use?"
    if not bound:
        logger.warning(
            "OTLP/gRPC not served: cannot listen on %s (%s); OTLP/HTTP at /v1/traces still is "
            "(--otlp-grpc-port picks another port, --no-otlp-grpc turns this off)",
            address,
            reason,
        )
        return None
    await server.start()
    logger.info("OTLP/gRPC traces at %s", f"{host}:{bound}")
    return server, bound


async def stop(server: grpc.aio.Server) -> None:
    await server.stop(GRACE_SECONDS)
