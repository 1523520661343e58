"""Benchmark of the store's hot paths, called through the store API in one process. (Past 400 lines: five
workloads and the memory check that share one store and one table; each is a short function.)

For each backend it measures:

* ``enqueue``            - ``enqueue_rollout``, one rollout per call;
* ``enqueue_many x100``  - ``enqueue_many_rollouts`` with batches of 100;
* ``dequeue``            - ``dequeue_rollout`` (claim + attempt), optionally from ``--concurrency`` tasks;
* ``add_many_spans x100``- batches of 100 realistic spans (a dozen attributes, about 1 KB each), 100 per attempt;
* ``query_spans``        - all spans of one rollout that has 100;

and reports throughput (items per second: rollouts, spans or queries), p50/p99 latency per call, the resident set
size after 10% and after 100% of the spans (10k and 100k by default: memory should not grow with stored spans),
and the process's peak RSS. Postgres's batched ingest is also compared with the target of 20,000 spans/s.

Run from the repository root::

    python -m bench.store_ops                                   # both backends, default sizes
    python -m bench.store_ops --backends sqlite --rollouts 200 --spans 2000
    python -m bench.store_ops --concurrency 8 --json > bench.json

SQLite runs on a file in a temporary directory. Postgres runs in a database created for the run (and dropped
afterwards) on the server at ``$LIGHTNING_STORE_BENCH_POSTGRES_URL`` (default: the local trust-auth server,
``postgresql://postgres@127.0.0.1:5432/postgres``); when that server does not answer, the backend is skipped.

Numbers depend on the machine and on what else runs on it; treat them as indicative. The peak RSS is the whole
process's, so a later backend's peak includes an earlier one's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.harness import Timed, add_postgres_url, async_postgres_database, postgres_reachable
from bench.server_ops_worker import span_json
from lightning_store.models import AttemptedRollout, EnqueueRolloutRequest
from lightning_store.spans import Span
from lightning_store.sql import SqlStore, open_store

BATCH = 100
TARGET_SPANS_PER_SECOND = 20_000


@dataclass
class OpResult(Timed):
    """One measured operation: ``calls`` store calls that handled ``items`` items in ``seconds``."""

    operation: str
    unit: str
    calls: int
    items: int
    seconds: float
    latencies: list[float] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"operation": self.operation, "unit": self.unit, **self.timing_json()}


@dataclass
class MemoryResult:
    """Resident set size (MiB) after part and after all of the span ingest, and the process's peak so far."""

    spans_at_checkpoint: int
    rss_at_checkpoint_mib: float
    spans_total: int
    rss_at_end_mib: float
    peak_rss_mib: float

    @property
    def growth_mib(self) -> float:
        return self.rss_at_end_mib - self.rss_at_checkpoint_mib


@dataclass
class BackendReport:
    backend: str
    operations: list[OpResult]
    memory: MemoryResult

    def find(self, operation: str) -> OpResult | None:
        return next((op for op in self.operations if op.operation == operation), None)

    def to_json(self) -> dict[str, Any]:
        memory = asdict(self.memory) | {"growth_mib": round(self.memory.growth_mib, 1)}
        return {"operations": [op.to_json() for op in self.operations], "memory": memory}


# Measurement helpers ------------------------------------------------------------------------------------------


def current_rss_mib() -> float:
    """The process's resident set size now: psutil (a dev dependency) when installed, else /proc (Linux)."""
    try:
        psutil = importlib.import_module("psutil")  # imported by name: it ships no type stubs
    except ImportError:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return float(psutil.Process().memory_info().rss) / 2**20


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


async def timed(call: Awaitable[Any], latencies: list[float]) -> Any:
    started = time.perf_counter()
    result = await call
    latencies.append(time.perf_counter() - started)
    return result


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# Workload ------------------------------------------------------------------------------------------------------


def make_span(rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
    """An LLM-call span as an instrumented agent would send it (about 1 KB of JSON with a dozen attributes): the
    one ``bench/server_ops.py``'s clients send."""
    return Span.model_validate(span_json(rollout_id, attempt_id, sequence_id))


def span_batch(target: AttemptedRollout, first_sequence_id: int) -> list[Span]:
    return [make_span(target.rollout_id, target.attempt.attempt_id, first_sequence_id + i) for i in range(BATCH)]


# The measurements ----------------------------------------------------------------------------------------------


async def bench_enqueue(store: SqlStore, count: int) -> OpResult:
    latencies: list[float] = []
    started = time.perf_counter()
    for i in range(count):
        await timed(store.enqueue_rollout({"task": i, "question": "What is 2 + 2?"}, mode="train"), latencies)
    return OpResult("enqueue", "rollouts", count, count, time.perf_counter() - started, latencies)


async def bench_enqueue_many(store: SqlStore, count: int) -> OpResult:
    latencies: list[float] = []
    batches = math.ceil(count / BATCH)
    started = time.perf_counter()
    for b in range(batches):
        requests = [
            EnqueueRolloutRequest(input={"task": b * BATCH + i, "question": "What is 2 + 2?"}, mode="train")
            for i in range(min(BATCH, count - b * BATCH))
        ]
        await timed(store.enqueue_many_rollouts(requests), latencies)
    return OpResult(f"enqueue_many x{BATCH}", "rollouts", batches, count, time.perf_counter() - started, latencies)


async def bench_dequeue(store: SqlStore, count: int, concurrency: int) -> tuple[OpResult, list[AttemptedRollout]]:
    """``count`` claims from ``concurrency`` tasks; every task stops once the total is reached."""
    latencies: list[float] = []
    claimed: list[AttemptedRollout] = []
    remaining = count

    async def worker(index: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            rollout = await timed(store.dequeue_rollout(worker_id=f"bench-worker-{index}"), latencies)
            if rollout is None:
                return
            claimed.append(rollout)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    seconds = time.perf_counter() - started
    name = "dequeue" if concurrency == 1 else f"dequeue ({concurrency} tasks)"
    return OpResult(name, "rollouts", len(latencies), len(claimed), seconds, latencies), claimed


async def attempts_for_spans(store: SqlStore, claimed: list[AttemptedRollout], spans: int) -> list[AttemptedRollout]:
    """One attempt per batch of 100 spans: the claimed ones, then (untimed) new ones when too few were claimed."""
    needed = math.ceil(spans / BATCH)
    targets = claimed[:needed]
    while len(targets) < needed:
        targets.append(await store.start_rollout({"task": "extra"}, mode="train", worker_id="bench-extra"))
    return targets


async def bench_ingest(
    store: SqlStore, targets: Sequence[AttemptedRollout], spans: int
) -> tuple[OpResult, MemoryResult]:
    """``spans`` spans in batches of 100, each batch the 100 spans of one attempt; RSS at 10% and at the end.

    Building a batch is not timed; only ``add_many_spans`` is.
    """
    latencies: list[float] = []
    batches = math.ceil(spans / BATCH)
    checkpoint_batch = max(1, batches // 10)
    checkpoint: tuple[int, float] = (0, current_rss_mib())
    for b in range(batches):
        batch = span_batch(targets[b], 1)
        await timed(store.add_many_spans(batch), latencies)
        if b + 1 == checkpoint_batch:
            checkpoint = ((b + 1) * BATCH, current_rss_mib())
    end = current_rss_mib()
    memory = MemoryResult(
        spans_at_checkpoint=checkpoint[0],
        rss_at_checkpoint_mib=round(checkpoint[1], 1),
        spans_total=batches * BATCH,
        rss_at_end_mib=round(end, 1),
        # The kernel updates the two counters at different moments; the peak is never below what was seen.
        peak_rss_mib=round(max(peak_rss_mib(), end, checkpoint[1]), 1),
    )
    result = OpResult(f"add_many_spans x{BATCH}", "spans", batches, batches * BATCH, sum(latencies), latencies)
    return result, memory


async def bench_concurrent_ingest(store: SqlStore, spans: int, writers: int) -> OpResult:
    """``spans`` spans in batches of 100 from ``writers`` tasks at once, each on attempts of its own, as runners
    of many rollouts send them. Throughput is spans over the wall time of the whole run."""
    batches = math.ceil(spans / BATCH)
    targets = [await store.start_rollout({"task": "concurrent"}, worker_id="bench") for _ in range(batches)]
    latencies: list[float] = []

    async def writer(index: int) -> None:
        for target in targets[index::writers]:
            await timed(store.add_many_spans(span_batch(target, 1)), latencies)

    started = time.perf_counter()
    await asyncio.gather(*(writer(i) for i in range(writers)))
    seconds = time.perf_counter() - started
    return OpResult(
        f"add_many_spans x{BATCH} ({writers} writers)", "spans", batches, batches * BATCH, seconds, latencies
    )


async def bench_query_spans(store: SqlStore, targets: Sequence[AttemptedRollout], queries: int) -> OpResult:
    latencies: list[float] = []
    returned = 0
    started = time.perf_counter()
    for i in range(queries):
        page = await timed(store.query_spans(targets[i % len(targets)].rollout_id), latencies)
        returned += len(page)
    seconds = time.perf_counter() - started
    if returned != queries * BATCH:
        raise RuntimeError(f"query_spans returned {returned} spans, expected {queries * BATCH}")
    return OpResult(f"query_spans ({BATCH} spans)", "queries", queries, queries, seconds, latencies)


async def run_backend(backend: str, url: str, args: argparse.Namespace) -> BackendReport:
    store = await open_store(url, migrate=True, watchdog=False)
    try:
        operations: list[OpResult] = []

        async def step(label: str, measure: Callable[[], Awaitable[OpResult]]) -> None:
            log(f"[{backend}] {label} ...")
            operations.append(await measure())

        await step("enqueue", lambda: bench_enqueue(store, args.rollouts))
        await step("enqueue_many", lambda: bench_enqueue_many(store, args.rollouts))
        log(f"[{backend}] dequeue ...")
        dequeued, claimed = await bench_dequeue(store, args.rollouts, args.concurrency)
        operations.append(dequeued)
        targets = await attempts_for_spans(store, claimed, args.spans)
        log(f"[{backend}] add_many_spans ({len(targets) * BATCH} spans) ...")
        ingest, memory = await bench_ingest(store, targets, args.spans)
        operations.append(ingest)
        await step("query_spans", lambda: bench_query_spans(store, targets, args.queries))
        if args.ingest_writers > 1:
            concurrent_spans = min(args.spans, 20_000)
            await step(
                f"add_many_spans, {args.ingest_writers} writers",
                lambda: bench_concurrent_ingest(store, concurrent_spans, args.ingest_writers),
            )
        return BackendReport(backend, operations, memory)
    finally:
        await store.close()


# Databases -----------------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def sqlite_database() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="ls_bench_") as directory:
        yield f"sqlite+aiosqlite:///{directory}/bench.db"


async def run_all(args: argparse.Namespace) -> list[BackendReport]:
    reports = []
    for backend in args.backends:
        if backend == "sqlite":
            async with sqlite_database() as url:
                reports.append(await run_backend(backend, url, args))
        elif await postgres_reachable(args.postgres_url):
            async with async_postgres_database(args.postgres_url) as url:
                reports.append(await run_backend(backend, url, args))
    return reports


# Output --------------------------------------------------------------------------------------------------------


def postgres_ingest_ratio(reports: Sequence[BackendReport]) -> float | None:
    for report in reports:
        if report.backend != "postgres":
            continue
        rates = [op.throughput for op in report.operations if op.operation.startswith(f"add_many_spans x{BATCH}")]
        if rates:
            return max(rates) / TARGET_SPANS_PER_SECOND
    return None


def render_tables(reports: Sequence[BackendReport], args: argparse.Namespace, console: Console) -> None:
    ops = Table(title=f"Store operations ({args.rollouts} rollouts, {args.spans} spans, 1 process)")
    for column in ("backend", "operation", "calls", "items", "per second", "p50 ms", "p99 ms"):
        ops.add_column(column, justify="left" if column in ("backend", "operation") else "right")
    for report in reports:
        for op in report.operations:
            ops.add_row(
                report.backend,
                op.operation,
                str(op.calls),
                f"{op.items} {op.unit}",
                f"{op.throughput:,.0f} {op.unit}/s",
                f"{op.percentile(50) * 1000:.2f}",
                f"{op.percentile(99) * 1000:.2f}",
            )
    console.print(ops)

    memory = Table(title="Resident memory (MiB)")
    for column in ("backend", "RSS after", "RSS after", "growth", "peak RSS (process)"):
        memory.add_column(column, justify="left" if column == "backend" else "right")
    for report in reports:
        m = report.memory
        memory.add_row(
            report.backend,
            f"{m.rss_at_checkpoint_mib:.1f} ({m.spans_at_checkpoint:,} spans)",
            f"{m.rss_at_end_mib:.1f} ({m.spans_total:,} spans)",
            f"{m.growth_mib:+.1f}",
            f"{m.peak_rss_mib:.1f}",
        )
    console.print(memory)

    ratio = postgres_ingest_ratio(reports)
    if ratio is not None:
        console.print(
            f"Postgres batched ingest: {ratio * TARGET_SPANS_PER_SECOND:,.0f} spans/s = {ratio:.2f}x "
            f"the target of {TARGET_SPANS_PER_SECOND:,} spans/s"
        )
    console.print(f"[dim]{os.cpu_count()} CPUs; numbers are indicative (other work may share the machine).[/dim]")


def render_json(reports: Sequence[BackendReport], args: argparse.Namespace) -> str:
    ratio = postgres_ingest_ratio(reports)
    document = {
        "config": {
            "rollouts": args.rollouts,
            "spans": args.spans,
            "queries": args.queries,
            "batch": BATCH,
            "concurrency": args.concurrency,
            "cpus": os.cpu_count(),
        },
        "backends": {report.backend: report.to_json() for report in reports},
        "postgres_ingest_target": {
            "spans_per_second": TARGET_SPANS_PER_SECOND,
            "ratio": None if ratio is None else round(ratio, 3),
        },
    }
    return json.dumps(document, indent=2)


# Command line --------------------------------------------------------------------------------------------------


def backends(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = set(names) - {"sqlite", "postgres"}
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are sqlite and postgres, not {sorted(unknown) or value!r}")
    return names


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backends", type=backends, default=["sqlite", "postgres"], help="default: sqlite,postgres")
    parser.add_argument("--rollouts", type=positive, default=1000, help="rollouts per enqueue measurement and dequeued")
    parser.add_argument("--spans", type=positive, default=100_000, help="spans ingested (in batches of 100)")
    parser.add_argument("--queries", type=positive, default=200, help="query_spans calls")
    parser.add_argument("--concurrency", type=positive, default=1, help="tasks dequeuing at once")
    parser.add_argument(
        "--ingest-writers", type=positive, default=4, help="tasks ingesting at once in the concurrent ingest run"
    )
    add_postgres_url(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    reports = asyncio.run(run_all(args))
    if args.json:
        print(render_json(reports, args))
    else:
        render_tables(reports, args, Console(width=max(Console().width, 120)))


if __name__ == "__main__":
    main()
