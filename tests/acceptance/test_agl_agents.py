"""Agents written for Agent Lightning 0.3 run under ``store run`` with one import changed
(:mod:`runners.agentlightning`; the agents are in ``tests.agl_agents``).

Real parts: the server app on 127.0.0.1 over a real store (both backends), the runner with its worker processes,
the OpenAI SDK in the agents; the hosted LLM is the scripted stand-in (``tests.scripted_upstream``), which calls
the offered tool once and then answers ``Answer: <the tool's result>``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI

from lightning_store import semconv
from lightning_store.resources import LLM, PromptTemplate
from lightning_store.sql import SqlStore, open_store
from lightning_store.transcript import reward_of
from runners.agent import AgentSignatureError
from runners.agentlightning import rollout
from tests.acceptance.test_llm_fallback import error_of, run_agent
from tests.conftest import serve_app, serving
from tests.scripted_upstream import create_app

ROOM_TASKS = [
    {"task_input": {"date": "2025-10-13", "time": "10:00", "attendees": 3}, "expected_choice": "Orion"},
    {"task_input": {"date": "2025-10-13", "time": "11:00", "attendees": 8}, "expected_choice": "Nova"},
]


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FastAPI, str]]:
    app = create_app({"date": "2025-10-13", "time": "10:00"})
    async with serve_app(app) as url:
        yield app, url


@pytest.fixture
async def store(database_url: str, upstream: tuple[FastAPI, str]) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    template = "Find a room on {date} at {time} for {attendees} attendees."
    await opened.update_resources(
        "rs-agl",
        {
            "main_llm": LLM(endpoint=f"{upstream[1]}/v1", model="policy-model"),
            "main_prompt": PromptTemplate(template=template, engine="f-string"),
        },
    )
    try:
        yield opened
    finally:
        await opened.close()


async def rewards(store: SqlStore, rollout_id: str) -> list[float]:
    spans = await store.query_spans(rollout_id)
    return [r for s in spans if s.name == semconv.ANNOTATION and (r := reward_of(s)) is not None]


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_agent_lightning_agents_run_with_one_import_changed(
    store: SqlStore, upstream: tuple[FastAPI, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    app, _ = upstream
    async with serving(store) as server:
        rooms = await run_agent(store, server, "room_selector", ROOM_TASKS, module="tests.agl_agents")
        capitals = await run_agent(store, server, "capital_agent", [{"country": "France"}], module="tests.agl_agents")
        trained = await run_agent(
            store, server, "sql_agent", [{"question": "q"}], module="tests.agl_agents", mode="train"
        )
        validated = await run_agent(
            store, server, "sql_agent", [{"question": "q"}], module="tests.agl_agents", mode="val"
        )

    for done in (*rooms, *capitals, *trained, *validated):
        assert done.status == "succeeded", await error_of(store, done.rollout_id)
    # The prompt template reached the agent under its Agent Lightning name, and the tool round ran: the stand-in's
    # final answer holds the tool's result, where Orion is and Nova is not.
    assert [await rewards(store, r.rollout_id) for r in rooms] == [[1.0], [0.0]]
    asked = {m["content"] for body in app.state.requests for m in body["messages"] if m["role"] == "user"}
    assert {
        "Find a room on 2025-10-13 at 10:00 for 3 attendees.",
        "Find a room on 2025-10-13 at 11:00 for 8 attendees.",
    } <= asked
    assert await rewards(store, capitals[0].rollout_id) == [0.25]
    assert await rewards(store, trained[0].rollout_id) == [0.75]  # training_rollout, by the rollout's mode
    assert await rewards(store, validated[0].rollout_id) == [0.5]
    # Every call went through the store's proxy and was recorded on its attempt with its token ids.
    calls = {r.rollout_id: len(await store.query_llm_calls([r.rollout_id])) for r in (*rooms, *capitals, *trained)}
    assert list(calls.values()) == [2, 2, 1, 1]
    assert {body["model"] for body in app.state.requests} == {"policy-model"}


def test_a_rollout_function_of_another_shape_is_refused_at_once() -> None:
    def agent(task: Any, llm: Any, prompt_template: Any) -> None: ...

    with pytest.raises(AgentSignatureError, match=r"\(task, llm\[, rollout\]\) or \(task, prompt_template"):
        rollout(agent)
