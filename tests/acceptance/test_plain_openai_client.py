"""An agent whose OpenAI client is not given ``llm.endpoint`` (``OpenAI()`` at import, ``AsyncOpenAI()`` in the
rollout) is recorded like any other: the runner points the SDK's defaults at the server's route for the worker
(``/worker/{worker_id}/v1``), which serves the attempt that worker runs (``runners.openai_defaults``).

Real parts: the server app on 127.0.0.1 over a real store (both backends), the runner with worker processes, the
OpenAI SDK in the agent; the hosted LLM is the scripted stand-in (``tests.scripted_upstream``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from lightning_store.resources import LLM
from lightning_store.sql import SqlStore, open_store
from runners.openai_defaults import PLACEHOLDER_KEY, point_openai_defaults, worker_base_url
from tests.acceptance.test_llm_fallback import run_agent
from tests.conftest import serve_app, serving
from tests.scripted_upstream import ANSWER_IDS, create_app


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FastAPI, str]]:
    app = create_app()
    async with serve_app(app) as url:
        yield app, url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    try:
        yield opened
    finally:
        await opened.close()


async def run(store: SqlStore, url: str, agent: str, tasks: list[Any], **options: Any) -> list[str]:
    """Run ``tests.plain_openai_agents:{agent}`` on ``tasks`` until all have succeeded; their rollout ids."""
    finished = await run_agent(store, url, agent, tasks, module="tests.plain_openai_agents", **options)
    assert [r.status for r in finished] == ["succeeded"] * len(tasks)
    return [r.rollout_id for r in finished]


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_plain_clients_are_recorded_on_the_attempt_they_ran_in(
    store: SqlStore, upstream: tuple[FastAPI, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # OpenAI() at import would refuse to start without one
    app, url = upstream
    await store.update_resources("rs-plain", {"main_llm": LLM(endpoint=f"{url}/v1", model="policy-model")})
    async with serving(store) as server:
        module_ids = await run(store, server, "module_client_agent", [{"q": "a"}, {"q": "b"}, {"q": "c"}], workers=2)
        fresh_ids = await run(store, server, "fresh_client_agent", [{"q": "d"}, {"q": "e"}])
    for rollout_id, calls in [(r, 1) for r in module_ids] + [(r, 2) for r in fresh_ids]:
        recorded = await store.query_llm_calls([rollout_id])
        assert len(recorded) == calls  # each call on the attempt it was made in, none on another
        [attempt] = await store.query_attempts(rollout_id)
        for call in recorded:
            assert call.attempt_id == attempt.attempt_id and call.response_token_ids == ANSWER_IDS
            assert call.request is not None and call.request["model"] in ("gpt-4o-mini", "gpt-4.1")
            assert call.model == "policy-model" and call.llm_resource == "main_llm"
    # The upstream was asked for the resource's model, not the hosted one the agent named.
    assert {body["model"] for body in app.state.requests} == {"policy-model"}
    assert len(app.state.requests) == 3 + 2 * 2


async def test_the_worker_route_names_what_is_wrong(store: SqlStore) -> None:
    async with serving(store) as server, httpx.AsyncClient(base_url=server, timeout=30) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        unknown = await http.post("/worker/nobody/v1/chat/completions", json=body)
        assert unknown.status_code == 404 and unknown.json()["field"] == "worker_id"
        await store.update_worker("idle-worker", heartbeat_stats={"n": 1})
        idle = await http.post("/worker/idle-worker/v1/chat/completions", json=body)
        assert idle.status_code == 409 and idle.headers["x-should-retry"] == "false"
        assert idle.json()["error"]["message"].startswith("worker idle-worker is running no attempt")


def test_defaults_are_set_only_where_one_attempt_runs_at_a_time() -> None:
    env: dict[str, str] = {}
    url = point_openai_defaults(server_url="http://h:1", worker_id="w/1", token=None, concurrency=1, environ=env)
    assert url == worker_base_url("http://h:1", "w/1") == "http://h:1/worker/w%2F1/v1"
    assert env == {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": PLACEHOLDER_KEY}
    for token, key in ((None, "sk-mine"), ("tok", "tok")):  # no token: the user's key stays (the proxy ignores it)
        env = {"OPENAI_API_KEY": "sk-mine"}
        point_openai_defaults(server_url="http://h:1", worker_id="w", token=token, concurrency=1, environ=env)
        assert env["OPENAI_API_KEY"] == key
    for options in (
        {"server_url": None, "concurrency": 1},  # no server: no proxy to point at
        {"server_url": "http://h:1", "concurrency": 2},  # which attempt a call is from cannot be told
        {"server_url": "http://h:1", "concurrency": 1, "enabled": False},
    ):
        env = {}
        assert point_openai_defaults(worker_id="w", token=None, environ=env, **options) is None and env == {}
    env = {"OPENAI_BASE_URL": "http://mine/v1"}
    assert point_openai_defaults(server_url="http://h:1", worker_id="w", token=None, concurrency=1, environ=env) is None
    assert env == {"OPENAI_BASE_URL": "http://mine/v1"}
