"""Stopping ``store serve`` and ``store run`` with signals: how long it takes, and what their clients see.

``store serve`` stops on SIGTERM or SIGINT without waiting for the long-polls pending: they answer at once with
what they have (a dequeue ``[]``, a wait the rollouts already finished), and HttpStore's waits carry on across a
restart. ``store run`` stops within its grace period (plus the few seconds it tries to release its attempts) when
its server is gone, and at once on a second signal.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from lightning_store.client import HttpStore
from tests.acceptance.test_run_cli import Launch, launch, output, running_attempt  # noqa: F401
from tests.acceptance.test_serve import CLEAN_EXIT, Server, postgres_url, wait_healthy  # noqa: F401

STOP_SECONDS = 10.0
"""The bound on a stop: half the pending long-polls' own 20 s. What shows that they answered at once is their
answers (200 with what they had); had the server waited, its 1 s grace would have cancelled them with a 503. An
idle machine stops in about 0.5 s; a loaded one with two server processes took 4 s (CI, 2026-12-04)."""


async def stop_timed(server: Server, signum: int = signal.SIGTERM) -> tuple[int, float]:
    """Send ``signum``; the exit status and the seconds until the process had exited."""
    started = time.monotonic()
    server.process.send_signal(signum)
    code = await asyncio.to_thread(server.process.wait, 20)
    elapsed = time.monotonic() - started
    server.stop()  # closes its output
    return code, elapsed


async def post(url: str, path: str, body: dict[str, Any]) -> Any:
    """One request on a connection of its own: the JSON answer, or the transport error it ended with."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        try:
            response = await http.post(path, json=body)
        except httpx.TransportError as error:
            return error
        assert response.status_code == 200, response.text
        return response.json()


async def pending_long_polls(client: HttpStore, url: str) -> tuple[str, list[asyncio.Task[Any]]]:
    """A finished rollout, and long-polls that would wait for 20 s or more: two waits (one with no timeout, so
    25 s on the server, one that includes the finished rollout) and two blocking dequeues on an empty queue."""
    finished = await client.enqueue_rollout({"q": "finished"})
    claimed = await client.dequeue_rollout(worker_id="w1")
    assert claimed is not None
    await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    running = await client.start_rollout({"q": "running"})  # never finishes; the queue stays empty
    waits: list[dict[str, Any]] = [
        {"rollout_ids": [running.rollout_id], "timeout": None},
        {"rollout_ids": [finished.rollout_id, running.rollout_id], "timeout": 20},
    ]
    polls = [asyncio.create_task(post(url, "/v1/agl/waits/rollouts", body)) for body in waits]
    polls += [asyncio.create_task(post(url, "/v1/agl/queues/rollouts/dequeue", {"timeout": 20})) for _ in range(2)]
    await asyncio.sleep(0.5)  # they have reached the server and wait
    assert not any(poll.done() for poll in polls)
    return finished.rollout_id, polls


async def assert_answered(finished: str, polls: list[asyncio.Task[Any]]) -> None:
    """Each long-poll got what it had (or, on a connection the server closed first, a transport error)."""
    answers = await asyncio.wait_for(asyncio.gather(*polls), 5)
    expected: list[list[str]] = [[], [finished], [], []]
    for answer, ids in zip(answers, expected, strict=True):
        if not isinstance(answer, httpx.TransportError):
            assert [rollout["rollout_id"] for rollout in answer] == ids


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], HttpStore]]:
    """``HttpStore`` clients closed at the end whatever happened: one left open is garbage-collected in a later
    test, which then fails on aiohttp's "Unclosed client session" (seen in CI, 2026-12-04)."""
    opened: list[HttpStore] = []

    def open_client(url: str) -> HttpStore:
        opened.append(HttpStore(url))
        return opened[-1]

    yield open_client
    for client in opened:
        await client.close()


@pytest.fixture
async def sqlite_server(tmp_path: Path) -> AsyncIterator[Server]:
    server = Server(cwd=tmp_path)
    await wait_healthy(server.url, server.process)
    yield server
    server.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_serve_stops_at_once_with_long_polls_pending(
    sqlite_server: Server, signum: int, clients: Callable[[str], HttpStore]
) -> None:
    client = clients(sqlite_server.url)
    finished, polls = await pending_long_polls(client, sqlite_server.url)

    code, elapsed = await stop_timed(sqlite_server, signum)

    assert code in (*CLEAN_EXIT, -signum)
    assert elapsed < STOP_SECONDS
    await assert_answered(finished, polls)


@pytest.mark.postgres
@pytest.mark.parametrize("workers", [1, 2])
async def test_serve_on_postgres_stops_at_once_with_long_polls_pending(
    postgres_url: str,  # noqa: F811
    tmp_path: Path,
    workers: int,
    clients: Callable[[str], HttpStore],
) -> None:
    server = Server("--database-url", postgres_url, "--workers", str(workers), cwd=tmp_path)
    try:
        await wait_healthy(server.url, server.process, seconds=60)
        client = clients(server.url)
        finished, polls = await pending_long_polls(client, server.url)

        code, elapsed = await stop_timed(server)

        assert code in CLEAN_EXIT
        assert elapsed < STOP_SECONDS
        await assert_answered(finished, polls)
    finally:
        server.stop()


async def test_serve_answers_503_to_a_request_that_outlives_its_grace_period(tmp_path: Path) -> None:
    """An LLM call whose upstream never answers holds its request; 1 s after SIGTERM the server cancels it and
    answers 503 (which clients retry), and still stops within 2 s."""

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the proxy gives up on us
        writer.close()

    upstream = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    upstream_url = f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}/v1"
    server = Server("--llm-upstream", upstream_url, cwd=tmp_path)
    try:
        await wait_healthy(server.url, server.process)
        client = HttpStore(server.url)
        started = await client.start_rollout({"q": 1})
        await client.close()
        path = f"/rollout/{started.rollout_id}/attempt/{started.attempt.attempt_id}/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            call = asyncio.create_task(http.post(path, json=body))
            await asyncio.sleep(0.5)

            code, elapsed = await stop_timed(server)

            assert code in CLEAN_EXIT and elapsed < STOP_SECONDS
            answer = await call
            assert answer.status_code == 503 and answer.json()["error_type"] == "Unavailable"
    finally:
        server.stop()
        upstream.close()
        await upstream.wait_closed()


async def test_waits_of_the_client_outlive_a_server_restart(
    sqlite_server: Server, tmp_path: Path, clients: Callable[[str], HttpStore]
) -> None:
    """The long-polls answer early as the server stops; HttpStore asks again, retries the refused connections
    and finds the restarted server: its wait (no timeout) and blocking dequeue end as if nothing happened."""
    client = clients(sqlite_server.url)
    rollout = await client.start_rollout({"q": 1})
    waiting = asyncio.create_task(client.wait_for_rollouts(rollout_ids=[rollout.rollout_id]))
    dequeuing = asyncio.create_task(client.dequeue_rollout(worker_id="w2", timeout=30))
    await asyncio.sleep(0.5)

    code, elapsed = await stop_timed(sqlite_server)
    assert code in CLEAN_EXIT and elapsed < STOP_SECONDS
    restarted = Server(cwd=tmp_path, port=sqlite_server.port)
    try:
        await wait_healthy(restarted.url, restarted.process)
        other = clients(restarted.url)
        await other.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
        queued = await other.enqueue_rollout({"q": 2})
        [done] = await asyncio.wait_for(waiting, 15)
        assert done.status == "succeeded"
        claimed = await asyncio.wait_for(dequeuing, 15)
        assert claimed is not None and claimed.rollout_id == queued.rollout_id
    finally:
        for task in (waiting, dequeuing):
            task.cancel()
        restarted.stop()


async def test_a_long_poll_whose_client_left_stops_waiting(sqlite_server: Server) -> None:
    """A long-poll stops when its client disconnects (it used to poll the database until its timeout, and a
    dequeue could then claim a rollout for nobody); the request's latency in /metrics shows when it ended."""
    async with httpx.AsyncClient(base_url=sqlite_server.url, timeout=30) as http:
        requests = [
            ("/v1/agl/waits/rollouts", {"rollout_ids": ["unknown"], "timeout": 20}),
            ("/v1/agl/queues/rollouts/dequeue", {"timeout": 20}),
        ]
        # A streamed (chunked) long-poll whose client stays waits its whole timeout: the body the guards read ahead
        # is replayed, and then the connection's own receive, not a made-up disconnect.
        started = time.monotonic()
        waiting = json.dumps({"rollout_ids": ["unknown"], "timeout": 1}).encode()
        kept = await http.post(
            "/v1/agl/waits/rollouts", content=one_chunk(waiting), headers={"content-type": "application/json"}
        )
        assert kept.status_code == 200 and time.monotonic() - started >= 0.9
        ended = {"/v1/agl/waits/rollouts": 1, "/v1/agl/queues/rollouts/dequeue": 0}  # requests each route answered
        # Each twice: with a Content-Length, then streamed (chunked), which the guards read ahead and replay.
        for streamed in (False, True):
            for path, body in requests:
                content = json.dumps(body).encode()
                sent: Any = one_chunk(content) if streamed else content
                headers = {"content-type": "application/json"}
                abandoned = asyncio.create_task(http.post(path, content=sent, headers=headers))
                await asyncio.sleep(0.5)
                abandoned.cancel()  # closes its connection
                route = rf'method="POST",route="{re.escape(path)}"'
                for _ in range(50):
                    metrics = (await http.get("/metrics")).text
                    count = re.search(rf"lightning_store_http_request_seconds_count\{{{route}\}} (\S+)", metrics)
                    if count is not None and float(count.group(1)) == ended[path] + 1:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"{path} (streamed: {streamed}) still waiting 5 s after its client left")
                total = re.search(rf"lightning_store_http_request_seconds_sum\{{{route}\}} (\S+)", metrics)
                ended[path] += 1
                assert total is not None and float(total.group(1)) < 1.5 * ended[path]


async def one_chunk(content: bytes) -> AsyncIterator[bytes]:
    yield content


# store run ---------------------------------------------------------------------------------------------------

GRACE = 2.0
RELEASE_SECONDS = 2.0  # runners.attempts.RELEASE_SECONDS: how long releases are tried as the runner stops
STOP_SLACK = 5.0
"""Room for a process to exit on a loaded machine (about 0.5 s idle), after the bounds the runner states."""


async def test_the_runner_stops_within_its_grace_period_when_its_server_is_gone(
    sqlite_server: Server,
    launch: Launch,  # noqa: F811
    clients: Callable[[str], HttpStore],
) -> None:
    client = clients(sqlite_server.url)
    rollout = await client.enqueue_rollout({"x": 1, "sleep": 60})
    runner = launch(sqlite_server.url, "tests.agents:async_agent", "--grace", str(GRACE))
    await running_attempt(client, rollout.rollout_id)
    sqlite_server.process.kill()
    sqlite_server.stop()

    started = time.monotonic()
    runner.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(runner.wait, 60)
    elapsed = time.monotonic() - started

    assert code == 0, output(runner)
    # Its bound, with room for a loaded machine's process exit; unbounded, it would wait for the agent (60 s) or
    # for HttpStore's retries of the refused connection (15 s).
    assert elapsed < GRACE + RELEASE_SECONDS + STOP_SLACK, output(runner)


async def test_a_second_signal_stops_the_runner_at_once(
    sqlite_server: Server,
    launch: Launch,  # noqa: F811
    clients: Callable[[str], HttpStore],
) -> None:
    client = clients(sqlite_server.url)
    rollout = await client.enqueue_rollout({"x": 1, "sleep": 60})
    runner = launch(sqlite_server.url, "tests.agents:async_agent", "--grace", "30")
    attempt = await running_attempt(client, rollout.rollout_id)

    started = time.monotonic()
    runner.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    runner.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(runner.wait, 30)
    elapsed = time.monotonic() - started

    assert code == 1, output(runner)  # stopped, not finished: the worker was killed
    assert elapsed < 0.3 + STOP_SLACK, output(runner)  # not the 30 s grace
    [ended] = await client.query_attempts(rollout.rollout_id)
    assert ended.attempt_id == attempt.attempt_id and ended.status == "failed"
    assert ended.metadata == {"released": "runner stopped"}
    back = await client.get_rollout_by_id(rollout.rollout_id)
    assert back is not None and back.status == "requeuing"
