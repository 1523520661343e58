"""A multi-step agent written with the plain OpenAI SDK, run by the runner against ``store serve`` with the LLM
proxy in front of a real OpenAI-compatible policy server (transformers, a tiny model built offline)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from algorithms.serving.policy_server import PolicyServer
from algorithms.serving.tiny_model import build_tiny_model
from lightning_store import LLM
from lightning_store.sql import SqlStore
from runners import Runner
from tests.conftest import serve_app


@pytest.fixture
async def policy(tmp_path: Path) -> AsyncIterator[tuple[PolicyServer, str]]:
    server = PolicyServer(build_tiny_model(tmp_path / "model"), model_name="tiny")
    async with serve_app(server.app()) as url:
        yield server, url


async def test_openai_sdk_agent_is_captured_token_exact(
    policy: tuple[PolicyServer, str], served: tuple[SqlStore, str]
) -> None:
    (server, upstream), (store, url) = policy, served
    await store.add_resources({"main_llm": LLM(endpoint=f"{upstream}/v1", model="tiny")})
    question = "My flight just got cancelled. How do I get to Paris by tomorrow morning?"
    rollouts = await store.enqueue_many_rollouts([{"input": {"question": question}} for _ in range(4)])  # type: ignore[misc]
    ids = [r.rollout_id for r in rollouts]

    runner = Runner("examples.flight.agent:flight_agent", url, workers=2, heartbeat_interval=1, progress=False)
    running = asyncio.create_task(runner.run())
    finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=240)
    runner.stop()
    await asyncio.wait_for(running, 60)

    assert [r.status for r in finished] == ["succeeded"] * 4
    for rollout_id in ids:
        [attempt] = await store.query_attempts(rollout_id)
        spans = list(await store.query_spans(rollout_id))
        assert {s.attempt_id for s in spans} == {attempt.attempt_id}
        calls = await store.query_llm_calls([rollout_id])
        seen = [
            json.loads(s.attributes["agentlightning.object.json"]) for s in spans if s.name == "agentlightning.object"
        ]
        assert len(calls) == len(seen) == 3
        for call, agent_saw in zip(calls, seen, strict=True):
            # The ids the store recorded are the ones the policy server produced and the agent received...
            assert call.prompt_token_ids == agent_saw["prompt_token_ids"]
            assert call.response_token_ids == agent_saw["token_ids"] and call.response_token_ids
            # ...and the prompt ids are the server's own tokenization of the conversation the agent sent.
            assert call.request is not None
            template = server.tokenizer.apply_chat_template(
                call.request["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert call.prompt_token_ids == list(template)
        tools = [s for s in spans if s.name.startswith("execute_tool ")]
        assert len(tools) == 3 and all(s.status.status_code == "OK" for s in tools)
        first_tool = tools[0].attributes["gen_ai.tool.name"]
        [reward] = [s for s in spans if s.name == "agentlightning.annotation"]
        assert reward.attributes["agentlightning.reward.0.value"] == (1.0 if first_tool == "memory" else 0.0)
