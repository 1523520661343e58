"""Tools from an MCP server (the ``mcp`` package, stdio transport) used by an OpenAI Agents SDK agent: each tool
call is a tool span with its input and output, read back by the adapter as the episode's tool call (issue 40).

Real parts: the MCP server is a subprocess (``tests/mcp_calculator.py``), the Agents SDK and its OpenInference
instrumentor, ``store serve`` and its proxy, the tracer. The hosted LLM is a stand-in (``tests.scripted_upstream``:
it calls the offered tool, then answers with its result)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.episodes import read_episodes
from lightning_store.sql import SqlStore
from tests.conftest import behind_a_stand_in
from tracers import Tracer, emit_reward, instrument

agents = pytest.importorskip("agents")
agents_mcp = pytest.importorskip("agents.mcp")
SERVER = Path(__file__).parents[1] / "mcp_calculator.py"


@pytest.fixture(scope="module", autouse=True)
def instrumented() -> list[str]:
    return instrument(["openai-agents"])


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[SqlStore, str]]:
    async with behind_a_stand_in(database_url, {"a": 2, "b": 3}) as served:
        yield served


async def test_an_mcp_servers_tool_calls_are_tool_spans_with_input_and_output(served: tuple[SqlStore, str]) -> None:
    from openai import AsyncOpenAI

    store, url = served
    rollout = await store.start_rollout({"question": "What is 2 + 3?"})
    tracer = Tracer(store)
    base = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
    with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
        async with (
            AsyncOpenAI(base_url=base, api_key="unused") as client,
            agents_mcp.MCPServerStdio(params={"command": sys.executable, "args": [str(SERVER)]}) as mcp,
        ):
            model = agents.OpenAIChatCompletionsModel(model="scripted", openai_client=client)
            agent = agents.Agent(name="calc", instructions="Use the add tool.", mcp_servers=[mcp], model=model)
            result = await agents.Runner.run(agent, "What is 2 + 3?")
        emit_reward(1.0 if "5" in str(result.final_output) else 0.0)
    assert await tracer.flush()
    assert result.final_output == "Answer: 5.0"

    [tool] = [
        s for s in await store.query_spans(rollout.rollout_id) if s.attributes.get("openinference.span.kind") == "TOOL"
    ]
    assert tool.name == tool.attributes["tool.name"] == "add" and tool.status.status_code == "OK"
    assert json.loads(tool.attributes["input.value"]) == {"a": 2, "b": 3}
    assert json.loads(tool.attributes["output.value"])["text"] == "5.0"

    for _ in range(200):  # the proxy records its two calls after answering
        if len(await store.query_llm_calls([rollout.rollout_id])) == 2:
            break
        await asyncio.sleep(0.025)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
    [episode] = (await read_episodes(store, [rollout.rollout_id])).episodes
    assert [(t.name, t.ok) for t in episode.tools] == [("add", True)] and episode.reward == 1.0
    assert [len(episode.tools_after(i)) for i in range(len(episode.calls))] == [1, 0]
