"""Benchmark of the runner: rollouts/s through ``store run`` against ``store serve`` on SQLite and Postgres, side by
side with Agent Lightning 0.3's own runner against ``agl store``.

Agents (``bench/runner_agents.py``): ``noop`` returns a reward at once; ``six_calls`` makes six chat calls
through the store's LLM proxy to a stand-in upstream that answers at once (``bench/echo_upstream.py``, not a
model), so the numbers are the middleware's: claim, resources, proxy, LLM-call records, spans, status.

For each backend, agent and worker count, a fresh server and a fresh runner are started; once every worker has
registered (so process start-up is not counted), ROLLOUTS rollouts are enqueued in one call and timed until the
last one has finished.

``--systems ours,agl`` (the default) also runs the same two agents on agentlightning==0.3.0's runner machinery
(``bench/agl_runner_harness.py``, in the interpreter at ``--agl-python``, ``$LIGHTNING_STORE_AGL_PYTHON`` or
``/tmp/aglvenv/bin/python``; skipped when none has agentlightning): for each agent and worker count a fresh
``agl store`` (its in-memory store; Agent Lightning has no SQL backend) and N runner processes started through
``Trainer(strategy=ClientServerExecutionStrategy(role="runner", n_runners=N))``, each a ``LitAgentRunner``
pulling from the store, timed the same way. Agent Lightning's runner starts no LLM proxy, so the harness starts
its ``LLMProxy`` (LiteLLM) as an algorithm would and the six calls go through it, recorded in the store
(``--agl-llm direct``: straight to the upstream). Its runners poll an empty queue every ``--agl-poll-interval``
(default 0.1 s; Agent Lightning's default of 5 s would dominate every cell) where ours long-poll. ``x agl`` is
ours over Agent Lightning's rollouts/s for the same agent and worker count.

A cell lasts a few seconds, and on a shared machine one run of it can be a third off the next. ``--repeat R``
runs every cell R times, in R rounds that each run ours and then Agent Lightning's (so that a drift of the
machine meets both), and reports each cell's median (its range beside it) and the ratio of the medians.

    python -m bench.runner_throughput --workers 1,4,16
    python -m bench.runner_throughput --workers 1,4,16 --agents noop --repeat 3
    python -m bench.runner_throughput --rollouts 40 --workers 1,4 --backends sqlite --systems ours,agl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.harness import (
    AGL_ENV,
    DEFAULT_AGL_PYTHON,
    add_postgres_url,
    database,
    echo_upstream,
    find_agl_python,
    log,
    postgres_answers,
    runner,
    server,
    without_store_settings,
)
from lightning_store import LLM
from lightning_store.client import HttpStore

AGL_HARNESS = Path(__file__).with_name("agl_runner_harness.py")
SYSTEMS = ("ours", "agl")
SAMPLE = 5


async def ready(store: HttpStore, upstream: str, workers: int) -> None:
    """Publish the stand-in upstream as the LLM, then wait (up to a minute) until ``workers`` workers have
    registered, so that process start-up is not measured."""
    await store.add_resources({"main_llm": LLM(endpoint=upstream, model="echo")})
    for _ in range(600):
        if len(await store.query_workers()) >= workers:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the runner's workers did not register")


async def measure(url: str, upstream: str, workers: int, rollouts: int) -> tuple[float, float]:
    """Rollouts per second once ``workers`` workers are up, and (untimed) spans per rollout of the first few."""
    store = HttpStore(url)
    try:
        await ready(store, upstream, workers)
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
        spans = [len(await store.query_spans(rollout_id)) for rollout_id in ids[:SAMPLE]]
        return rollouts / elapsed, sum(spans) / max(len(spans), 1)
    finally:
        await store.close()


def run_ours(args: argparse.Namespace, upstream: str, directory: Path) -> list[dict[str, Any]]:
    backends = [b for b in args.backends.split(",") if b != "postgres" or postgres_answers(args.postgres_url)]
    results: list[dict[str, Any]] = []
    for backend in backends:
        for agent in args.agents.split(","):
            for workers in worker_counts(args):
                with (
                    database(backend, args.postgres_url, directory) as url,
                    server(backend, directory, url) as base,
                    runner(base, f"bench.runner_agents:{agent}", workers, directory),
                ):
                    rate, spans = asyncio.run(measure(base, upstream, workers, args.rollouts))
                log(f"[{backend}] {agent} x{workers}: {rate:.1f} rollouts/s")
                results.append(
                    {
                        "system": "ours",
                        "backend": backend,
                        "agent": agent,
                        "workers": workers,
                        "rollouts_per_s": round(rate, 2),
                        "spans_per_rollout": round(spans, 1),
                    }
                )
    return results


def run_agl(args: argparse.Namespace, agl_python: str, upstream: str, directory: Path) -> list[dict[str, Any]]:
    """Agent Lightning's side: ``bench/agl_runner_harness.py`` in the agl interpreter, with the same upstream."""
    argv = [agl_python, str(AGL_HARNESS), "--rollouts", str(args.rollouts), "--workers", args.workers]
    argv += ["--agents", args.agents, "--upstream", upstream, "--llm", args.agl_llm, "--json"]
    argv += ["--poll-interval", str(args.agl_poll_interval), "--tracer", args.agl_tracer]
    env = without_store_settings() | AGL_ENV
    done = subprocess.run(argv, cwd=directory, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Agent Lightning harness failed ({done.returncode}); see its output above")
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell: its first run's, with ``rollouts_per_s`` the median of every run's and ``runs`` them all."""
    cells: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for run in runs:
        key = (run["system"], run["backend"], run["agent"], run["workers"])
        cells.setdefault(key, run | {"runs": []})["runs"].append(run["rollouts_per_s"])
    for row in cells.values():
        row["rollouts_per_s"] = round(statistics.median(row["runs"]), 2)
    return list(cells.values())


def with_ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of our rows with ``x_agl``: its rollouts/s over Agent Lightning's for the same agent and workers."""
    agl = {(r["agent"], r["workers"]): r["rollouts_per_s"] for r in results if r["system"] == "agl"}
    for row in results:
        base = agl.get((row["agent"], row["workers"]))
        if row["system"] == "ours" and base:
            row["x_agl"] = round(row["rollouts_per_s"] / base, 3)
    return results


def render_table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> Table:
    """One row per agent and worker count: each system's rollouts/s, then ours over Agent Lightning's."""
    ours = sorted({r["backend"] for r in results if r["system"] == "ours"}, key=["sqlite", "postgres"].index)
    has_agl = any(r["system"] == "agl" for r in results)
    repeated = f", median of {args.repeat} runs (range)" if args.repeat > 1 else ""
    table = Table(title=f"Runner throughput: rollouts/s ({args.rollouts} rollouts per cell{repeated})")
    for column in ("agent", "workers"):
        table.add_column(column)
    for backend in ours:
        table.add_column(f"ours {backend}", justify="right")
    if has_agl:
        table.add_column("agl (memory)", justify="right")
        for backend in ours:
            table.add_column(f"{backend} x agl", justify="right")
    cells = {(r["system"], r["backend"], r["agent"], r["workers"]): r for r in results}
    for agent in args.agents.split(","):
        for workers in worker_counts(args):
            rows = [cells.get(("ours", backend, agent, workers)) for backend in ours]
            line = [agent, str(workers), *(_rate(r, args.repeat) for r in rows)]
            if has_agl:
                line.append(_rate(cells.get(("agl", "memory", agent, workers)), args.repeat))
                line += [f"{r['x_agl']:.2f}x" if r and "x_agl" in r else "-" for r in rows]
            table.add_row(*line)
    return table


def _rate(row: dict[str, Any] | None, repeat: int) -> str:
    if row is None:
        return "-"
    if repeat == 1:
        return f"{row['rollouts_per_s']:.1f}"
    return f"{row['rollouts_per_s']:.1f} ({min(row['runs']):.0f}–{max(row['runs']):.0f})"


def worker_counts(args: argparse.Namespace) -> list[int]:
    return [int(w) for w in args.workers.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rollouts",
        type=int,
        default=1000,
        help="rollouts per cell [default: 1000; with 200 a no-op cell lasts about a second and start-up dominates]",
    )
    parser.add_argument("--workers", default="1,4,16")
    parser.add_argument("--backends", default="sqlite,postgres", help="our backends")
    parser.add_argument("--agents", default="noop,six_calls")
    parser.add_argument("--systems", default="ours,agl", help="ours, agl (Agent Lightning 0.3's runner) or both")
    add_postgres_url(parser)
    parser.add_argument("--agl-python", default=None, help=f"interpreter with agentlightning [{DEFAULT_AGL_PYTHON}]")
    parser.add_argument("--agl-llm", choices=("proxy", "direct"), default="proxy", help="agl six_calls: via LLMProxy")
    parser.add_argument("--agl-poll-interval", type=float, default=0.1, help="agl runners' empty-queue poll [s]")
    parser.add_argument("--agl-tracer", choices=("agentops", "otel"), default="agentops", help="agl runners' tracer")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every cell, reported as medians [1]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        parser.error(f"systems are {', '.join(SYSTEMS)}, not {args.systems!r}")
    agl_python = find_agl_python(args.agl_python) if "agl" in systems else None
    if "agl" in systems and agl_python is None:
        log("[agl] skipped: no interpreter with agentlightning (set --agl-python or $LIGHTNING_STORE_AGL_PYTHON)")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with echo_upstream(directory) as upstream:
            for _ in range(args.repeat):
                if "ours" in systems:
                    results += run_ours(args, upstream, directory)
                if agl_python is not None:
                    results += run_agl(args, agl_python, upstream, directory)
    results = with_ratios(medians(results))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    console = Console(width=max(Console().width, 120))
    console.print(render_table(results, args))
    if agl_python is not None:
        console.print(
            f"[dim]agl: Agent Lightning's LitAgentRunner x N processes against `agl store` (in memory); six_calls via "
            f"{'its LLMProxy' if args.agl_llm == 'proxy' else 'no proxy'}; x agl = ours / agl rollouts/s. "
            f"{os.cpu_count()} CPUs shared by everything; numbers are indicative.[/dim]"
        )


if __name__ == "__main__":
    main()
