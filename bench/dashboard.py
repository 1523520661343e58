"""Benchmark of the dashboard's rollouts pages: server time per page on a store of 100k rollouts.

The store is filled through the store contract in batches (``bench/dashboard_fill.py``: attempts, retries, an
LLM call or three per attempt with token ids, an OpenInference span with text, a reward or an exception span;
about 5.5 spans per rollout), then served by a real ``store serve`` subprocess, and each page is fetched over
loopback ``--repeat`` times after one warm-up request. Reported per page: the median and p95 of the response
time as the client sees it, and of the server's own ``Server-Timing`` (``app``: the whole handler;
``db``: its statements), which leaves out the HTTP client.

Pages: the list (default, deep pages, each filter, each sort, sort by reward with a filter), a rollout's page
(one attempt; a retried one) and the token-ids fragment of one LLM call.

    python -m bench.dashboard                                  # SQLite, 100k rollouts
    python -m bench.dashboard --rollouts 20000 --backends sqlite,postgres
    python -m bench.dashboard --database-url sqlite+aiosqlite:////tmp/filled.db   # an already filled store

Postgres runs in a database created for the run (dropped afterwards) on ``$LIGHTNING_STORE_BENCH_POSTGRES_URL``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``). Numbers depend on the machine and on what else runs on
it; treat them as indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

from bench.dashboard_fill import fill
from bench.harness import add_postgres_url, postgres_database, server
from lightning_store.sql import open_store

TIMING = re.compile(r"(\w+);dur=([0-9.]+)")


@dataclass
class Measured:
    name: str
    path: str
    status: int
    wall: list[float]
    app: list[float]
    db: list[float]

    def row(self) -> dict[str, Any]:
        return {
            "page": self.name,
            "status": self.status,
            "wall_median_ms": _ms(statistics.median(self.wall)),
            "wall_p95_ms": _ms(_p95(self.wall)),
            "app_median_ms": _ms(statistics.median(self.app)) if self.app else None,
            "app_p95_ms": _ms(_p95(self.app)) if self.app else None,
            "db_median_ms": _ms(statistics.median(self.db)) if self.db else None,
        }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]


async def pages(database_url: str) -> list[tuple[str, str]]:
    """The pages to time, with ids and values read from the store (a mid resources version, a retried rollout)."""
    store = await open_store(database_url, migrate=False, watchdog=False)
    try:
        async with store.engine.connect() as conn:

            async def one(sql: str) -> Any:
                return (await conn.execute(sa.text(sql))).scalar()

            top = int(await one("SELECT max(resources_version) FROM llm_calls_v") or 1)
            plain = await one(
                "SELECT rollout_id FROM rollouts_v WHERE num_attempts = 1 AND status = 'succeeded' LIMIT 1"
            )
            retried = await one("SELECT rollout_id FROM rollouts_v WHERE num_attempts = 2 LIMIT 1")
            call = (await conn.execute(sa.text("SELECT rollout_id, span_id FROM llm_calls_v LIMIT 1"))).one()
            prefix = str(plain)[:5]
            starts = (await conn.execute(sa.text("SELECT min(start_time), max(start_time) FROM rollouts"))).one()
    finally:
        await store.close()
    middle = (starts[0] + starts[1]) / 2
    return [
        ("list: default (newest first)", ""),
        ("list: page 2", "page=2"),
        ("list: page 100", "page=100"),
        ("list: page 1000", "page=1000"),
        ("filter status=failed", "status=failed"),
        ("filter status=succeeded,failed", "status=succeeded&status=failed"),
        ("filter mode=val", "mode=val"),
        ("filter mode=none", "mode=none"),
        ("filter since/until", f"since={middle:.0f}&until={middle + 60:.0f}"),
        (f"filter resources_version={top // 2}", f"resources_version={top // 2}"),
        ("filter resources_version=1", "resources_version=1"),
        ("filter resources_id=policy", "resources_id=policy"),
        ("filter reward>=0.9", "reward_min=0.9"),
        ("filter 0.4<=reward<=0.6", "reward_min=0.4&reward_max=0.6"),
        ("filter reward>=5 (none)", "reward_min=5"),
        ("filter status=failed, reward>=0", "status=failed&reward_min=0"),
        ("filter metadata task_id", "meta_key=task_id&meta_value=task-7"),
        (f"filter q={prefix}", f"q={prefix}"),
        ("sort end_time", "sort=end_time"),
        ("sort duration asc", "sort=duration&order=asc"),
        ("sort status", "sort=status"),
        ("sort reward desc", "sort=reward"),
        ("sort reward asc", "sort=reward&order=asc"),
        ("sort reward, page 100", "sort=reward&page=100"),
        ("sort reward, status=failed", "sort=reward&status=failed"),
        ("sort reward, mode=val", "sort=reward&mode=val"),
        (f"sort reward, version={top // 2}", f"sort=reward&resources_version={top // 2}"),
        ("rollout page (1 attempt)", f"/dashboard/rollouts/{plain}"),
        ("rollout page (2 attempts)", f"/dashboard/rollouts/{retried}"),
        ("token ids fragment", f"/dashboard/rollouts/{call[0]}/calls/{call[1]}/tokens"),
    ]


def measure(base: str, name: str, target: str, repeat: int) -> Measured:
    path = target if target.startswith("/") else "/dashboard/rollouts" + (f"?{target}" if target else "")
    wall: list[float] = []
    app: list[float] = []
    db: list[float] = []
    status = 0
    with httpx.Client(base_url=base, timeout=120) as client:
        for i in range(repeat + 1):
            began = time.perf_counter()
            response = client.get(path)
            elapsed = time.perf_counter() - began
            status = response.status_code
            if i == 0:
                continue  # warm-up: the first request of a page pays for cold caches and statement preparation
            wall.append(elapsed)
            timings = dict(TIMING.findall(response.headers.get("server-timing", "")))
            if "app" in timings:
                app.append(float(timings["app"]) / 1000)
            if "db" in timings:
                db.append(float(timings["db"]) / 1000)
    return Measured(name, path, status, wall, app, db)


async def filled(database_url: str, rollouts: int) -> str:
    store = await open_store(database_url, migrate=True, watchdog=False)
    try:
        summary = await fill(
            store,
            rollouts,
            progress=lambda done: (
                print(f"  {done} rollouts", file=sys.stderr, flush=True) if done % 20000 == 0 else None
            ),
        )
    finally:
        await store.close()
    print(f"  filled: {summary}", file=sys.stderr, flush=True)
    return database_url


async def vacuum(database_url: str) -> None:
    """``VACUUM ANALYZE``, as autovacuum would soon after such a burst of writes: without the statistics and the
    visibility map it leaves, every page of a freshly filled Postgres store is about 0.2 s slower (sequential
    scans where an index-only scan would do)."""
    import asyncpg

    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


def run_backend(backend: str, database_url: str | None, args: argparse.Namespace, work: Path) -> list[Measured]:
    with contextlib.ExitStack() as stack:
        if database_url is None:
            if backend == "sqlite":
                database_url = f"sqlite+aiosqlite:///{work / 'dashboard.db'}"
            else:
                database_url = stack.enter_context(postgres_database(args.postgres_url, "bench_dashboard"))
            print(f"{backend}: filling {args.rollouts} rollouts …", file=sys.stderr, flush=True)
            asyncio.run(filled(database_url, args.rollouts))
            if backend == "postgres":
                asyncio.run(vacuum(database_url))
        targets = asyncio.run(pages(database_url))
        base = stack.enter_context(server(backend, work, database_url))
        return [measure(base, name, target, args.repeat) for name, target in targets]


def render(results: dict[str, list[Measured]], args: argparse.Namespace, console: Console) -> None:
    for backend, measured in results.items():
        table = Table(title=f"Dashboard rollouts pages, {backend} ({args.repeat} requests each after a warm-up)")
        for column in ("page", "status", "wall p50", "wall p95", "server p50", "server p95", "db p50"):
            table.add_column(column, justify="left" if column == "page" else "right")
        for m in measured:
            r = m.row()
            cells = [r["wall_median_ms"], r["wall_p95_ms"], r["app_median_ms"], r["app_p95_ms"], r["db_median_ms"]]
            table.add_row(m.name, str(m.status), *(f"{c:.1f} ms" if c is not None else "—" for c in cells))
        console.print(table)
    console.print(
        f"[dim]{os.cpu_count()} CPUs; wall: over loopback with httpx; server: the Server-Timing header.[/dim]"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page (after one warm-up)")
    parser.add_argument("--backends", default="sqlite", help="sqlite, postgres or both (comma-separated)")
    parser.add_argument("--database-url", help="bench an already filled store instead (its backend only)")
    add_postgres_url(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    results: dict[str, list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dashboard-") as tmp:
        if args.database_url:
            backend = "postgres" if args.database_url.startswith("postgres") else "sqlite"
            results[backend] = run_backend(backend, args.database_url, args, Path(tmp))
        else:
            for backend in args.backends.split(","):
                results[backend] = run_backend(backend, None, args, Path(tmp))
    if args.json:
        print(json.dumps({b: [m.row() for m in ms] for b, ms in results.items()}, indent=2))
    else:
        render(results, args, Console(width=160))


if __name__ == "__main__":
    main()
