"""Benchmark of the runner: rollouts/s through ``store run`` against ``store serve`` on SQLite and Postgres.

Agents (``bench/runner_agents.py``): ``noop`` returns a reward at once; ``six_calls`` makes six chat calls
through the store's LLM proxy to a stand-in upstream that answers at once (``bench/echo_upstream.py``, not a
model), so the numbers are the middleware's: claim, resources, proxy, LLM-call records, spans, status.

For each backend, agent and worker count, a fresh server and a fresh runner are started; once every worker has
registered (so process start-up is not counted), ROLLOUTS rollouts are enqueued in one call and timed until the
last one has finished. Agent Lightning's runner is not measured here yet (see docs/benchmarks.md).

    python -m bench.runner_throughput --rollouts 200 --workers 1,4,16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.server_ops import database, free_port, log, postgres_answers, server, stop, store_command
from lightning_store import LLM
from lightning_store.client import HttpStore

REPO = Path(__file__).resolve().parents[1]
QUIET = ("--no-progress", "--grace", "5")


@contextlib.contextmanager
def echo_upstream(directory: Path) -> Iterator[str]:
    port = free_port()
    with (directory / "echo.log").open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.echo_upstream", str(port)], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait()


@contextlib.contextmanager
def runner(url: str, agent: str, workers: int, directory: Path) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}
    with (directory / f"runner-{workers}.log").open("wb") as sink:
        process = subprocess.Popen(
            [
                *store_command(),
                "run",
                f"bench.runner_agents:{agent}",
                "--store",
                url,
                "--workers",
                str(workers),
                *QUIET,
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        stop(process)


async def measure(url: str, upstream: str, workers: int, rollouts: int) -> float:
    """Rollouts per second once ``workers`` workers are up."""
    store = HttpStore(url)
    try:
        await store.add_resources({"main_llm": LLM(endpoint=upstream, model="echo")})
        for _ in range(600):
            if len(await store.query_workers()) >= workers:
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the runner's workers did not register")
        started = time.perf_counter()
        enqueued = await store.enqueue_many_rollouts([{"input": {"i": i}} for i in range(rollouts)])  # type: ignore[misc]
        ids = [r.rollout_id for r in enqueued]
        pending = set(ids)
        while pending:
            done = await store.wait_for_rollouts(rollout_ids=sorted(pending), timeout=20)
            pending -= {r.rollout_id for r in done}
        elapsed = time.perf_counter() - started
        statuses = {r.status for r in await store.query_rollouts(rollout_ids=ids)}
        if statuses != {"succeeded"}:
            raise RuntimeError(f"rollouts ended {statuses}")
        return rollouts / elapsed
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--workers", default="1,4,16")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--agents", default="noop,six_calls")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("LIGHTNING_STORE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b != "postgres" or postgres_answers(args.postgres_url)]
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with echo_upstream(directory) as upstream:
            for backend in backends:
                for agent in args.agents.split(","):
                    for workers in [int(w) for w in args.workers.split(",")]:
                        with (
                            database(backend, args.postgres_url, directory) as url,
                            server(backend, directory, url) as base,
                            runner(base, agent, workers, directory),
                        ):
                            rate = asyncio.run(measure(base, upstream, workers, args.rollouts))
                        log(f"[{backend}] {agent} x{workers}: {rate:.1f} rollouts/s")
                        results.append(
                            {"backend": backend, "agent": agent, "workers": workers, "rollouts_per_s": round(rate, 2)}
                        )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    table = Table(title=f"store run: rollouts/s ({args.rollouts} rollouts per cell)")
    for column in ("backend", "agent", "workers", "rollouts/s"):
        table.add_column(column, justify="right")
    for row in results:
        table.add_row(str(row["backend"]), str(row["agent"]), str(row["workers"]), f"{row['rollouts_per_s']:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
