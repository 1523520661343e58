"""``runners.prompt``: framework code reads the running attempt's prompt template (what APO rewrites) wherever it is
defined, and concurrent attempts on different prompts each read their own (issue 40), async agents and sync
agents in threads alike. Real parts: a SQL store and an in-process ``Worker`` running four attempts at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from lightning_store import PromptTemplate
from lightning_store.sql import SqlStore, open_store
from runners import Worker, current_resources, prompt, rollout

# Module level, as a framework agent defines its prompt: the attempt's resource replaces it while it runs.
INSTRUCTIONS = "the default instructions"


def instructions() -> str:
    return prompt("instructions", INSTRUCTIONS)


@rollout
async def async_agent(task: dict[str, Any]) -> float:
    await asyncio.sleep(task["pause"])  # other attempts run meanwhile
    return 1.0 if instructions() == task["expected"] else 0.0


@rollout
def sync_agent(task: dict[str, Any]) -> float:
    time.sleep(task["pause"])
    return 1.0 if instructions() == task["expected"] else 0.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog_interval=0)
    yield opened
    await opened.close()


@pytest.mark.parametrize("agent", [async_agent, sync_agent], ids=["async", "sync"])
async def test_concurrent_attempts_each_read_their_own_prompt(store: SqlStore, agent: Any) -> None:
    texts = {"a": "Answer briefly.", "b": "Answer at length, citing sources."}
    snapshots = {
        key: await store.add_resources({"instructions": PromptTemplate(template=text, engine="f-string")})
        for key, text in texts.items()
    }
    ids = []
    for i in range(8):
        key = "ab"[i % 2]
        task = {"expected": texts[key], "pause": 0.2 if i < 4 else 0.0}
        ids.append((await store.enqueue_rollout(task, resources_id=snapshots[key].resources_id)).rollout_id)
    plain = await store.add_resources({})
    task = {"expected": INSTRUCTIONS, "pause": 0.0}  # no such resource: the default
    ids.append((await store.enqueue_rollout(task, resources_id=plain.resources_id)).rollout_id)

    worker = Worker(store, agent, worker_id="w", heartbeat_interval=0.5, poll_timeout=0.2, concurrency=4)
    await asyncio.wait_for(worker.run(asyncio.Event(), idle_exit=0.5), 60)
    rewards = {
        s.rollout_id: s.attributes["agentlightning.reward.0.value"]
        for rid in ids
        for s in await store.query_spans(rid)
        if s.name == "agentlightning.annotation"
    }
    assert rewards == dict.fromkeys(ids, 1.0)


def test_outside_an_attempt_the_default_or_a_clear_error() -> None:
    assert prompt("instructions", "You are {role}.", role="a pilot") == "You are a pilot."
    with pytest.raises(KeyError, match="no prompt template named 'instructions'"):
        prompt("instructions")
    with pytest.raises(LookupError, match="no attempt is running"):
        current_resources()
