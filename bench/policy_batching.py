"""Benchmark of the built-in policy server: N clients sending chat requests at once, batched decoding
(``max_batch_size`` 32, the default) against one request at a time (``max_batch_size=1``), side by side on the
same model, prompts and token limits; prints requests/s, generated tokens/s and the ratio.

The model is the tiny Qwen2 the tests build offline (``--model tiny``, default) or a local model directory
(e.g. SmolLM2-135M-Instruct, see docs/benchmarks.md). Each request samples at temperature 1 with its own seed, so
both servers generate the same tokens and only the decoding schedule differs.

    python -m bench.policy_batching --clients 1,4,16 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from algorithms.serving.local import LocalPolicy
from algorithms.serving.tiny_model import build_tiny_model

QUESTIONS = [
    "My flight to Paris was cancelled. Book me another one for tomorrow morning.",
    "The airline cancelled my flight home; what should I take instead?",
    "Think step by step, then call a tool or answer the user.",
    "Use the tools memory, search and calculator to find a new flight.",
]


async def measure(policy: LocalPolicy, clients: int, requests: int, max_tokens: int) -> tuple[float, float]:
    """(requests/s, generated tokens/s) of ``requests`` requests sent by ``clients`` concurrent clients."""
    async with httpx.AsyncClient(base_url=policy.base_url, timeout=600) as http:
        queue = list(range(requests))
        tokens = 0

        async def client() -> None:
            nonlocal tokens
            while queue:
                i = queue.pop()
                body = {
                    "model": policy.server.model_name,
                    "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                    "max_tokens": max_tokens,
                    "seed": i,
                    "return_token_ids": True,
                }
                response = (await http.post("/chat/completions", json=body)).raise_for_status().json()
                tokens += len(response["choices"][0]["token_ids"])

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return requests / elapsed, tokens / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' or a model directory")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--requests", type=int, default=64, help="requests per measurement")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    model = args.model
    if model == "tiny":
        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", hidden_size=256, layers=4))
    batched, single = LocalPolicy(model).start(), LocalPolicy(model, max_batch_size=1).start()
    print(f"model {model}, {args.requests} requests of up to {args.max_tokens} tokens per cell")
    print("| clients | one at a time (req/s, tok/s) | batched (req/s, tok/s) | batched / one at a time |")
    print("| ---: | ---: | ---: | ---: |")
    for clients in map(int, args.clients.split(",")):
        one = await measure(single, clients, args.requests, args.max_tokens)
        many = await measure(batched, clients, args.requests, args.max_tokens)
        print(
            f"| {clients} | {one[0]:.1f}, {one[1]:.0f} | {many[0]:.1f}, {many[1]:.0f} | {many[1] / one[1]:.2f}x |",
            flush=True,
        )
    print(f"batch sizes of the batched server: {dict(sorted(batched.server.batch_sizes.items()))}")
    batched.stop()
    single.stop()


if __name__ == "__main__":
    asyncio.run(main())
