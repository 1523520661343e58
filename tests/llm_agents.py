"""Agents that call their ``llm`` the way the README's "Run an agent" does, importable by worker processes as
``tests.llm_agents:name`` (the LLM-fallback tests run them with no ``llm`` resource registered)."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from lightning_store import LLM
from runners import rollout


@rollout
def readme_agent(task: dict[str, Any], llm: LLM) -> float:
    """The README's agent: one chat call through ``llm``; 1.0 when the answer came back."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", timeout=30)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if (reply.choices[0].message.content or "").startswith("Answer") else 0.0


@rollout
def optional_llm_agent(task: dict[str, Any], llm: LLM | None = None) -> float:
    """An agent that can do without an LLM: 0.0 when it got none, 1.0 when it got one."""
    return 0.0 if llm is None else 1.0


@rollout
def unfillable_agent(task: dict[str, Any], nothing_is_named_this: str) -> float:
    """An agent with a parameter that no resource fills: its attempts fail before it is called."""
    raise AssertionError("never called")


@rollout
def flat_agent(task: dict[str, Any], llm: LLM) -> float:
    """One short chat call through ``llm``, then the same reward whatever the model said: a task with no reward
    variance, from which GRPO can learn nothing."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", timeout=60)
    client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": str(task)}], max_tokens=4, temperature=1.0
    )
    return 0.0
