"""``store run`` as users run it: a runner subprocess against a ``store serve`` subprocess, stopped by signals,
killed with SIGKILL, and outliving a restart of the server."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from lightning_store.client import HttpStore
from lightning_store.models import Attempt
from lightning_store.resources import LLM
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import CLEAN_EXIT, Server, clean_env, wait_healthy

REPO = Path(__file__).resolve().parents[2]
Launch = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(cwd=tmp_path)
    yield server
    server.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[HttpStore]:
    assert server.process.stdout is not None
    await wait_healthy(server.url, server.process)
    store = HttpStore(server.url)
    yield store
    await store.close()


def start_runner(url: str, agent: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*store_command(), "run", agent, "--store", url, "--heartbeat", "0.5", "--no-progress", *options],
        cwd=REPO,  # the agent is tests.agents:…, importable from the repository root
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def running_attempt(store: HttpStore, rollout_id: str, seconds: float = 60) -> Attempt:
    for _ in range(int(seconds * 10)):
        attempt = await store.get_latest_attempt(rollout_id)
        if attempt is not None and attempt.status == "running":
            return attempt
        await asyncio.sleep(0.1)
    raise AssertionError(f"{rollout_id} never started running")


def output(process: subprocess.Popen[str]) -> str:
    if process.stdout is None or process.stdout.closed:
        return ""
    text = process.stdout.read()
    process.stdout.close()
    return text


@pytest.fixture
def launch() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts runners (``launch(url, agent, *options)``); kills and closes what a failed test left behind."""
    started: list[subprocess.Popen[str]] = []

    def start(url: str, agent: str, *options: str) -> subprocess.Popen[str]:
        started.append(start_runner(url, agent, *options))
        return started[-1]

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        output(process)


async def test_sigterm_releases_the_attempt_in_flight_and_exits_cleanly(
    client: HttpStore, server: Server, launch: Launch
) -> None:
    rollout = await client.enqueue_rollout({"x": 1, "sleep": 60})
    runner = launch(server.url, "tests.agents:async_agent", "--grace", "1")
    await running_attempt(client, rollout.rollout_id)

    runner.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(runner.wait, 30)

    assert code == 0, output(runner)
    [attempt] = await client.query_attempts(rollout.rollout_id)
    assert attempt.status == "failed" and attempt.metadata == {"released": "worker stopped"}
    back = await client.get_rollout_by_id(rollout.rollout_id)
    assert back is not None and back.status == "requeuing"  # the next runner takes it
    assert json.loads(output(runner).strip().splitlines()[-1])["summary"] == {}


async def test_sigkill_of_the_runner_loses_nothing(client: HttpStore, server: Server, launch: Launch) -> None:
    first = await client.enqueue_rollout({"x": 1, "sleep": 3})
    second = await client.enqueue_rollout({"x": 2, "sleep": 0})
    runner = launch(server.url, "tests.agents:async_agent")
    await running_attempt(client, first.rollout_id)

    runner.kill()  # the orphaned worker finishes its attempt, takes no other, and exits
    runner.wait()
    [done] = await client.wait_for_rollouts(rollout_ids=[first.rollout_id], timeout=30)
    assert done.status == "succeeded"
    assert (await client.get_rollout_by_id(second.rollout_id)).status == "queuing"  # type: ignore[union-attr]

    successor = launch(server.url, "tests.agents:async_agent", "--idle-exit", "2")
    assert await asyncio.to_thread(successor.wait, 60) == 0, output(successor)
    for rollout in (first, second):
        assert [a.status for a in await client.query_attempts(rollout.rollout_id)] == ["succeeded"]


async def test_idle_exit_counts_only_the_time_nothing_runs(client: HttpStore, server: Server, launch: Launch) -> None:
    """Attempts longer than ``--idle-exit`` (one worker, one at a time): the runner exits only once the queue is
    empty and nothing runs (it used to exit after the first, leaving the others queued)."""
    rollouts = [await client.enqueue_rollout({"x": x, "sleep": 2.5}) for x in (1, 2, 3)]
    runner = launch(server.url, "tests.agents:async_agent", "--idle-exit", "1")
    assert await asyncio.to_thread(runner.wait, 60) == 0, output(runner)
    for rollout in rollouts:
        assert [a.status for a in await client.query_attempts(rollout.rollout_id)] == ["succeeded"]


async def test_the_runner_outlives_a_server_restart(
    client: HttpStore, server: Server, tmp_path: Path, launch: Launch
) -> None:
    rollout = await client.enqueue_rollout({"x": 1, "sleep": 4})
    runner = launch(server.url, "tests.agents:async_agent", "--idle-exit", "3")
    await running_attempt(client, rollout.rollout_id)

    assert server.stop() in CLEAN_EXIT
    await asyncio.sleep(1)
    restarted = Server(cwd=tmp_path, port=server.port)
    try:
        await wait_healthy(restarted.url, restarted.process)
        assert await asyncio.to_thread(runner.wait, 60) == 0, output(runner)
        [attempt] = await client.query_attempts(rollout.rollout_id)
        assert attempt.status == "succeeded"
        rewards = [s for s in await client.query_spans(rollout.rollout_id) if s.name == "agentlightning.annotation"]
        assert len(rewards) == 1
    finally:
        restarted.stop()


async def test_each_attempt_is_logged_with_its_reward_and_no_request_lines(
    client: HttpStore, server: Server, launch: Launch
) -> None:
    for x in (1.0, 0.0, 0.5):
        await client.enqueue_rollout({"x": x})
    runner = launch(server.url, "tests.agents:async_agent", "--idle-exit", "2")
    assert await asyncio.to_thread(runner.wait, 60) == 0
    text = output(runner)
    finished = [json.loads(line) for line in text.splitlines() if line.startswith('{"event": "attempt_finished"')]
    assert sorted(record["reward"] for record in finished) == [0.0, 0.5, 1.0], text
    assert finished[-1]["reward_mean"] == 0.5 and finished[-1]["done"] == 3
    assert "HTTP Request" not in text  # httpx's line per request: only at --log-level debug


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_the_agents_http_requests_are_logged_only_at_debug(
    client: HttpStore, server: Server, launch: Launch, level: str
) -> None:
    """The OpenAI SDK's client (httpx2) logs a line per request at INFO: in a training run, most of the log. Here
    its calls go through the store's proxy to an LLM that is not there (answered 502): the attempt fails after
    one request, which only ``--log-level debug`` shows."""
    await client.add_resources({"main_llm": LLM(endpoint="http://127.0.0.1:9/v1", model="absent")})
    await client.enqueue_rollout({"question": "My flight was cancelled.", "steps": 1, "max_tokens": 4})
    runner = launch(server.url, "examples.flight.agent:flight_agent", "--idle-exit", "2", "--log-level", level)
    assert await asyncio.to_thread(runner.wait, 60) == 0
    text = output(runner)
    assert '"status": "failed"' in text and "agent failed" in text, text[-3000:]
    assert ("HTTP Request: POST" in text) is (level == "debug"), text[-3000:]
