"""OpenInference capture of LangChain and OpenAI Agents SDK agents, with no change to the agents' code.

Real parts throughout: a SQL store, a real ``store serve`` whose LLM proxy every LLM call goes through, the real
frameworks and instrumentors, the tracer; only the hosted LLM is a stand-in (``tests.scripted_upstream``: a
tool call on the first turn, an answer on the second, vLLM-style token ids).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from agents import Runner
from agents.tracing import get_trace_provider
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from lightning_store import LLM
from lightning_store.models import AttemptedRollout
from lightning_store.spans import Span
from lightning_store.sql import SqlStore, open_store
from runners import Runner as RolloutRunner
from tests.conftest import serve_app, serving
from tests.openinference_agent import AGENT_NAME, agents_sdk_agent, langchain_agent
from tests.scripted_upstream import ANSWER_IDS, TOOL_CALL_IDS, create_app
from tracers import Tracer, instrument
from tracers.openinference import FRAMEWORKS, Framework, instrument_from_settings

KIND = "openinference.span.kind"


@pytest.fixture(scope="module", autouse=True)
def instrumented() -> list[str]:
    return instrument(["langchain", "openai-agents"])


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[tuple[SqlStore, str]]:
    """A store, ``store serve`` of it (the LLM proxy) and the scripted stand-in as the LLM resource's upstream."""
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    async with serve_app(create_app({"city": "Paris"})) as upstream, serving(store) as url:
        await store.add_resources({"main_llm": LLM(endpoint=f"{upstream}/v1", model="scripted")})
        yield store, url
    await store.close()


def proxy_url(url: str, rollout: AttemptedRollout) -> str:
    return f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"


async def captured(store: SqlStore, rollout_id: str, attempt_id: str, proxy_spans: int = 2) -> list[Span]:
    """The rollout's spans, all on ``attempt_id``, once the proxy's (written after it answered) are in too."""
    for _ in range(200):
        spans = list(await store.query_spans(rollout_id))
        if sum(s.attributes.get("gen_ai.operation.name") == "chat" for s in spans) >= proxy_spans:
            assert {s.attempt_id for s in spans} == {attempt_id}
            return spans
        await asyncio.sleep(0.025)
    raise AssertionError("the proxy's spans did not arrive")


def one(spans: list[Span], match: Callable[[Span], bool]) -> Span:
    [span] = [s for s in spans if match(s)]
    return span


def ancestors(span: Span, spans: list[Span]) -> list[str]:
    by_id, names = {s.span_id: s for s in spans}, []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        names.append(span.name)
    return names


async def assert_token_ids_recorded(store: SqlStore, rollout_id: str, attempt_id: str) -> None:
    """The proxy recorded both LLM calls with the stand-in's token ids (it records after answering: wait)."""
    for _ in range(200):
        calls = await store.query_llm_calls([rollout_id])
        if len(calls) >= 2:
            break
        await asyncio.sleep(0.025)
    assert [c.response_token_ids for c in calls] == [TOOL_CALL_IDS, ANSWER_IDS]
    assert all(c.prompt_token_ids and c.attempt_id == attempt_id for c in calls)


def test_instrument_is_idempotent_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("autogen_agentchat")  # imported: auto instruments it too
    assert instrument() == ["langchain", "openai-agents", "autogen"] == instrument_from_settings("auto")
    assert instrument_from_settings(" LangChain, ") == ["langchain"]
    assert instrument_from_settings("none") == []
    # auto instruments only the frameworks the process (the agent's module) has imported.
    monkeypatch.delitem(sys.modules, "agents")
    monkeypatch.delitem(sys.modules, "autogen_agentchat")
    assert instrument_from_settings("auto") == ["langchain"]
    monkeypatch.undo()
    monkeypatch.setenv("LIGHTNING_STORE_INSTRUMENT", "openai-agents")
    assert instrument_from_settings() == ["openai-agents"]
    # The Agents SDK's own processors (the exporter to OpenAI's trace backend) were replaced.
    processors = get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined]
    assert [type(p).__name__ for p in processors] == ["OpenInferenceTracingProcessor"]
    with pytest.raises(ValueError, match="unknown framework"):
        instrument(["langgraph"])
    monkeypatch.setitem(
        FRAMEWORKS,
        "crewai",
        Framework("crewai", "openinference-instrumentation-crewai", "x:CrewAIInstrumentor", "crewai"),
    )
    assert "crewai" not in instrument()  # auto skips what is not installed
    with pytest.raises(ModuleNotFoundError, match=r"lightning-store\[openinference\]"):
        instrument(["crewai"])


async def test_langchain_agent_tool_and_llm_spans_land_on_their_attempts(served: tuple[SqlStore, str]) -> None:
    store, url = served
    tracer = Tracer(store)
    questions = {"ok": "Find me a flight with lookup_flight", "fail": "Reserve it with book_flight"}
    rollouts = {key: await store.start_rollout({"question": q}) for key, q in questions.items()}

    async def run(key: str, http: httpx.AsyncClient) -> str:
        rollout = rollouts[key]
        with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
            return await langchain_agent(proxy_url(url, rollout), questions[key], http)

    async with httpx.AsyncClient() as http:  # both attempts at once, in one event loop
        answers = list(await asyncio.gather(run("ok", http), run("fail", http)))
    assert answers == ["Answer: TAP 06:05 to Paris, 210 EUR", "Answer: no seats left to Paris"]
    assert await tracer.flush()

    for key, tool_name, status in (("ok", "lookup_flight", "OK"), ("fail", "book_flight", "ERROR")):
        ids = rollouts[key].rollout_id, rollouts[key].attempt.attempt_id
        spans = await captured(store, *ids)
        agent = one(spans, lambda s: s.attributes.get(KIND) == "AGENT")
        assert agent.name == AGENT_NAME and agent.status.status_code == "OK"
        called = one(spans, lambda s: s.attributes.get(KIND) == "TOOL")
        assert called.name == called.attributes["tool.name"] == tool_name
        assert called.status.status_code == status
        assert AGENT_NAME in ancestors(called, spans)
        llm_spans = [s for s in spans if s.attributes.get(KIND) == "LLM"]
        assert len(llm_spans) == 2 and all(ancestors(s, spans)[-1] == AGENT_NAME for s in llm_spans)
        assert [s.attributes["llm.token_count.completion"] for s in llm_spans] == [3, 4]
        await assert_token_ids_recorded(store, *ids)
    failed = one(list(await store.query_spans(rollouts["fail"].rollout_id)), lambda s: s.name == "book_flight")
    assert failed.status.description is not None and "no seats left to Paris" in failed.status.description
    assert failed.events[0].name == "exception"
    await tracer.shutdown()


async def test_langchain_spans_from_its_own_thread_pool_land_on_the_attempt(served: tuple[SqlStore, str]) -> None:
    store, url = served
    tracer = Tracer(store)
    rollout = await store.start_rollout({"question": "batch"})

    def sync_agent() -> list[Any]:
        with httpx.Client() as http:
            model = ChatOpenAI(
                base_url=proxy_url(url, rollout), api_key="unused", model="scripted", max_retries=0, http_client=http
            )
            return model.batch([[HumanMessage("to Paris")], [HumanMessage("to Lisbon")]])  # LangChain's thread pool

    with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
        replies = await asyncio.to_thread(sync_agent)
    assert [r.content for r in replies] == ["Answer: none"] * 2
    assert await tracer.flush()
    spans = await captured(store, rollout.rollout_id, rollout.attempt.attempt_id)
    assert sorted(s.name for s in spans if s.attributes.get(KIND) == "LLM") == ["ChatOpenAI"] * 2
    await tracer.shutdown()


def assert_agents_sdk_spans(spans: list[Span], tool_name: str, status: str) -> None:
    agent = one(spans, lambda s: s.attributes.get("agent.name") is not None)
    assert agent.attributes["agent.name"] == agent.name == AGENT_NAME and agent.attributes[KIND] == "AGENT"
    called = one(spans, lambda s: s.attributes.get(KIND) == "TOOL")
    assert called.name == called.attributes["tool.name"] == tool_name
    assert called.status.status_code == status and AGENT_NAME in ancestors(called, spans)
    generations = [s for s in spans if s.attributes.get(KIND) == "LLM"]
    assert len(generations) == 2 and all(AGENT_NAME in ancestors(s, spans) for s in generations)


async def test_openai_agents_sdk_agent_and_tool_spans_land_on_their_attempts(served: tuple[SqlStore, str]) -> None:
    store, url = served
    tracer = Tracer(store)
    questions = {"ok": "Find me a flight with lookup_flight", "fail": "Reserve it with book_flight"}
    rollouts = {key: await store.start_rollout({"question": q}) for key, q in questions.items()}

    async def run(key: str) -> str:
        rollout = rollouts[key]
        async with AsyncOpenAI(base_url=proxy_url(url, rollout), api_key="unused", max_retries=0) as client:
            with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
                result = await Runner.run(agents_sdk_agent(client), questions[key])
        return str(result.final_output)

    answers = await asyncio.gather(run("ok"), run("fail"))
    assert answers[0] == "Answer: TAP 06:05 to Paris, 210 EUR"
    assert answers[1].startswith("Answer: An error occurred while running the tool")
    assert await tracer.flush()

    for key, tool_name, status in (("ok", "lookup_flight", "OK"), ("fail", "book_flight", "ERROR")):
        ids = rollouts[key].rollout_id, rollouts[key].attempt.attempt_id
        spans = await captured(store, *ids)
        assert_agents_sdk_spans(spans, tool_name, status)
        await assert_token_ids_recorded(store, *ids)
    failed = one(list(await store.query_spans(rollouts["fail"].rollout_id)), lambda s: s.name == "book_flight")
    assert failed.status.description is not None and "Error running tool" in failed.status.description
    await tracer.shutdown()


@pytest.mark.slow
async def test_runner_captures_an_unmodified_agents_sdk_agent(served: tuple[SqlStore, str]) -> None:
    store, url = served
    questions = ["Find me a flight with lookup_flight", "Reserve it with book_flight"]
    enqueued = await store.enqueue_many_rollouts([{"input": {"question": q}} for q in questions])  # type: ignore[misc]
    ids = [r.rollout_id for r in enqueued]

    agent = "tests.openinference_agent:travel_agent"  # the agent's code does not mention the store or tracers
    runner = RolloutRunner(agent, url, workers=1, heartbeat_interval=1, poll_timeout=1, progress=False)
    running = asyncio.create_task(runner.run())
    finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=120)
    runner.stop()
    await asyncio.wait_for(running, 60)

    assert [r.status for r in finished] == ["succeeded"] * 2
    for rollout_id, (tool_name, status, reward) in zip(
        ids, [("lookup_flight", "OK", 1.0), ("book_flight", "ERROR", 0.0)], strict=True
    ):
        [attempt] = await store.query_attempts(rollout_id)
        spans = await captured(store, rollout_id, attempt.attempt_id)
        assert_agents_sdk_spans(spans, tool_name, status)
        [annotation] = [s for s in spans if s.name == "agentlightning.annotation"]
        assert annotation.attributes["agentlightning.reward.0.value"] == reward
        await assert_token_ids_recorded(store, rollout_id, attempt.attempt_id)
