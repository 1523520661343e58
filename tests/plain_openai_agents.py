"""Agents that build their OpenAI client the way OpenAI's quickstart does, without the ``llm`` they could be
given: ``OpenAI()`` at import time, ``AsyncOpenAI()`` inside the rollout, each naming a hosted model. Only worker
processes import this module (building ``OpenAI()`` needs ``OPENAI_API_KEY``, which the runner sets there)."""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI, OpenAI

from runners import rollout

client = OpenAI()  # at import, before any attempt: the runner's defaults must already be set


@rollout
def module_client_agent(task: dict[str, Any]) -> float:
    """One chat call through the module's client; 1.0 when the answer came back."""
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if (reply.choices[0].message.content or "").startswith("Answer") else 0.0


@rollout
async def fresh_client_agent(task: dict[str, Any]) -> float:
    """Two chat calls through a client built in the rollout."""
    async with AsyncOpenAI() as fresh:
        for _ in range(2):
            reply = await fresh.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": task["q"]}]
            )
    return 1.0 if (reply.choices[0].message.content or "").startswith("Answer") else 0.0
