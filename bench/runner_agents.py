"""Agents for ``bench/runner_throughput.py`` (imported by worker processes as ``bench.runner_agents:…``)."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from lightning_store.resources import LLM
from runners import rollout

CALLS = 6


@rollout
async def noop(task: Any) -> float:
    return 1.0


@rollout
async def six_calls(task: Any, llm: LLM) -> float:
    """Six chat calls in a row through the attempt's LLM endpoint (the store's proxy), then a reward."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "Plan a trip to Paris."}]
        for _ in range(CALLS):
            completion = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8)
            messages += [{"role": "assistant", "content": completion.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": "And then?"}]
    return 1.0
