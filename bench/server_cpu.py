"""The server's CPU time per rollout: CPU-seconds that ``store serve`` spends on one no-op rollout's whole
lifecycle, and on one LLM call through its proxy, read from ``/proc`` (not wall time, which a shared machine
stretches).

For each backend, a fresh ``store serve`` (a subprocess leading its own process group: with ``--server-workers``
above 1 its uvicorn workers are in the group too) and a fresh ``store run`` with ``--workers`` processes of the
agent (``bench/runner_agents.py``). After a warm-up batch, ``--rollouts`` rollouts are enqueued in one call and
waited for; the CPU time (user + system, from ``/proc/<pid>/stat``) of every process in the server's group over
that batch, divided by the rollouts, is the server's CPU per rollout. The same is read for the runner's process group
(``store run`` and its workers: what the agents' side spends per rollout) and for PostgreSQL's processes (every
process named ``postgres`` on the machine: run nothing else against it meanwhile).

* ``noop``: the agent returns a reward at once, so the server's CPU is the lifecycle's: enqueue (one call for
  the batch), the claim (which carries the resources), the end (which carries the attempt's spans), heartbeats,
  and the waits of the batch's caller.
* ``six_calls``: six chat calls through the proxy to a stand-in upstream that answers at once
  (``bench/echo_upstream.py``, not a model). CPU per proxied call = (six_calls − noop per rollout) / 6: forwarding,
  recording the call and its span.

    python -m bench.server_cpu --rollouts 400 --backends sqlite,postgres
    python -m bench.server_cpu --rollouts 400 --backends postgres --server-workers 2 --workers 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.harness import (
    add_postgres_url,
    database,
    echo_upstream,
    group_cpu,
    log,
    postgres_answers,
    postgres_cpu,
    runner,
    server_process,
)
from bench.runner_agents import CALLS
from bench.runner_throughput import ready
from lightning_store.client import HttpStore

WARMUP = 20


async def _batch(store: HttpStore, rollouts: int) -> None:
    enqueued = await store.enqueue_many_rollouts([{"input": {"i": i}} for i in range(rollouts)])  # type: ignore[misc]
    pending = {r.rollout_id for r in enqueued}
    while pending:
        done = await store.wait_for_rollouts(rollout_ids=sorted(pending), timeout=20)
        pending -= {r.rollout_id for r in done}
    statuses = {r.status for r in await store.query_rollouts(rollout_ids=[r.rollout_id for r in enqueued])}
    if statuses != {"succeeded"}:
        raise RuntimeError(f"rollouts ended {statuses}")


async def measure(
    url: str, pgid: int, runner_pgid: int, upstream: str, workers: int, rollouts: int
) -> dict[str, float]:
    """Server, runner and Postgres CPU-seconds per rollout over one batch, after a warm-up batch."""
    store = HttpStore(url)
    try:
        await ready(store, upstream, workers)
        await _batch(store, WARMUP)
        server0, runner0, pg0 = group_cpu(pgid), group_cpu(runner_pgid), postgres_cpu()
        wall0 = asyncio.get_running_loop().time()
        await _batch(store, rollouts)
        server1, runner1, pg1 = group_cpu(pgid), group_cpu(runner_pgid), postgres_cpu()
        wall1 = asyncio.get_running_loop().time()
    finally:
        await store.close()
    return {
        "server_cpu_ms": (server1 - server0) / rollouts * 1000,
        "runner_cpu_ms": (runner1 - runner0) / rollouts * 1000,
        "postgres_cpu_ms": (pg1 - pg0) / rollouts * 1000,
        "rollouts_per_s": rollouts / (wall1 - wall0),
    }


def run(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    backends = [b for b in args.backends.split(",") if b != "postgres" or postgres_answers(args.postgres_url)]
    results = []
    extra = ["--workers", str(args.server_workers)] if args.server_workers > 1 else []
    with echo_upstream(directory) as upstream:
        for backend in backends:
            for agent in ("noop", "six_calls"):
                with (
                    database(backend, args.postgres_url, directory) as url,
                    server_process(backend, directory, url, extra=extra) as (base, process),
                    runner(base, f"bench.runner_agents:{agent}", args.workers, directory) as runs,
                ):
                    found = asyncio.run(measure(base, process.pid, runs.pid, upstream, args.workers, args.rollouts))
                if backend != "postgres":
                    found["postgres_cpu_ms"] = 0.0
                log(f"[{backend}] {agent}: {found['server_cpu_ms']:.2f} ms server CPU per rollout")
                results.append({"backend": backend, "agent": agent, "workers": args.workers} | found)
            noop, six = results[-2], results[-1]
            per_call = (six["server_cpu_ms"] - noop["server_cpu_ms"]) / CALLS
            results.append(
                {
                    "backend": backend,
                    "agent": "per proxied call",
                    "workers": args.workers,
                    "server_cpu_ms": per_call,
                    "runner_cpu_ms": (six["runner_cpu_ms"] - noop["runner_cpu_ms"]) / CALLS,
                    "postgres_cpu_ms": (six["postgres_cpu_ms"] - noop["postgres_cpu_ms"]) / CALLS,
                }
            )
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--workers", type=int, default=4, help="runner worker processes")
    parser.add_argument("--server-workers", type=int, default=1, help="store serve --workers (Postgres only)")
    parser.add_argument("--backends", default="sqlite,postgres")
    add_postgres_url(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ls-bench-cpu-") as tmp:
        results = run(args, Path(tmp))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    table = Table(title=f"server CPU per rollout ({args.rollouts} rollouts, {args.workers} runner workers)")
    for column in ("backend", "agent", "server CPU ms", "Postgres CPU ms", "runner CPU ms", "rollouts/s"):
        table.add_column(column, justify="right" if "ms" in column or "/s" in column else "left")
    for r in results:
        rate = f"{r['rollouts_per_s']:.1f}" if "rollouts_per_s" in r else ""
        cpu = [f"{r[key]:.2f}" for key in ("server_cpu_ms", "postgres_cpu_ms", "runner_cpu_ms")]
        table.add_row(r["backend"], r["agent"], *cpu, rate)
    Console().print(table)


if __name__ == "__main__":
    main()
