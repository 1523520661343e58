"""What one LLM call through the store's proxy costs: ``store serve``'s CPU per call, side by side with the same
calls made straight to the upstream.

The upstream is ``bench/echo_upstream.py`` (a stand-in that answers at once, not a model), so what is measured
is the proxy's own work per call: the HTTP request, the one read of the attempt's resources, the forward, and
the span and LLM-call records written in the background. ``store serve`` runs on a SQLite file. ``--concurrency``
attempts call at once, each its own rollout; every call is timed after a warm-up round.

Printed for each way: calls/s, and the CPU seconds per call of the processes that serve it (``store serve``
and the upstream), from ``psutil``; ``proxy / direct`` is the ratio of calls/s. The client is one process of
``aiohttp`` sessions, so that it is not the bottleneck it would be with httpx on two cores.

    python -m bench.proxy_calls --calls 2000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from algorithms.local_stack import embedded_store, free_port, subprocess_in
from bench.harness import wait_listening
from lightning_store import aio
from lightning_store.client import HttpStore
from lightning_store.models import EnqueueRolloutRequest
from lightning_store.resources import LLM

BODY = {
    "model": "echo",
    "messages": [
        {"role": "system", "content": "You are a travel assistant. Tools: memory, search, calculator."},
        {"role": "user", "content": "My flight was cancelled. What should I do first?"},
    ],
    "max_tokens": 8,
}


async def measure(urls: list[str], calls: int, serving: list[psutil.Process]) -> dict[str, float]:
    """Calls/s and server CPU per call, for ``calls`` calls spread over ``urls`` (one caller each)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=len(urls))) as http:

        async def caller(url: str, n: int) -> None:
            for _ in range(n):
                async with http.post(url, json=BODY) as response:
                    assert response.status == 200, await response.text()
                    await response.read()

        await asyncio.gather(*(caller(url, 5) for url in urls))  # warm-up: connections, caches
        before = [p.cpu_times() for p in serving]
        started = time.perf_counter()
        await asyncio.gather(*(caller(url, calls // len(urls)) for url in urls))
        elapsed = time.perf_counter() - started
        after = [p.cpu_times() for p in serving]
    done = calls // len(urls) * len(urls)
    cpu = sum(a.user + a.system - b.user - b.system for a, b in zip(after, before, strict=True))
    return {"calls_per_s": done / elapsed, "cpu_ms_per_call": cpu / done * 1000}


async def bound_urls(store_url: str, upstream: str, concurrency: int) -> list[str]:
    """One rollout per caller, claimed, with the echo upstream as its LLM; the proxy URL of each attempt."""
    store = HttpStore(store_url)
    try:
        await store.add_resources({"policy": LLM(endpoint=upstream, model="echo")})
        await store.enqueue_many_rollouts([EnqueueRolloutRequest(input={"caller": i}) for i in range(concurrency)])
        claimed = await store.dequeue_many_rollouts(limit=concurrency, worker_id="bench", timeout=5)
    finally:
        await store.close()
    prefix = f"{store_url}/rollout/{{}}/attempt/{{}}/v1/chat/completions"
    return [prefix.format(c.rollout_id, c.attempt.attempt_id) for c in claimed]


def run(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    with subprocess_in([sys.executable, "-m", "bench.echo_upstream", str(port)], work / "upstream.log") as echo:
        wait_listening(port)
        with embedded_store(work / "store") as store_url:
            serve = next(p for p in psutil.Process().children(recursive=True) if "serve" in p.cmdline())
            echo_process = psutil.Process(echo.pid)
            urls = aio.run(bound_urls(store_url, upstream, args.concurrency))
            direct = aio.run(measure([f"{upstream}/chat/completions"] * args.concurrency, args.calls, [echo_process]))
            proxied = aio.run(measure(urls, args.calls, [serve, echo_process]))
    return {"direct": direct, "proxy": proxied}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="Calls per way (after a warm-up of 5 per caller).")
    parser.add_argument("--concurrency", type=int, default=32, help="Callers at once, one attempt each.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results: dict[str, Any] = run(args, Path(tmp))
    print(f"{args.calls} calls, {args.concurrency} at once, echo upstream")
    print(f"{'':>8} {'calls/s':>9} {'server CPU ms/call':>19}")
    for way, numbers in results.items():
        print(f"{way:>8} {numbers['calls_per_s']:9.0f} {numbers['cpu_ms_per_call']:19.2f}")
    added = results["proxy"]["cpu_ms_per_call"] - results["direct"]["cpu_ms_per_call"]
    print(f"proxy / direct, calls/s: {results['proxy']['calls_per_s'] / results['direct']['calls_per_s']:.2f}")
    print(f"the proxy's own CPU per call (store serve): {added:.2f} ms")


if __name__ == "__main__":
    main()
