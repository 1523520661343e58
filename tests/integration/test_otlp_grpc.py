"""OTLP over gRPC (``store serve``'s port 4317): the same spans, limits, partial successes and token as
``POST /v1/traces``, on SQLite and Postgres.

The senders are real: OpenTelemetry's own gRPC span exporter (``opentelemetry-exporter-otlp-proto-grpc``, with
gzip and the token in its ``headers``) and gRPC's generated ``TraceServiceStub`` for requests built by hand (to
read the partial-success answer, which the exporter only logs). The server is the real app, in process, on
127.0.0.1 (``create_app(..., otlp_grpc=True)``, as ``store serve`` makes it); the last test runs ``store serve``
itself. No OpenTelemetry Collector is packaged where these tests install from (PyPI, Debian), so the Collector's
gRPC exporter is not among the senders.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from lightning_store.client import HttpStore
from lightning_store.models import AttemptedRollout
from lightning_store.server.app import create_app
from lightning_store.settings import ServerSettings
from lightning_store.sql import SqlStore
from tests.acceptance.test_serve import CLEAN_EXIT, Server, wait_healthy
from tests.conftest import SQL_BACKENDS, serve_app

pytestmark = SQL_BACKENDS
TOKEN = "s3cret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def grpc_and_http(store: SqlStore, **settings: Any) -> AsyncIterator[tuple[str, str]]:
    """The app with OTLP/gRPC on a free port: its HTTP URL and its gRPC address."""
    port = free_port()
    app = create_app(ServerSettings(otlp_grpc_port=port, **settings), store=store, otlp_grpc=True)
    async with serve_app(app) as url:
        yield url, f"127.0.0.1:{port}"


def ids(rollout: AttemptedRollout) -> list[KeyValue]:
    return [
        KeyValue(key="agentlightning.rollout_id", value=AnyValue(string_value=rollout.rollout_id)),
        KeyValue(key="agentlightning.attempt_id", value=AnyValue(string_value=rollout.attempt.attempt_id)),
    ]


def request(rollout: AttemptedRollout | None, spans: list[tuple[str, dict[str, str]]]) -> ExportTraceServiceRequest:
    """One resource (with ``rollout``'s ids) holding ``spans`` (name, string attributes)."""
    built = [
        Span(
            trace_id=bytes.fromhex("5b8efff798038103d269b633813fc60c"),
            span_id=(i + 1).to_bytes(8, "big"),
            name=name,
            start_time_unix_nano=1_700_000_000_000_000_000,
            end_time_unix_nano=1_700_000_001_000_000_000,
            attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items()],
        )
        for i, (name, attributes) in enumerate(spans)
    ]
    resource_spans = ResourceSpans(scope_spans=[ScopeSpans(spans=built)])
    if rollout is not None:
        resource_spans.resource.attributes.extend(ids(rollout))
    return ExportTraceServiceRequest(resource_spans=[resource_spans])


async def export(address: str, message: ExportTraceServiceRequest, token: str | None = TOKEN) -> Any:
    metadata = [("authorization", f"Bearer {token}")] if token else []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = TraceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated code
        return await stub.Export(message, metadata=metadata, timeout=10)


def stored_form(spans: list[Any]) -> list[dict[str, Any]]:
    """What a stored span holds apart from its rollout, attempt and sequence number."""
    forms = []
    for span in spans:
        form = span.model_dump(mode="json", exclude={"rollout_id", "attempt_id", "sequence_id"})
        attributes = form["resource"]["attributes"]
        form["resource"]["attributes"] = {k: v for k, v in attributes.items() if not k.startswith("agentlightning.")}
        forms.append(form)
    return forms


async def test_grpc_stores_what_http_stores_and_rejects_the_same_spans_alone(sql_store: SqlStore) -> None:
    by_grpc, by_http = await sql_store.start_rollout(1), await sql_store.start_rollout(2)
    spans = [("plan", {"k": "v"}), ("nul", {"k": "bad\x00value"}), ("answer", {"n": "1"})]
    async with grpc_and_http(sql_store, token=TOKEN) as (url, address):
        answer = await export(address, request(by_grpc, spans))
        orphan = await export(address, request(None, [("no ids", {})]))
        body = request(by_http, spans).SerializeToString()
        async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {TOKEN}"}) as http:
            posted = await http.post("/v1/traces", content=body, headers={"content-type": "application/x-protobuf"})
    assert posted.status_code == 200, posted.text
    # The span with a NUL is rejected alone, as over HTTP; one without ids too.
    assert answer.partial_success.rejected_spans == 1 and "NUL" in answer.partial_success.error_message
    assert orphan.partial_success.rejected_spans == 1 and "rollout" in orphan.partial_success.error_message
    grpc_spans = (await sql_store.query_spans(by_grpc.rollout_id)).items
    http_spans = (await sql_store.query_spans(by_http.rollout_id)).items
    assert [s.name for s in grpc_spans] == ["plan", "answer"]
    assert stored_form(grpc_spans) == stored_form(http_spans)
    attempt = await sql_store.get_latest_attempt(by_grpc.rollout_id)
    assert attempt is not None and attempt.status == "running"  # a span is a heartbeat, as over HTTP


async def test_the_token_and_unknown_attempts_are_refused_with_statuses_exporters_know(sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    async with grpc_and_http(sql_store, token=TOKEN) as (_, address):
        for token in (None, "wrong"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await export(address, request(rollout, [("x", {})]), token=token)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        unknown = rollout.model_copy(update={"attempt": rollout.attempt.model_copy(update={"attempt_id": "at-nope"})})
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await export(address, request(unknown, [("x", {})]))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "at-nope" in (missing.value.details() or "")
    assert (await sql_store.query_spans(rollout.rollout_id)).items == []


def export_with_sdk(address: str, resource: dict[str, Any], names: list[str], size: int) -> bool:
    exporter = OTLPSpanExporter(
        endpoint=f"http://{address}",
        insecure=True,
        headers={"authorization": f"Bearer {TOKEN}"},
        compression=grpc.Compression.Gzip,
    )
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for name in names:
        with tracer.start_as_current_span(name, attributes={"payload": "x" * size}):
            pass
    provider.shutdown()
    return True


async def test_the_sdks_grpc_exporter_with_gzip_and_a_message_past_grpcs_default_limit(sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    resource = {
        "agentlightning.rollout_id": rollout.rollout_id,
        "agentlightning.attempt_id": rollout.attempt.attempt_id,
    }
    async with grpc_and_http(sql_store, token=TOKEN) as (_, address):
        await asyncio.to_thread(export_with_sdk, address, resource, ["small", "large"], 10)
        # 5 MiB of attributes: past gRPC's default 4 MiB, within the server's --max-body-bytes (32 MiB).
        await asyncio.to_thread(export_with_sdk, address, resource, ["huge"], 5 * 1024 * 1024)
    stored = (await sql_store.query_spans(rollout.rollout_id)).items
    assert [s.name for s in stored] == ["small", "large", "huge"]
    assert len(stored[2].attributes["payload"]) == 5 * 1024 * 1024
    assert stored[0].resource.attributes["service.name"]


async def test_store_serve_listens_on_its_grpc_port_unless_told_not_to(database_url: str, tmp_path: Path) -> None:
    """``store serve`` itself: OTLP/gRPC on ``--otlp-grpc-port``, in every process of ``--workers 2`` (Postgres);
    none with ``--no-otlp-grpc``."""
    postgres = database_url.startswith("postgresql")
    grpc_port = free_port()
    workers = ["--workers", "2"] if postgres else []
    served = Server("--database-url", database_url, "--otlp-grpc-port", str(grpc_port), *workers, cwd=tmp_path)
    try:
        await wait_healthy(served.url, served.process)
        client = HttpStore(served.url)
        rollouts = [await client.start_rollout(i) for i in range(4)]
        for rollout in rollouts:  # several channels: with two processes, each may answer some
            await export(f"127.0.0.1:{grpc_port}", request(rollout, [("hello", {})]), token=None)
        assert [len((await client.query_spans(r.rollout_id)).items) for r in rollouts] == [1, 1, 1, 1]
        await client.close()
    finally:
        assert served.stop() in CLEAN_EXIT
    quiet = Server("--database-url", database_url, "--otlp-grpc-port", str(grpc_port), "--no-otlp-grpc", cwd=tmp_path)
    try:
        await wait_healthy(quiet.url, quiet.process)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(f"127.0.0.1:{grpc_port}", request(None, []), token=None)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # nothing listens
    finally:
        assert quiet.stop() in CLEAN_EXIT
