"""A loopback simulation of a fleet of runners (1,000 by default) against one ``store serve`` on Postgres.

Each simulated runner is an asyncio task with a connection of its own, doing what a real runner does over HTTP:

1. claim one rollout (``POST /v1/agl/queues/rollouts/claim``, long-polling);
2. make ``--calls`` chat calls through the store's LLM proxy (``/rollout/{id}/attempt/{id}/v1/chat/completions``)
   to a stand-in upstream that answers at once (``bench/echo_upstream.py``, not a model), each after a think time
   drawn from an exponential distribution of mean ``--think`` seconds (the agent's tools);
3. end the attempt with its spans (``POST /v1/agl/attempts/end``: one tool span per call and a reward span, as
   ``store run`` sends an attempt's last spans with its status).

The runners are spread over ``--processes`` client processes. The driver publishes the upstream as the LLM,
enqueues ``--rollouts`` rollouts, and waits for them all. It reports:

* rollouts/s from the first claim to the last end;
* claim latency p50/p99 (claims that returned a rollout; a long-poll that waited for work is not counted);
* proxy overhead p99: the p99 of chat calls through the proxy minus the p99 of the same call made straight to the
  upstream by a probe in each client process during the run (same machine, same load);
* the server's and Postgres's CPU-seconds per rollout over the run (``/proc``, as ``bench/server_cpu.py``), and
  over its steady part: while at least ``--runners`` rollouts are still to finish, every runner has work (the
  queue is not empty), so no runner is idling; the driver samples the CPU counters and the number of finished
  rollouts (a count in the database: the driver's sampling and waiting cost the server nothing) every second. The steady
  figures are what the capacity model scales; they need ``--rollouts`` of at least twice ``--runners``;
* the server's and Postgres's cores busy while at least 95% of the runners are idle (long-polling an empty
  queue, as ``store run`` workers do, without their heartbeats);
* integrity, checked in the database: every rollout succeeded with exactly one attempt, each with ``--calls``
  recorded LLM calls and its spans, and no rollout was claimed twice across all the runners.

Every process (server, Postgres, clients, upstream) shares this machine's cores: the clients' own CPU is part of
what limits the rate, so read the server's CPU per rollout, not the rate, as what the capacity model scales.

    python -m bench.runner_fleet --runners 1000 --rollouts 2000
    python -m bench.runner_fleet --runners 1000 --rollouts 2000 --server-workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from bench.harness import add_postgres_url, database, echo_upstream, group_cpu, log, postgres_cpu, server_process
from lightning_store.client import HttpStore
from lightning_store.resources import LLM

CLAIM_POLL = 5.0
"""Seconds one claim long-polls before the runner asks again (and checks whether the run is over): a ``store
run`` worker's default (``poll_timeout``). Idle runners' polls are part of a fleet's cost; a shorter poll than
real runners use made them most of the server's CPU once the queue was empty."""

STEADY_FROM = 0.1
"""The steady part of a run starts when this share of the rollouts has finished (the fleet has ramped up)."""

IDLE_SHARE_LEFT = 0.05
"""The idle part of a run: at most this share of the runners still has a rollout."""


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spans(rollout_id: str, attempt_id: str, calls: int) -> list[dict[str, Any]]:
    """A tracer's batch for one rollout: a span per tool call and a reward span (sequence ids allocated)."""
    trace_id = uuid.uuid4().hex
    now = time.time()
    names = [*(f"tool.search.{i}" for i in range(calls)), "reward"]
    return [
        {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "sequence_id": 0,
            "trace_id": trace_id,
            "span_id": f"{i + 1:016x}",
            "parent_id": None,
            "name": name,
            "status": {"status_code": "OK"},
            "attributes": {"tool.name": "search", "tool.query": "trains to Paris"}
            if name != "reward"
            else {"reward": 1.0},
            "start_time": now,
            "end_time": now,
        }
        for i, name in enumerate(names)
    ]


class Fleet:
    """The runners of one client process and what they measured."""

    def __init__(self, url: str, upstream: str, args: argparse.Namespace, process: int) -> None:
        self.url, self.upstream, self.args, self.process = url, upstream, args, process
        self.claims: list[float] = []
        self.proxied: list[float] = []
        self.direct: list[float] = []
        self.claimed: list[str] = []
        self.errors: list[str] = []
        self.first_claim = float("inf")
        self.last_end = 0.0

    async def run(self, runners: int, stop: Any) -> None:
        limits = httpx.Limits(max_connections=runners + 4, max_keepalive_connections=runners + 4)
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
            tasks = [asyncio.create_task(self._runner(client, i, stop)) for i in range(runners)]
            tasks.append(asyncio.create_task(self._probe(client, stop)))
            await asyncio.gather(*tasks)

    async def _post(self, client: httpx.AsyncClient, path: str, body: Any) -> Any:
        response = await client.post(self.url + path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
        return response.json()

    async def _runner(self, client: httpx.AsyncClient, index: int, stop: Any) -> None:
        rng = random.Random(self.process * 100_000 + index)
        worker = f"sim-{self.process}-{index}"
        await asyncio.sleep(rng.uniform(0, self.args.think))  # the fleet does not start in lockstep
        while not stop.is_set():
            ids: tuple[str, str] | None = None
            try:
                started = time.perf_counter()
                claims = await self._post(
                    client, "/v1/agl/queues/rollouts/claim", {"limit": 1, "worker_id": worker, "timeout": CLAIM_POLL}
                )
                if not claims:
                    continue
                now = time.perf_counter()
                self.claims.append(now - started)
                self.first_claim = min(self.first_claim, time.time())
                rollout = claims[0]["rollout"]
                rollout_id, attempt_id = rollout["rollout_id"], rollout["attempt"]["attempt_id"]
                ids = rollout_id, attempt_id
                self.claimed.append(rollout_id)
                await self._episode(client, rng, rollout_id, attempt_id)
                self.last_end = max(self.last_end, time.time())
            except Exception as error:  # counted and reported: a run with errors is not a clean run
                self.errors.append(f"{type(error).__name__}: {error}")
                if ids is not None:  # end it, or the run would wait for it forever
                    end = {"rollout_id": ids[0], "attempt_id": ids[1], "status": "failed"}
                    with contextlib.suppress(Exception):
                        await self._post(client, "/v1/agl/attempts/end", {"ends": [end]})
                await asyncio.sleep(1.0)

    async def _episode(self, client: httpx.AsyncClient, rng: random.Random, rollout_id: str, attempt_id: str) -> None:
        proxy = f"{self.url}/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions"
        messages: list[dict[str, str]] = [{"role": "user", "content": "Plan a trip to Paris."}]
        for _ in range(self.args.calls):
            await asyncio.sleep(rng.expovariate(1 / self.args.think) if self.args.think > 0 else 0)
            started = time.perf_counter()
            response = await client.post(proxy, json={"model": "echo", "messages": messages, "max_tokens": 8})
            self.proxied.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"proxy: {response.status_code} {response.text[:200]}")
            content = response.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "And then?"}]
        # The attempt's spans go with its end, as a runner sends them (one request).
        spans = _spans(rollout_id, attempt_id, self.args.calls)
        ends = [{"rollout_id": rollout_id, "attempt_id": attempt_id, "status": "succeeded", "spans": spans}]
        ended = await self._post(client, "/v1/agl/attempts/end", {"ends": ends})
        if ended[0] is None:
            raise RuntimeError(f"attempt {attempt_id} was no longer current when it ended")

    async def _probe(self, client: httpx.AsyncClient, stop: Any) -> None:
        """Direct calls to the upstream, the baseline the proxy's overhead is measured against."""
        body = {"model": "echo", "messages": [{"role": "user", "content": "Plan a trip to Paris."}], "max_tokens": 8}
        while not stop.is_set():
            started = time.perf_counter()
            try:
                await client.post(f"{self.upstream}/chat/completions", json=body)
            except httpx.HTTPError as error:  # counted: a run with errors is not a clean run
                self.errors.append(f"probe: {type(error).__name__}: {error}")
            else:
                self.direct.append(time.perf_counter() - started)
            await asyncio.sleep(0.2)

    def result(self) -> dict[str, Any]:
        return {
            "claims": self.claims,
            "proxied": self.proxied,
            "direct": self.direct,
            "claimed": self.claimed,
            "errors": self.errors[:20],
            "error_count": len(self.errors),
            "first_claim": self.first_claim,
            "last_end": self.last_end,
        }


def _client(url: str, upstream: str, args: argparse.Namespace, process: int, runners: int, stop: Any, out: Any) -> None:
    fleet = Fleet(url, upstream, args, process)
    asyncio.run(fleet.run(runners, stop))
    out.put(fleet.result())


async def _integrity(database_url: str, rollout_ids: list[str], calls: int) -> dict[str, int]:
    """Counts that must all be 0 in a clean run, read from the database itself."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.text(
                        """
                        WITH per_rollout AS (
                            SELECT r.rollout_id, r.status,
                                   (SELECT count(*) FROM attempts a WHERE a.rollout_id = r.rollout_id) AS attempts,
                                   (SELECT count(*) FROM spans s WHERE s.rollout_id = r.rollout_id) AS spans
                            FROM rollouts r
                        )
                        SELECT count(*) FILTER (WHERE status <> 'succeeded'),
                               count(*) FILTER (WHERE attempts <> 1),
                               count(*) FILTER (WHERE spans <> :spans),
                               count(*)
                        FROM per_rollout
                        """
                    ),
                    {"spans": 2 * calls + 1},  # a proxied call's span, a tool span per call, the reward span
                )
            ).one()
    finally:
        await engine.dispose()
    return {
        "not_succeeded": int(row[0]),
        "not_one_attempt": int(row[1]),
        "wrong_span_count": int(row[2]),
        "missing_rollouts": len(rollout_ids) - int(row[3]),
    }


async def _enqueue(url: str, upstream: str, rollouts: int) -> list[str]:
    store = HttpStore(url)
    try:
        await store.add_resources({"main_llm": LLM(endpoint=upstream, model="echo")})
        ids: list[str] = []
        for start in range(0, rollouts, 1000):
            batch = [{"input": {"i": i}} for i in range(start, min(rollouts, start + 1000))]
            ids += [r.rollout_id for r in await store.enqueue_many_rollouts(batch)]  # type: ignore[arg-type]
        return ids
    finally:
        await store.close()


class Samples:
    """(time, finished rollouts, server CPU-s, Postgres CPU-s) every second, read from ``/proc`` and the database."""

    def __init__(self, database_url: str, server_pgid: int) -> None:
        self.engine = create_async_engine(database_url, pool_size=1)
        self.server_pgid = server_pgid
        self.rows: list[tuple[float, int, float, float]] = []

    async def take(self) -> None:
        async with self.engine.connect() as conn:
            finished = await conn.scalar(
                sa.text("SELECT count(*) FROM rollouts WHERE status IN ('succeeded', 'failed', 'cancelled')")
            )
        self.rows.append((time.monotonic(), int(finished or 0), group_cpu(self.server_pgid), postgres_cpu()))

    def steady(self, rollouts: int, runners: int) -> dict[str, float | None]:
        """Rate and CPU per rollout between the first and last samples of the steady part (see the module's
        docstring); None where the run had no steady part of two samples."""
        inside = [row for row in self.rows if STEADY_FROM * rollouts <= row[1] <= rollouts - runners]
        if len(inside) < 2 or inside[-1][1] == inside[0][1]:
            return {"steady_rollouts_per_s": None, "steady_server_cpu_ms": None, "steady_postgres_cpu_ms": None}
        (t0, n0, s0, p0), (t1, n1, s1, p1) = inside[0], inside[-1]
        return {
            "steady_rollouts_per_s": (n1 - n0) / (t1 - t0),
            "steady_server_cpu_ms": (s1 - s0) / (n1 - n0) * 1000,
            "steady_postgres_cpu_ms": (p1 - p0) / (n1 - n0) * 1000,
        }

    def idle(self, rollouts: int, runners: int) -> dict[str, float | None]:
        """The server's and Postgres's CPU share (cores) while at least 95% of the runners had no work: the last
        rollouts finishing while the others long-poll the empty queue. None without two such samples."""
        inside = [row for row in self.rows if row[1] >= rollouts - runners * IDLE_SHARE_LEFT]
        if len(inside) < 2:
            return {"idle_server_cores": None, "idle_postgres_cores": None}
        (t0, _, s0, p0), (t1, _, s1, p1) = inside[0], inside[-1]
        return {"idle_server_cores": (s1 - s0) / (t1 - t0), "idle_postgres_cores": (p1 - p0) / (t1 - t0)}


async def _wait(samples: Samples, rollouts: int, deadline: float) -> None:
    """Take ``samples`` every second until every rollout has finished: the count comes from the database, so
    the driver's waiting costs the server nothing (a long-poll on thousands of rollouts would be part of the
    server CPU measured)."""
    try:
        while time.monotonic() < deadline:
            await samples.take()
            if samples.rows[-1][1] >= rollouts:
                return
            await asyncio.sleep(1.0)
        raise RuntimeError(f"{rollouts - samples.rows[-1][1]} rollouts did not finish in time")
    finally:
        await samples.engine.dispose()


def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    extra = ["--workers", str(args.server_workers)] if args.server_workers > 1 else []
    context = multiprocessing.get_context("spawn")
    with (
        echo_upstream(directory) as upstream,
        database("postgres", args.postgres_url, directory) as database_url,
        server_process("postgres", directory, database_url, extra=extra) as (url, process),
    ):
        assert database_url is not None
        ids = asyncio.run(_enqueue(url, upstream, args.rollouts))
        stop, out = context.Event(), context.Queue()
        shares = [args.runners // args.processes + (i < args.runners % args.processes) for i in range(args.processes)]
        clients = [
            context.Process(target=_client, args=(url, upstream, args, i, share, stop, out))
            for i, share in enumerate(shares)
        ]
        samples = Samples(database_url, process.pid)
        server0, pg0 = group_cpu(process.pid), postgres_cpu()
        for client in clients:
            client.start()
        log(f"{args.runners} runners in {args.processes} processes, {args.rollouts} rollouts")
        try:
            asyncio.run(_wait(samples, args.rollouts, time.monotonic() + args.timeout))
        finally:
            server1, pg1 = group_cpu(process.pid), postgres_cpu()
            stop.set()
            results = [out.get(timeout=120) for _ in clients]
            for client in clients:
                client.join()
        integrity = asyncio.run(_integrity(database_url, ids, args.calls))
    claimed = [rollout for r in results for rollout in r["claimed"]]
    proxied = [v for r in results for v in r["proxied"]]
    direct = [v for r in results for v in r["direct"]]
    claims = [v for r in results for v in r["claims"]]
    window = max(r["last_end"] for r in results) - min(r["first_claim"] for r in results)
    return {
        "runners": args.runners,
        "server_workers": args.server_workers,
        "rollouts": args.rollouts,
        "calls_per_rollout": args.calls,
        "think_s": args.think,
        "rollouts_per_s": args.rollouts / window,
        "llm_calls_per_s": args.rollouts * args.calls / window,
        "claim_p50_ms": _percentile(claims, 0.5) * 1000,
        "claim_p99_ms": _percentile(claims, 0.99) * 1000,
        "proxied_p50_ms": _percentile(proxied, 0.5) * 1000,
        "proxied_p99_ms": _percentile(proxied, 0.99) * 1000,
        "direct_p50_ms": _percentile(direct, 0.5) * 1000,
        "direct_p99_ms": _percentile(direct, 0.99) * 1000,
        "proxy_overhead_p99_ms": (_percentile(proxied, 0.99) - _percentile(direct, 0.99)) * 1000,
        "server_cpu_ms_per_rollout": (server1 - server0) / args.rollouts * 1000,
        "postgres_cpu_ms_per_rollout": (pg1 - pg0) / args.rollouts * 1000,
        **samples.steady(args.rollouts, args.runners),
        **samples.idle(args.rollouts, args.runners),
        "claimed_twice": len(claimed) - len(set(claimed)),
        "client_errors": sum(r["error_count"] for r in results),
        "error_samples": [e for r in results for e in r["errors"]][:5],
        **integrity,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runners", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=4, help="client processes the runners are spread over")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=3, help="LLM calls per rollout")
    parser.add_argument("--think", type=float, default=2.0, help="mean think time before each call (s)")
    parser.add_argument("--server-workers", type=int, default=1, help="store serve --workers")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the rollouts may take in all")
    add_postgres_url(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ls-bench-fleet-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    clean = all(result[k] == 0 for k in ("claimed_twice", "client_errors", "not_succeeded", "not_one_attempt"))
    clean = clean and result["wrong_span_count"] == 0 and result["missing_rollouts"] == 0
    print("integrity:", "clean" if clean else "FAILED")


if __name__ == "__main__":
    main()
