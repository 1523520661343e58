"""Span ingest: spans per second through ``POST /v1/agl/spans/batch``, OTLP's ``POST /v1/traces`` and OTLP over
gRPC, and the CPU that ``store serve`` and PostgreSQL spend per span.

For each backend, each ``--server-workers`` count and each path, a fresh database and ``store serve``;
``--batches`` attempts are claimed, and a request of 100 spans is encoded for each before the clock starts (the
bench's spans: about 1.25 KB of JSON each, an LLM call's attributes, ``bench/server_ops_worker.py``). Then
``--clients`` concurrent clients post them (aiohttp, one connection each). Throughput is spans over wall time;
the server's CPU (every process in its group, ``/proc``) and Postgres's (every process named ``postgres``) are
divided by the spans. Every span must be stored: the store's span count is checked after each run.

* ``batch``: ``/spans/batch`` as ``HttpStore.add_many_spans`` sends it (``return_spans: false``: the answer
  names the new spans' positions and sequence ids, since the client holds the spans);
* ``batch+spans``: the same with the new spans in the answer (what other clients get by default);
* ``otlp``: an OTLP/protobuf export of 100 spans whose resource names the rollout and attempt, the store
  numbering them (what an OpenTelemetry SDK's exporter sends);
* ``otlp-grpc``: the same export over gRPC (``TraceService/Export`` on ``--otlp-grpc-port``, one channel per
  client; the request's bytes encoded in advance, as for the others).

The client's CPU (encoding is done in advance; it sends and reads answers) shares the machine with the server
and Postgres, as in the other benches.

    python -m bench.span_ingest --backends postgres --server-workers 1,2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from rich.console import Console
from rich.table import Table

from bench.harness import (
    add_postgres_url,
    database,
    free_port,
    group_cpu,
    log,
    postgres_answers,
    postgres_cpu,
    server_process,
)
from bench.server_ops_worker import span_json
from lightning_store.client import HttpStore

SPANS_PER_BATCH = 100
PATHS = ("batch", "batch+spans", "otlp", "otlp-grpc")
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def batch_body(rollout_id: str, attempt_id: str, *, return_spans: bool) -> bytes:
    spans = [span_json(rollout_id, attempt_id, n + 1) for n in range(SPANS_PER_BATCH)]
    return json.dumps({"spans": spans} | ({} if return_spans else {"return_spans": False})).encode()


def _any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        found = AnyValue()
        found.array_value.values.extend(_any_value(item) for item in value)
        return found
    return AnyValue(string_value=str(value))


def otlp_body(rollout_id: str, attempt_id: str) -> bytes:
    """The same spans as :func:`batch_body`, as an OTLP export whose resource binds them to the attempt."""
    export = ExportTraceServiceRequest()
    resource_spans = export.resource_spans.add()
    resource = {
        "service.name": "bench",
        "agentlightning.rollout_id": rollout_id,
        "agentlightning.attempt_id": attempt_id,
    }
    resource_spans.resource.attributes.extend(KeyValue(key=k, value=_any_value(v)) for k, v in resource.items())
    scope_spans = resource_spans.scope_spans.add()
    for n in range(SPANS_PER_BATCH):
        span = span_json(rollout_id, attempt_id, n + 1)
        proto = scope_spans.spans.add()
        proto.trace_id = bytes.fromhex(span["trace_id"])
        proto.span_id = bytes.fromhex(span["span_id"])
        proto.parent_span_id = bytes.fromhex(span["parent_id"])
        proto.name = span["name"]
        proto.start_time_unix_nano = int(span["start_time"] * 1e9)
        proto.end_time_unix_nano = int(span["end_time"] * 1e9)
        proto.status.code = Status.STATUS_CODE_OK
        proto.attributes.extend(KeyValue(key=k, value=_any_value(v)) for k, v in span["attributes"].items())
    return export.SerializeToString()


async def _claimed(url: str, count: int) -> list[tuple[str, str]]:
    store = HttpStore(url)
    try:
        await store.enqueue_many_rollouts([{"input": {"i": i}} for i in range(count)])  # type: ignore[misc]
        claimed = await store.dequeue_many_rollouts(limit=count)
        return [(rollout.rollout_id, rollout.attempt.attempt_id) for rollout in claimed]
    finally:
        await store.close()


async def _stored_spans(url: str) -> int:
    store = HttpStore(url)
    try:
        return int((await store.statistics()).get("total_spans", -1))
    finally:
        await store.close()


async def _post_all(url: str, path: str, bodies: list[bytes], clients: int) -> None:
    route, content_type, status = (
        ("/v1/traces", "application/x-protobuf", 200)
        if path == "otlp"
        else ("/v1/agl/spans/batch", "application/json", 201)
    )
    queue = list(reversed(bodies))

    async def client() -> None:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(url, connector=connector) as session:
            while queue:
                body = queue.pop()
                async with session.post(route, data=body, headers={"content-type": content_type}) as answer:
                    await answer.read()
                    if answer.status != status:
                        raise RuntimeError(f"{route} answered {answer.status}: {(await answer.text())[:300]}")

    await asyncio.gather(*(client() for _ in range(clients)))


async def _export_all(address: str, bodies: list[bytes], clients: int) -> None:
    """Each client on a gRPC channel of its own, sending encoded requests (no serializer: bytes go as they are)."""
    queue = list(reversed(bodies))

    async def client() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            export: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(EXPORT_METHOD)
            while queue:
                answer = ExportTraceServiceResponse.FromString(await export(queue.pop(), timeout=120))
                if answer.partial_success.rejected_spans:
                    raise RuntimeError(f"gRPC export rejected spans: {answer.partial_success.error_message}")

    await asyncio.gather(*(client() for _ in range(clients)))


def measure(url: str, grpc_address: str, pgid: int, path: str, args: argparse.Namespace) -> dict[str, float]:
    attempts = asyncio.run(_claimed(url, args.batches))
    if path.startswith("otlp"):
        bodies = [otlp_body(r, a) for r, a in attempts]
    else:
        bodies = [batch_body(r, a, return_spans=path == "batch+spans") for r, a in attempts]
    before = asyncio.run(_stored_spans(url))
    server0, pg0, wall0 = group_cpu(pgid), postgres_cpu(), time.perf_counter()
    if path == "otlp-grpc":
        asyncio.run(_export_all(grpc_address, bodies, args.clients))
    else:
        asyncio.run(_post_all(url, path, bodies, args.clients))
    server1, pg1, wall1 = group_cpu(pgid), postgres_cpu(), time.perf_counter()
    spans = len(bodies) * SPANS_PER_BATCH
    stored = asyncio.run(_stored_spans(url)) - before
    if stored != spans:
        raise RuntimeError(f"{path}: {stored} spans stored of {spans} sent")
    return {
        "spans_per_s": spans / (wall1 - wall0),
        "server_cpu_us": (server1 - server0) / spans * 1e6,
        "postgres_cpu_us": (pg1 - pg0) / spans * 1e6,
    }


def run(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    backends = [b for b in args.backends.split(",") if b != "postgres" or postgres_answers(args.postgres_url)]
    results = []
    for backend in backends:
        for workers in args.server_workers if backend == "postgres" else [1]:
            for path in args.paths:
                grpc_port = free_port()
                extra = ["--otlp-grpc-port", str(grpc_port), *(["--workers", str(workers)] if workers > 1 else [])]
                with (
                    database(backend, args.postgres_url, directory) as database_url,
                    server_process(backend, directory, database_url, extra=extra) as (url, process),
                ):
                    found = measure(url, f"127.0.0.1:{grpc_port}", process.pid, path, args)
                if backend != "postgres":
                    found["postgres_cpu_us"] = 0.0
                log(f"[{backend} x{workers}] {path}: {found['spans_per_s']:,.0f} spans/s")
                results.append({"backend": backend, "server_workers": workers, "path": path} | found)
    return results


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def _paths(text: str) -> list[str]:
    paths = text.split(",")
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown paths {sorted(unknown)}; known: {', '.join(PATHS)}")
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400, help=f"requests of {SPANS_PER_BATCH} spans per run")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients")
    parser.add_argument("--server-workers", type=_int_list, default=[1, 2], help="store serve --workers (Postgres)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--paths", type=_paths, default=list(PATHS), help=f"of {', '.join(PATHS)}")
    add_postgres_url(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ls-bench-ingest-") as tmp:
        results = run(args, Path(tmp))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    shape = f"{args.batches} x {SPANS_PER_BATCH} spans, {args.clients} clients, {os.cpu_count()} CPUs"
    title = f"span ingest ({shape})"
    table = Table(title=title)
    for column in ("backend", "server processes", "path", "spans/s", "server CPU µs/span", "Postgres CPU µs/span"):
        table.add_column(column, justify="left" if column in ("backend", "path") else "right")
    for r in results:
        table.add_row(
            r["backend"],
            str(r["server_workers"]),
            r["path"],
            f"{r['spans_per_s']:,.0f}",
            f"{r['server_cpu_us']:.1f}",
            f"{r['postgres_cpu_us']:.1f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
