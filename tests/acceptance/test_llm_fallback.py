"""The README's agent on a fresh store (no ``llm`` resource): through ``store serve --llm-upstream`` its calls go
to the fallback upstream and are recorded with token ids; with no upstream at all, or no server, its attempt
fails with a message that says what to register or configure (never an AttributeError on None).

Real parts: ``store serve`` (a subprocess, or the app in process), the runner with worker processes, the OpenAI
SDK in the agent; the hosted LLM is the scripted stand-in (``tests.scripted_upstream``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response

from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.models import Rollout, RolloutMode
from lightning_store.semconv import EXCEPTION
from lightning_store.sql import SqlStore, open_store
from runners import Runner
from runners.agent import RolloutAgent
from runners.worker import Worker
from tests.acceptance.test_serve import Server, wait_healthy
from tests.conftest import serve_app, serving
from tests.llm_agents import optional_llm_agent, unfillable_agent
from tests.scripted_upstream import ANSWER_IDS, create_app

TOKEN = "store-token"
SET_LLM = "store resources set-llm URL --model M"


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FastAPI, str]]:
    """The scripted stand-in, also keeping the Authorization header of every call (``app.state.keys``)."""
    app = create_app()
    app.state.keys = []

    @app.middleware("http")
    async def keep_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        app.state.keys.append(request.headers.get("authorization"))
        return await call_next(request)

    async with serve_app(app) as url:
        yield app, url


async def run_agent(
    store: LightningStore,
    store_url: str,
    agent: str,
    tasks: list[Any],
    *,
    module: str = "tests.llm_agents",
    mode: RolloutMode | None = None,
    **options: Any,
) -> list[Rollout]:
    """Enqueue ``tasks`` (in ``mode``), run ``{module}:{agent}`` on them with a runner until all have finished."""
    ids = [(await store.enqueue_rollout(task, mode=mode)).rollout_id for task in tasks]
    runner = Runner(f"{module}:{agent}", store_url, heartbeat_interval=0.5, poll_timeout=1, progress=False, **options)
    running = asyncio.create_task(runner.run())
    try:
        finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=120)
    finally:
        runner.stop()
        summary = await asyncio.wait_for(running, 60)
    assert len(finished) == len(ids) and summary.worker_restarts == 0  # a failed attempt never ends its worker
    return sorted(finished, key=lambda r: ids.index(r.rollout_id))


async def run_in_process(store: SqlStore, agent: RolloutAgent, tasks: list[Any]) -> list[Rollout]:
    """Enqueue ``tasks`` and run ``agent`` on them with a worker in this process, on the store (no server)."""
    ids = [(await store.enqueue_rollout(task)).rollout_id for task in tasks]
    worker = Worker(store, agent, worker_id="in-process", heartbeat_interval=0.5, poll_timeout=0.2)
    await asyncio.wait_for(worker.run(asyncio.Event(), idle_exit=0.3), 60)
    finished = await store.wait_for_rollouts(rollout_ids=ids, timeout=10)
    assert len(finished) == len(ids)
    return sorted(finished, key=lambda r: ids.index(r.rollout_id))


async def error_of(store: LightningStore, rollout_id: str) -> str:
    """The stored error message of the rollout's failed attempt (its exception span's status)."""
    [span] = [s for s in await store.query_spans(rollout_id) if s.name == EXCEPTION]
    assert span.status.status_code == "ERROR"
    return span.status.description or ""


async def test_the_readme_agent_calls_store_serve_llm_upstream_and_is_recorded(
    upstream: tuple[FastAPI, str], tmp_path: Path
) -> None:
    app, url = upstream
    server = Server(
        "--llm-upstream",
        f"{url}/v1",
        "--llm-model",
        "fallback-model",
        "--llm-api-key",
        "sk-upstream",
        "--token",
        TOKEN,
        cwd=tmp_path,
    )
    try:
        await wait_healthy(server.url, server.process)
        store = HttpStore(server.url, token=TOKEN)
        try:
            [done] = await run_agent(store, server.url, "readme_agent", [{"q": "Where is my flight?"}], token=TOKEN)
            assert done.status == "succeeded", await error_of(store, done.rollout_id)
            [call] = await store.query_llm_calls([done.rollout_id])
        finally:
            await store.close()
    finally:
        server.stop()
    assert call.response_token_ids == ANSWER_IDS and len(call.prompt_token_ids) > 0
    assert call.response_logprobs == [-0.5] * len(ANSWER_IDS)
    # The agent named the model it was given (none): the proxy named the configured one, with the configured key.
    assert call.request is not None and call.request["model"] == "" and call.model == "fallback-model"
    assert [body["model"] for body in app.state.requests] == ["fallback-model"]
    assert app.state.keys == ["Bearer sk-upstream"]


async def test_with_no_llm_anywhere_the_attempt_fails_saying_what_to_configure(database_url: str) -> None:
    store = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    try:
        async with serving(store) as url:  # no --llm-upstream
            [failed] = await run_agent(store, url, "readme_agent", [{"q": "hello"}])
        assert failed.status == "failed"
        error = await error_of(store, failed.rollout_id)
        # The proxy's 422, which the OpenAI SDK raised at once (it does not retry a 422), with the proxy's message.
        assert error.startswith("UnprocessableEntityError: Error code: 422 - ") and "AttributeError" not in error
        assert f"rollout {failed.rollout_id} has no llm resource and this server has no --llm-upstream" in error
        assert SET_LLM in error and "store serve --llm-upstream URL --llm-model M" in error
    finally:
        await store.close()


async def test_without_a_server_an_agent_requiring_llm_fails_before_it_is_called(database_url: str) -> None:
    store: SqlStore = await open_store(database_url, migrate=True, watchdog_interval=0.5)
    try:
        [failed] = await run_agent(store, database_url, "readme_agent", [{"q": "hello"}])
        assert failed.status == "failed"
        error = await error_of(store, failed.rollout_id)
        assert error.startswith("MissingLLMError: ") and "AttributeError" not in error
        assert f"rollout {failed.rollout_id} has no llm resource and the runner has no LLM proxy" in error
        assert SET_LLM in error and "--llm-upstream" in error
        # An agent whose llm has a default still runs, and gets None (a worker in this process: a runner's
        # worker without the process around it, as quick as the test needs).
        [done] = await run_in_process(store, optional_llm_agent, [{"q": "hello"}])
        assert done.status == "succeeded"
        rewards = [s for s in await store.query_spans(done.rollout_id) if s.name == "agentlightning.annotation"]
        assert [s.attributes["agentlightning.reward.0.value"] for s in rewards] == [0.0]
        # Any parameter that cannot be filled fails the attempt the same way; the worker goes on to the next.
        unfillable = await run_in_process(store, unfillable_agent, [{"q": 1}, {"q": 2}])
        assert [r.status for r in unfillable] == ["failed", "failed"]
        error = await error_of(store, unfillable[1].rollout_id)
        assert error.startswith("AgentSignatureError: ") and "nothing_is_named_this" in error
    finally:
        await store.close()
