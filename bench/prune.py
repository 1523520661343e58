"""Benchmark of ``store prune`` beside a serving store: the latency of concurrent requests before and during the
prune of a million spans.

It fills a database with ``--spans`` spans (``--spans-per-rollout`` per finished rollout, one of them a reward span,
plus two LLM-call records per rollout; each span about 0.6 KB of JSON, written straight into the tables, as the
store writes them, for speed), starts a real ``store serve`` subprocess on it, and drives ``--clients`` HTTP clients,
each sending one request every ``--interval`` seconds, in turn: a rollout search, an enqueue, a span of a live
rollout, a read of one rollout. It records their latency for ``--before`` seconds, then runs ``store prune --yes``
(a subprocess, ``--what rollouts`` by default: every row of every filled rollout, the million spans with them) and
records until it exits. It prints p50, p99 and the maximum of both phases, their ratios, and the prune's rate.

Run from the repository root::

    python -m bench.prune                                  # SQLite, then Postgres where one answers
    python -m bench.prune --backends sqlite --spans 200000 --what spans
    python -m bench.prune --json > prune.json

SQLite runs on a file in a temporary directory; Postgres in a database created for the run (and dropped) on the
server at ``$LIGHTNING_STORE_BENCH_POSTGRES_URL`` (default: the local trust-auth server). Numbers depend on the
machine and on what else runs on it; treat them as indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.engine import make_url

from bench.harness import DEFAULT_POSTGRES_URL, async_postgres_database, postgres_reachable, server_process
from lightning_store.migrate import upgrade
from lightning_store.spans import SpanContext, TraceStatus
from lightning_store.sql.engine import make_engine

DAY = 86400.0
STORE = [sys.executable, "-c", "from lightning_store.cli import app; app(prog_name='store')"]
SPAN_COLUMNS = [
    "rollout_id",
    "attempt_id",
    "sequence_id",
    "trace_id",
    "span_id",
    "parent_id",
    "name",
    "status",
    "attributes",
    "events",
    "links",
    "start_time",
    "end_time",
    "context",
    "parent",
    "resource",
    "extra",
]
CALL_COLUMNS = [
    "rollout_id",
    "attempt_id",
    "span_id",
    "sequence_id",
    "model",
    "prompt_token_ids",
    "response_token_ids",
    "start_time",
]


def span_rows(rollout_id: str, attempt_id: str, count: int, end: float) -> Iterator[tuple[Any, ...]]:
    """``count`` spans of one attempt, as the store writes them: a reward span last, two of them LLM calls."""
    trace = uuid.uuid4().hex
    status = json.dumps(TraceStatus(status_code="OK").model_dump(mode="json"))
    resource = json.dumps({"attributes": {"service.name": "agent"}, "schema_url": ""})
    for k in range(count):
        span_id = f"{k:016x}"
        attributes: dict[str, Any]
        if k == count - 1:
            name, attributes = "agentlightning.reward", {"agentlightning.reward.0.value": 1.0}
        elif k < 2:
            name = "openai.chat.completion"
            attributes = {
                "gen_ai.request.model": "Qwen/Qwen2.5-0.5B-Instruct",
                "gen_ai.prompt.0.role": "user",
                "gen_ai.prompt.0.content": "You are a careful assistant. Solve the task step by step. " * 3,
                "gen_ai.completion.0.content": "The calculator returned 4, so the answer is 4.",
                "gen_ai.usage.prompt_tokens": 120,
                "gen_ai.usage.completion_tokens": 14,
            }
        else:
            name = "tool.calculator"
            attributes = {"tool.name": "calculator", "input": "2+2" * 40, "output": "4" * 80, "k": k}
        context = json.dumps(SpanContext(trace_id=trace, span_id=span_id).model_dump(mode="json"))
        yield (
            rollout_id, attempt_id, k + 1, trace, span_id, None, name, status, json.dumps(attributes), "[]", "[]",
            end - 1, end, context, None, resource, None,
        )  # fmt: skip


def fill_rows(spans: int, per_rollout: int) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    """(table, rows) chunks: rollouts, attempts, spans and LLM calls, every rollout finished 40 days ago."""
    rollouts = spans // per_rollout
    end = time.time() - 40 * DAY
    chunk = 1000
    for first in range(0, rollouts, chunk):
        ids = [f"ro-bench-{n:07d}" for n in range(first, min(first + chunk, rollouts))]
        yield (
            "rollouts",
            [
                (
                    rid,
                    json.dumps({"q": rid}),
                    end - 5,
                    end,
                    ("train", "test")[n % 2],
                    "succeeded",
                    "{}",
                    "{}",
                    per_rollout,
                )
                for n, rid in enumerate(ids)
            ],
        )
        yield "attempts", [(rid, f"at-{rid[3:]}", 1, end - 5, end, "succeeded", "w-bench", end) for rid in ids]
        yield "spans", [row for rid in ids for row in span_rows(rid, f"at-{rid[3:]}", per_rollout, end)]
        tokens = json.dumps(list(range(100)))
        yield (
            "llm_calls",
            [(rid, f"at-{rid[3:]}", f"{k:016x}", k + 1, "m", tokens, tokens, end - 1) for rid in ids for k in range(2)],
        )


COLUMNS = {
    "rollouts": [
        "rollout_id",
        "input",
        "start_time",
        "end_time",
        "mode",
        "status",
        "config",
        "metadata",
        "last_span_seq",
    ],
    "attempts": [
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "start_time",
        "end_time",
        "status",
        "worker_id",
        "last_heartbeat_time",
    ],
    "spans": SPAN_COLUMNS,
    "llm_calls": CALL_COLUMNS,
}
JSON_COLUMNS = {"input", "config", "metadata", "status", "attributes", "events", "links", "context", "parent"}
JSON_COLUMNS |= {"resource", "extra", "prompt_token_ids", "response_token_ids"}


async def fill(url: str, spans: int, per_rollout: int) -> float:
    """Migrate and fill the database; the seconds it took."""
    started = time.perf_counter()
    engine = make_engine(url)
    await upgrade(engine)
    await engine.dispose()
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        conn = sqlite3.connect(str(parsed.database))
        for table, rows in fill_rows(spans, per_rollout):
            names = COLUMNS[table]
            conn.executemany(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", rows)
        conn.commit()
        conn.close()
    else:
        import asyncpg

        conn = await asyncpg.connect(parsed.set(drivername="postgresql").render_as_string(hide_password=False))
        for table, rows in fill_rows(spans, per_rollout):
            await conn.copy_records_to_table(table, records=rows, columns=COLUMNS[table])
        await conn.execute("ANALYZE")
        await conn.close()
    return time.perf_counter() - started


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        if not ordered:
            return {"requests": 0, "errors": len(self.errors)}

        def pct(p: float) -> float:
            return round(1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)

        return {
            "requests": len(ordered),
            "errors": len(self.errors),
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": round(1000 * ordered[-1], 2),
            "mean_ms": round(1000 * statistics.fmean(ordered), 2),
        }


async def drive(base: str, clients: int, interval: float, phase: dict[str, Phase], stop: asyncio.Event) -> None:
    """``clients`` clients, each sending a request every ``interval`` seconds into ``phase["now"]``."""
    async with httpx.AsyncClient(base_url=f"{base}/v1/agl", timeout=60) as http:
        live = [
            (await http.post("/rollouts", json={"input": {"live": k}, "mode": "test"})).json() for k in range(clients)
        ]

        async def client(k: int) -> None:
            rollout = live[k]
            n = 0
            while not stop.is_set():
                n += 1
                kind = n % 4
                started = time.perf_counter()
                try:
                    if kind == 0:
                        response = await http.post("/rollouts/search", json={"limit": 20, "mode_in": ["test"]})
                    elif kind == 1:
                        response = await http.post("/queues/rollouts/enqueue", json={"rollouts": [{"input": n}]})
                    elif kind == 2:
                        span = {
                            "rollout_id": rollout["rollout_id"],
                            "attempt_id": rollout["attempt"]["attempt_id"],
                            "sequence_id": n,
                            "trace_id": "ab" * 16,
                            "span_id": f"{k:04x}{n:012x}",
                            "name": "tool.live",
                            "attributes": {"n": n},
                        }
                        response = await http.post("/spans", json=span)
                    else:
                        response = await http.get(f"/rollouts/{rollout['rollout_id']}")
                    elapsed = time.perf_counter() - started
                    if response.status_code >= 300:
                        phase["now"].errors.append(f"{response.status_code} {response.text[:200]}")
                    else:
                        phase["now"].latencies.append(elapsed)
                except httpx.HTTPError as exc:
                    elapsed = time.perf_counter() - started
                    phase["now"].errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(max(0.0, interval - elapsed))

        await asyncio.gather(*(client(k) for k in range(clients)))


async def bench(url: str, args: argparse.Namespace, cwd: Path) -> dict[str, Any]:
    fill_seconds = await fill(url, args.spans, args.spans_per_rollout)
    phases = {"warmup": Phase(), "before": Phase(), "during": Phase()}
    now = {"now": phases["warmup"]}
    stop = asyncio.Event()
    with server_process("store", cwd, url) as (base, _):
        load = asyncio.create_task(drive(base, args.clients, args.interval, now, stop))
        await asyncio.sleep(3)
        now["now"] = phases["before"]
        await asyncio.sleep(args.before)
        now["now"] = phases["during"]
        argv = [*STORE, "prune", "--older-than", "30d", "--what", args.what, "--yes", "--json", "--database-url", url]
        argv += ["--batch-size", str(args.batch_size), "--pause", str(args.pause)]
        started = time.perf_counter()
        pruning = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await pruning.communicate()
        prune_seconds = time.perf_counter() - started
        stop.set()
        await load
    if pruning.returncode != 0:
        raise RuntimeError(f"store prune failed: {err.decode()}")
    summary = json.loads(out)
    before, during = phases["before"].stats(), phases["during"].stats()
    ratio = {k: round(during[k] / before[k], 2) for k in ("p50_ms", "p99_ms", "max_ms") if before.get(k)}
    return {
        "spans_filled": args.spans,
        "fill_seconds": round(fill_seconds, 1),
        "prune": {
            "what": args.what,
            "batch_size": args.batch_size,
            "pause": args.pause,
            "seconds": round(prune_seconds, 1),
            "spans": summary["spans"],
            "rollouts": summary["rollouts"],
            "rows": summary["rollouts"] + summary["attempts"] + summary["spans"] + summary["llm_calls"],
            "transactions": summary["batches"],
            "spans_per_second": round(summary["spans"] / summary["seconds"]) if summary["seconds"] else None,
        },
        "before": before,
        "during": during,
        "during_over_before": ratio,
        "errors": phases["before"].errors[:5] + phases["during"].errors[:5],
    }


@contextlib.asynccontextmanager
async def database(backend: str, tmp: Path) -> AsyncIterator[str | None]:
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp / 'store.db'}"
        return
    admin = os.environ.get("LIGHTNING_STORE_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    if not await postgres_reachable(admin):
        yield None
        return
    async with async_postgres_database(admin, "ls_prune_bench", driver="postgresql") as url:
        yield url


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--spans-per-rollout", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.02, help="Seconds between one client's requests.")
    parser.add_argument("--before", type=float, default=20.0, help="Seconds of requests measured before the prune.")
    parser.add_argument("--what", choices=["spans", "rollouts"], default="rollouts")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--pause", type=float, default=0.02)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for backend in args.backends:
        with tempfile.TemporaryDirectory(prefix="ls-prune-bench-") as tmp:
            async with database(backend, Path(tmp)) as url:
                if url is None:
                    print(f"{backend}: no server answers; skipped", file=sys.stderr)
                    continue
                results[backend] = await bench(url, args, Path(tmp))
        if not args.json:
            print(f"{backend}: {json.dumps(results[backend], indent=2)}", flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
