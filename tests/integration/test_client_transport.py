"""``HttpStore``'s transport rules against a real TCP server on 127.0.0.1 that misbehaves on purpose: it drops
connections after reading a request, answers 503, or is not listening yet. (The store's own server never does
these things on cue; the conformance suite covers ``HttpStore`` against it.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from algorithms.local_stack import free_port
from lightning_store.client import HttpStore
from lightning_store.errors import NotFoundError

Answer = Callable[[int], tuple[int, dict[str, Any]] | None]
"""The n-th request's (status, JSON body), or None to close the connection without answering."""

STATISTICS = {"rollouts": 0, "attempts": 0, "spans": 0}
RESOURCES = {"resources_id": "rs-1", "create_time": 1.0, "update_time": 1.0, "version": 1, "resources": {}}


class Server:
    """Reads one HTTP/1.1 request per connection and answers as ``answer`` says; counts the requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests.append(head.split(b" ")[1].decode())
                answered = self.answer(len(self.requests))
                if answered is None:
                    return
                status, body = answered
                payload = json.dumps(body).encode()
                answer_head = (
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
                )
                writer.write(answer_head.encode() + b"\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(answer: Answer, port: int, *, after: float = 0.0) -> AsyncIterator[Server]:
    """``Server`` on ``port``, listening only ``after`` seconds from now."""
    server = Server(answer)
    listening: list[asyncio.Server] = []

    async def start() -> None:
        await asyncio.sleep(after)
        listening.append(await asyncio.start_server(server.handle, "127.0.0.1", port))

    starting = asyncio.create_task(start())
    try:
        yield server
    finally:
        starting.cancel()
        for one in listening:
            one.close()


@pytest.fixture
async def client() -> AsyncIterator[tuple[HttpStore, int]]:
    port = free_port()
    store = HttpStore(f"http://127.0.0.1:{port}")
    yield store, port
    await store.close()


async def test_an_idempotent_request_whose_answer_was_lost_is_sent_again(client: tuple[HttpStore, int]) -> None:
    store, port = client
    async with serving(lambda n: None if n == 1 else (200, STATISTICS), port) as server:
        await asyncio.sleep(0.05)
        assert await store.statistics() == STATISTICS
    assert server.requests == ["/v1/agl/statistics"] * 2


async def test_a_request_that_is_not_idempotent_is_not_sent_twice(client: tuple[HttpStore, int]) -> None:
    store, port = client
    async with serving(lambda n: None if n == 1 else (200, RESOURCES), port) as server:
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.RemoteProtocolError):  # closed before answering: the request may have landed
            await store.add_resources({})
    assert server.requests == ["/v1/agl/resources"]


async def test_a_server_not_listening_yet_is_waited_for(client: tuple[HttpStore, int]) -> None:
    """Nothing was sent while the connection was refused, so even a request that is not idempotent goes out
    once the server listens, exactly once."""
    store, port = client
    async with serving(lambda n: (200, RESOURCES), port, after=0.3) as server:
        assert (await store.add_resources({})).resources_id == "rs-1"
    assert server.requests == ["/v1/agl/resources"]


@pytest.mark.parametrize(
    ("maybe_written", "sent"),
    [(False, ["/v1/agl/resources"] * 2), (True, ["/v1/agl/resources"])],
)
async def test_a_503_that_may_have_written_is_not_sent_again_unless_idempotent(
    client: tuple[HttpStore, int], maybe_written: bool, sent: list[str]
) -> None:
    """A 503 whose write may have been done (the database went away during its commit) is raised for a request
    that is not idempotent, and retried for one that is; one that says nothing was written is retried either way."""
    store, port = client
    unavailable = {"detail": "database unavailable, retry", "error_type": "Unavailable", "maybe_written": maybe_written}
    refused_at = (1, len(sent) + 1)  # the first request, and the read's first sending
    async with serving(lambda n: (503, unavailable) if n in refused_at else (200, RESOURCES), port) as server:
        await asyncio.sleep(0.05)
        if maybe_written:
            with pytest.raises(httpx.HTTPStatusError) as refused:
                await store.add_resources({})
            assert refused.value.response.status_code == 503
        else:
            assert (await store.add_resources({})).resources_id == "rs-1"
        assert server.requests == sent
        await store.get_resources_by_id("rs-1")  # idempotent: sent again after the 503 whatever it says
    assert server.requests == [*sent, "/v1/agl/resources/rs-1", "/v1/agl/resources/rs-1"]


async def test_503_is_retried_and_other_answers_keep_their_meaning(client: tuple[HttpStore, int]) -> None:
    store, port = client
    answers = {1: (503, {"detail": "busy"}), 2: (404, {"detail": "no such rollout", "field": "rollout_id"})}
    async with serving(lambda n: answers.get(n, (500, {"detail": "broken"})), port) as server:
        await asyncio.sleep(0.05)
        with pytest.raises(NotFoundError) as missing:
            await store.get_next_span_sequence_id("ro-1", "at-1")
        assert missing.value.field == "rollout_id"
        with pytest.raises(httpx.HTTPStatusError):
            await store.statistics()
    assert len(server.requests) == 3


async def test_health_is_false_when_nothing_listens(client: tuple[HttpStore, int]) -> None:
    store, _ = client
    assert await store.health() is False
