"""Selective training by the span an LLM call was made in (issue 40): a LangGraph node names the agent of its
calls, and so does any span the algorithm's ``agent_spans`` names; the paper's SQL agent trains its writing and
rewriting nodes only.

Real parts: a SQL store, ``store serve`` (whose proxy records the calls), LangGraph with the OpenInference
LangChain instrumentor, the tracer. The hosted LLM is a stand-in (``tests.scripted_upstream``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypedDict

import httpx
import pytest

from adapters import TransitionAdapter
from adapters.episodes import read_episodes
from lightning_store.models import AttemptedRollout
from lightning_store.sql import SqlStore
from tests.conftest import behind_a_stand_in
from tracers import Tracer, emit_reward, instrument, operation

langgraph = pytest.importorskip("langgraph.graph")


@pytest.fixture(scope="module", autouse=True)
def instrumented() -> list[str]:
    return instrument(["langchain"])


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[SqlStore, str]]:
    async with behind_a_stand_in(database_url, {}) as served:
        yield served


class SqlState(TypedDict, total=False):
    question: str
    query: str
    verdict: str


def sql_graph(base_url: str, http: httpx.AsyncClient) -> Any:
    """Write → check → rewrite, each node one call of the same model (the paper's text-to-SQL shape)."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base_url, api_key="unused", model="scripted", http_async_client=http)

    async def write_query(state: SqlState) -> SqlState:
        return {"query": str((await llm.ainvoke([("user", state["question"])])).content)}

    async def check_query(state: SqlState) -> SqlState:
        return {"verdict": str((await llm.ainvoke([("user", f"Check: {state['query']}")])).content)}

    async def rewrite_query(state: SqlState) -> SqlState:
        return {"query": str((await llm.ainvoke([("user", f"Rewrite: {state['query']}")])).content)}

    graph = langgraph.StateGraph(SqlState)
    for node in (write_query, check_query, rewrite_query):
        graph.add_node(node.__name__, node)
    graph.add_edge(langgraph.START, "write_query")
    graph.add_edge("write_query", "check_query")
    graph.add_edge("check_query", "rewrite_query")
    graph.add_edge("rewrite_query", langgraph.END)
    return graph.compile()


async def finish(store: SqlStore, rollout: AttemptedRollout, calls: int) -> None:
    """Wait for the proxy's records (written after it answered), then end the attempt as a runner would."""
    for _ in range(200):
        if len(await store.query_llm_calls([rollout.rollout_id])) >= calls:
            break
        await asyncio.sleep(0.025)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")


async def test_langgraph_nodes_name_their_calls_and_select_what_is_trained(served: tuple[SqlStore, str]) -> None:
    store, url = served
    rollout = await store.start_rollout({"question": "How many flights left Paris?"})
    tracer = Tracer(store)
    base_url = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
    async with httpx.AsyncClient() as http:
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            await sql_graph(base_url, http).ainvoke({"question": "How many flights left Paris?"})
            emit_reward(1.0)
    assert await tracer.flush()
    await finish(store, rollout, 3)

    [episode] = (await read_episodes(store, [rollout.rollout_id])).episodes
    assert [episode.agent_of(call) for call in episode.calls] == ["write_query", "check_query", "rewrite_query"]
    adapted = await TransitionAdapter(agents="write_query|rewrite_query").read(store, [rollout.rollout_id])
    assert [t.agent_name for t in adapted.transitions] == ["write_query", "rewrite_query"]
    assert adapted.skipped["other_agent_calls"] == 1  # the checker's call: recorded, not trained


async def test_spans_named_in_agent_spans_name_the_agent_of_their_calls(served: tuple[SqlStore, str]) -> None:
    store, url = served
    rollout = await store.start_rollout({"task": 1})
    tracer = Tracer(store)
    base_url = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key="unused") as client:
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            for step in ("planner", "solver"):
                with operation(step):
                    await client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": step}])
            emit_reward(0.5)
    assert await tracer.flush()
    await finish(store, rollout, 2)

    [plain] = (await read_episodes(store, [rollout.rollout_id])).episodes
    assert [plain.agent_of(call) for call in plain.calls] == [None, None]  # an operation is no agent by itself
    adapter = TransitionAdapter(agents="solver", agent_spans=("planner", "solver"))
    adapted = await adapter.read(store, [rollout.rollout_id])
    assert [t.agent_name for t in adapted.transitions] == ["solver"] and adapted.skipped["other_agent_calls"] == 1
