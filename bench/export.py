"""Benchmark of ``store export``: its memory must stay flat however many spans the store holds.

For each size (spans in the store; by default 100,000 and 1,000,000) it fills a store quickly (SQLite, or with
``--backend postgres`` a database created for the run on ``$LIGHTNING_STORE_BENCH_POSTGRES_URL``), then runs
``store export`` as a subprocess, once per format (Parquet, JSON Lines), and reports each run's wall time, rows
written per second (all five files) and the child's peak resident set size (its ``VmHWM``, read by the child
as it exits: Linux only). A baseline run exports only ``training_steps`` (a few rows): the peak of an
interpreter that imported the command. The last table compares the largest size with the smallest: flat memory is
a peak ratio near 1 while the rows grow tenfold.

The store: ``spans / 100`` rollouts, each with one finished attempt of 100 spans (about 0.5 KB of attributes each),
ten of which are LLM calls recorded with 200 prompt and 50 response token ids and their logprobs, and one a reward.
Rollouts, attempts and their ids come through the store contract (``enqueue_many_rollouts``,
``dequeue_many_rollouts``); spans and LLM-call records are bulk-inserted into the tables (an ``executemany`` of
the schema's own table definitions; the benchmark measures the export, not the ingest).

Run from the repository root::

    python -m bench.export                          # 100k and 1M spans
    python -m bench.export --sizes 20000 200000     # quicker
    python -m bench.export --backend postgres
    python -m bench.export --batch-size 1000 --json

Numbers depend on the machine and on what else runs on it; treat them as indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from bench.harness import add_postgres_url, postgres_database
from lightning_store.models import EnqueueRolloutRequest
from lightning_store.sql import open_store, schema

SPANS_PER_ROLLOUT = 100
CALLS_PER_ROLLOUT = 10
PROMPT_TOKENS, RESPONSE_TOKENS = 200, 50
console = Console(stderr=True)


@dataclass
class Run:
    spans: int
    format: str
    what: str
    rows: int
    seconds: float
    peak_rss_mib: float
    bytes: int

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


async def fill(url: str, spans: int) -> None:
    """A store of ``spans`` spans at ``url`` (see the module's docstring)."""
    store = await open_store(url, migrate=True, watchdog=False)
    rollouts = max(1, spans // SPANS_PER_ROLLOUT)
    attempts: list[tuple[str, str]] = []
    rng = random.Random(0)
    try:
        for first in range(0, rollouts, 500):
            requests = [
                EnqueueRolloutRequest(
                    input={"question": f"q{i}", "context": "x" * 64},
                    mode="train" if i % 5 else "val",
                    resources_id="policy",
                    metadata={"task_id": f"task-{i % 97}", "step": i // 1000},
                )
                for i in range(first, min(rollouts, first + 500))
            ]
            await store.enqueue_many_rollouts(requests)
        while claimed := await store.dequeue_many_rollouts(limit=500, worker_id="bench"):
            attempts += [(a.rollout_id, a.attempt.attempt_id) for a in claimed]
        for first in range(0, len(attempts), 200):
            span_rows: list[dict[str, Any]] = []
            call_rows: list[dict[str, Any]] = []
            for index in range(first, min(len(attempts), first + 200)):
                more_spans, more_calls = _rows(*attempts[index], index, rng)
                span_rows += more_spans
                call_rows += more_calls
            async with store.engine.begin() as conn:
                await conn.execute(schema.spans.insert(), span_rows)
                await conn.execute(schema.llm_calls.insert(), call_rows)
        async with store.engine.begin() as conn:
            await conn.execute(
                sa.update(schema.attempts).values(status="succeeded", end_time=schema.attempts.c.start_time + 30)
            )
            await conn.execute(
                sa.update(schema.rollouts).values(status="succeeded", end_time=schema.rollouts.c.start_time + 31)
            )
    finally:
        await store.close()


RESOURCE = {"attributes": {"service.name": "bench-agent"}, "schema_url": ""}
OK = {"status_code": "OK", "description": None}


def _rows(
    rollout_id: str, attempt_id: str, index: int, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One attempt's spans and LLM-call records, as the tables hold them."""
    trace = f"{index:032x}"
    now = 1_700_000_000.0 + index
    spans, calls = [], []
    attributes: dict[str, Any]
    for seq in range(1, SPANS_PER_ROLLOUT + 1):
        span_id = f"{index:08x}{seq:08x}"
        ids = {"rollout_id": rollout_id, "attempt_id": attempt_id, "span_id": span_id, "sequence_id": seq}
        if seq == SPANS_PER_ROLLOUT:
            name, attributes = "agentlightning.annotation", {"agentlightning.reward.0.value": rng.random()}
        elif seq % (SPANS_PER_ROLLOUT // CALLS_PER_ROLLOUT) == 1:
            name = "openai.chat.completion"
            attributes = {"gen_ai.request.model": "tiny", "gen_ai.usage.input_tokens": PROMPT_TOKENS}
            calls.append(
                ids
                | {
                    "agent_name": "solver",
                    "model": "tiny",
                    "resources_id": "policy",
                    "resources_version": 1 + index // 1000,
                    "prompt_token_ids": [rng.randrange(50_000) for _ in range(PROMPT_TOKENS)],
                    "response_token_ids": [rng.randrange(50_000) for _ in range(RESPONSE_TOKENS)],
                    "response_logprobs": [round(-rng.random() * 3, 6) for _ in range(RESPONSE_TOKENS)],
                    "request": {"messages": [{"role": "user", "content": "q"}]},
                    "response": {"usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": RESPONSE_TOKENS}},
                    "finish_reason": "stop",
                    "start_time": now + seq,
                    "end_time": now + seq + 0.5,
                    "latency_seconds": 0.5,
                }
            )
        else:
            name = "tool.call" if seq % 2 else "agent.step"
            attributes = {f"attr.{k}": f"value {k} of span {seq} " + "y" * 16 for k in range(12)}
        spans.append(
            ids
            | {
                "trace_id": trace,
                "parent_id": None if seq == 1 else f"{index:08x}{1:08x}",
                "name": name,
                "status": OK,
                "attributes": attributes,
                "events": [],
                "links": [],
                "start_time": now + seq,
                "end_time": now + seq + 0.25,
                "resource": RESOURCE,
            }
        )
    return spans, calls


LAUNCHER = """
import atexit, os, sys

def report():  # this process's own peak RSS (VmHWM: of its image since exec, not the forking parent's)
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(os.environ["BENCH_EXPORT_PEAK"], "w") as out:
        out.write(peak)

atexit.register(report)
sys.argv[0] = "store"
from lightning_store.cli import main
main()
"""
"""``store export`` as the ``store`` script runs it (the plugins loaded), reporting its peak resident set size.
``ru_maxrss`` would not do: it counts the parent's pages the child shares between fork and exec."""


def export(url: str, out: Path, fmt: str, *, what: list[str], batch_size: int | None, spans: int) -> Run:
    """``store export`` in a subprocess, and its own peak RSS (Linux: ``/proc/self/status``)."""
    argv = [sys.executable, "-c", LAUNCHER, "export", str(out), "--format", fmt, "--overwrite", "--database-url", url]
    if batch_size is not None:
        argv += ["--batch-size", str(batch_size)]
    for name in what:
        argv += ["--what", name]
    peak = out.parent / "peak-kib"
    started = time.perf_counter()
    result = subprocess.run(
        argv, env=os.environ | {"BENCH_EXPORT_PEAK": str(peak)}, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"store export failed ({result.returncode}): {result.stderr}")
    manifest = json.loads((out / "manifest.json").read_text())
    rows = sum(f["rows"] for f in manifest["files"].values())
    size = sum(f["bytes"] for f in manifest["files"].values())
    return Run(spans, fmt, ",".join(what) or "all", rows, seconds, int(peak.read_text()) / 1024, size)


@contextlib.contextmanager
def database(backend: str, tmp: Path, spans: int, admin_url: str) -> Iterator[str]:
    """A new, empty database for one size: a SQLite file, or a Postgres database dropped afterwards."""
    if backend == "sqlite":
        path = tmp / f"store-{spans}.db"
        yield f"sqlite:///{path}"
        path.unlink(missing_ok=True)
        return
    with postgres_database(admin_url, "bench_export", driver="postgresql") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="spans in the store")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    add_postgres_url(parser)
    parser.add_argument("--batch-size", type=int, help="store export's --batch-size (default: its own)")
    parser.add_argument("--formats", nargs="+", default=["parquet", "jsonl"])
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = parser.parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        for spans in sorted(args.sizes):
            with database(args.backend, Path(tmp), spans, args.postgres_url) as url:
                started = time.perf_counter()
                asyncio.run(fill(url, spans))
                console.print(f"{args.backend}: filled {spans:,} spans in {time.perf_counter() - started:.1f} s")
                for fmt in args.formats:
                    # The baseline (a few rows), once per format: what the interpreter and its imports take.
                    for what in ([["training_steps"]] if spans == min(args.sizes) else []) + [[]]:
                        out = Path(tmp) / "out"
                        run = export(url, out, fmt, what=what, batch_size=args.batch_size, spans=spans)
                        console.print(
                            f"  {fmt} ({run.what}): {run.rows:,} rows in {run.seconds:.1f} s, "
                            f"peak {run.peak_rss_mib:.0f} MiB"
                        )
                        runs.append(run)
    if args.json:
        print(json.dumps([asdict(r) | {"rows_per_second": round(r.rows_per_second)} for r in runs], indent=2))
        return
    table = Table("spans", "format", "files", "rows", "seconds", "rows/s", "peak RSS MiB", "output MiB")
    for r in runs:
        table.add_row(
            f"{r.spans:,}", r.format, r.what, f"{r.rows:,}", f"{r.seconds:.1f}", f"{r.rows_per_second:,.0f}",
            f"{r.peak_rss_mib:.0f}", f"{r.bytes / 2**20:.1f}",
        )  # fmt: skip
    Console().print(table)
    small, large = min(args.sizes), max(args.sizes)
    if small != large:
        ratios = Table("format", "rows ×", "peak RSS ×", "seconds ×", title=f"{large:,} spans against {small:,}")
        for fmt in args.formats:
            a = next(r for r in runs if r.spans == small and r.format == fmt and r.what == "all")
            b = next(r for r in runs if r.spans == large and r.format == fmt and r.what == "all")
            ratios.add_row(
                fmt, f"{b.rows / a.rows:.1f}", f"{b.peak_rss_mib / a.peak_rss_mib:.2f}", f"{b.seconds / a.seconds:.1f}"
            )
        Console().print(ratios)


if __name__ == "__main__":
    main()
