"""The LLM proxy in front of a real OpenAI-compatible policy server (transformers, a tiny model built offline)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from algorithms.serving.policy_server import PolicyServer
from algorithms.serving.tiny_model import build_tiny_model
from lightning_store import LLM, LlmCall
from lightning_store.models import AttemptedRollout
from lightning_store.sql import SqlStore
from tests.conftest import serve_app, serving

MESSAGES = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "My flight was cancelled."}]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> PolicyServer:
    return PolicyServer(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"), model_name="tiny")


@pytest.fixture
async def upstream(policy: PolicyServer) -> AsyncIterator[str]:
    async with serve_app(policy.app()) as url:
        yield url


@pytest.fixture
async def proxy(sql_store: SqlStore) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(sql_store) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        yield client


@pytest.fixture
async def rollout(sql_store: SqlStore, upstream: str) -> AttemptedRollout:
    resources = await sql_store.add_resources({"policy": LLM(endpoint=f"{upstream}/v1", model="tiny")})
    return await sql_store.start_rollout({"task": "flight"}, resources_id=resources.resources_id)


def bound(rollout: AttemptedRollout, kind: str = "chat/completions") -> str:
    return f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/{kind}"


async def recorded(store: SqlStore, rollout_id: str, count: int = 1) -> list[LlmCall]:
    """The proxy records after answering: wait (bounded) for the background write."""
    for _ in range(200):
        calls = await store.query_llm_calls([rollout_id])
        if len(calls) >= count:
            return calls
        await asyncio.sleep(0.025)
    raise AssertionError(f"expected {count} recorded calls")


async def test_chat_call_is_answered_and_recorded_token_exact(
    proxy: httpx.AsyncClient, sql_store: SqlStore, rollout: AttemptedRollout, policy: PolicyServer
) -> None:
    response = await proxy.post(bound(rollout), json={"messages": MESSAGES, "max_tokens": 6, "temperature": 0})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["choices"][0]["message"]["role"] == "assistant"
    [call] = await recorded(sql_store, rollout.rollout_id)
    expected_prompt = list(
        policy.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    assert call.prompt_token_ids == expected_prompt == answer["prompt_token_ids"]
    assert call.response_token_ids == answer["choices"][0]["token_ids"] and len(call.response_token_ids) > 0
    assert call.response_logprobs is not None and len(call.response_logprobs) == len(call.response_token_ids)
    assert call.model == "tiny" and call.sampling_parameters == {"max_tokens": 6, "temperature": 0}
    assert call.resources_id == rollout.resources_id and call.resources_version == 1
    assert call.latency_seconds is not None and call.latency_seconds >= 0
    [span] = await sql_store.query_spans(rollout.rollout_id)
    assert span.span_id == call.span_id and span.attributes["gen_ai.operation.name"] == "chat"
    assert span.attributes["gen_ai.usage.output_tokens"] == len(call.response_token_ids)
    attempt = await sql_store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "running"  # the span was a heartbeat


async def test_streaming_chat_still_captures_token_ids(
    proxy: httpx.AsyncClient, sql_store: SqlStore, rollout: AttemptedRollout
) -> None:
    chunks: list[dict[str, Any]] = []
    body = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "stream": True}
    async with proxy.stream("POST", bound(rollout), json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunks.append(json.loads(line[len("data:") :]))
    streamed_ids = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids", [])]
    text = "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])
    [call] = await recorded(sql_store, rollout.rollout_id)
    assert call.response_token_ids == streamed_ids and len(streamed_ids) > 0
    assert call.prompt_token_ids == chunks[0]["prompt_token_ids"]
    assert call.response is not None and call.response["choices"][0]["message"]["content"] == text


async def test_completions_and_header_binding(
    proxy: httpx.AsyncClient, sql_store: SqlStore, rollout: AttemptedRollout
) -> None:
    response = await proxy.post(
        "/v1/completions",
        json={"prompt": "The answer is", "max_tokens": 4, "temperature": 0},
        headers={"x-rollout-id": rollout.rollout_id, "x-attempt-id": rollout.attempt.attempt_id},
    )
    assert response.status_code == 200, response.text
    [call] = await recorded(sql_store, rollout.rollout_id)
    assert call.prompt_token_ids == response.json()["choices"][0]["prompt_token_ids"]
    assert call.response_token_ids == response.json()["choices"][0]["token_ids"]


async def test_upstream_error_goes_back_and_is_recorded_as_an_error_span(
    proxy: httpx.AsyncClient, sql_store: SqlStore, rollout: AttemptedRollout
) -> None:
    response = await proxy.post(bound(rollout), json={"messages": []})
    assert response.status_code == 400
    assert "messages" in response.json()["error"]["message"]
    for _ in range(200):
        spans = await sql_store.query_spans(rollout.rollout_id)
        if spans:
            break
        await asyncio.sleep(0.025)
    assert [s.status.status_code for s in spans] == ["ERROR"]
    assert await sql_store.query_llm_calls([rollout.rollout_id]) == []


async def test_unknown_ids_and_missing_upstream(proxy: httpx.AsyncClient, sql_store: SqlStore) -> None:
    response = await proxy.post("/rollout/ro-missing/attempt/at-x/v1/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 404 and response.json()["field"] == "rollout_id"
    orphan = await sql_store.start_rollout(1)  # no resources at all, no configured upstream
    response = await proxy.post(bound(orphan), json={"messages": MESSAGES})
    # A 4xx the OpenAI SDK does not retry, saying what is missing and how to provide it.
    assert response.status_code == 422 and response.headers["x-should-retry"] == "false"
    answer = response.json()
    assert answer["error_type"] == "NoUpstream" and answer["field"] == "resources"
    assert f"rollout {orphan.rollout_id} has no llm resource" in answer["detail"]
    assert "--llm-upstream" in answer["detail"] and "store resources set-llm" in answer["detail"]
    response = await proxy.post(
        f"/rollout/{orphan.rollout_id}/attempt/at-missing/v1/chat/completions", json={"messages": MESSAGES}
    )
    assert response.status_code == 404 and response.json()["field"] == "attempt_id"
    response = await proxy.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 422 and response.json()["field"] == "rollout_id"


async def test_an_unreachable_or_garbled_upstream_is_a_502_recorded_as_an_error_span(
    proxy: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    garbled = FastAPI()

    @garbled.post("/v1/chat/completions")
    async def chat() -> PlainTextResponse:
        return PlainTextResponse("<html>proxy error page</html>")

    with socket.socket() as probe:  # a port with nothing listening on it
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    async with serve_app(garbled) as garbled_url:
        for endpoint in (f"http://127.0.0.1:{closed}/v1", f"{garbled_url}/v1"):
            resources = await sql_store.add_resources({"policy": LLM(endpoint=endpoint, model="tiny")})
            rollout = await sql_store.start_rollout(1, resources_id=resources.resources_id)
            for stream in (False, True):
                response = await proxy.post(bound(rollout), json={"messages": MESSAGES, "stream": stream})
                if stream and endpoint == f"{garbled_url}/v1":
                    # A stream relays what the upstream sends; what was sent is recorded (no token ids here).
                    assert response.status_code == 200
                    continue
                assert response.status_code == 502, (endpoint, stream)
                assert response.json()["error_type"] == "UpstreamError"
            for _ in range(200):
                spans = await sql_store.query_spans(rollout.rollout_id)
                if len(spans) == 2:
                    break
                await asyncio.sleep(0.025)
            statuses = sorted(s.status.status_code for s in spans)
            assert statuses == (["ERROR", "ERROR"] if str(closed) in endpoint else ["ERROR", "OK"])


def test_tiny_model_files_exist(policy: PolicyServer) -> None:
    assert (Path(policy.model_dir) / "config.json").exists()


async def test_concurrent_calls_of_many_attempts_are_all_recorded_before_their_attempts_end(
    proxy: httpx.AsyncClient, sql_store: SqlStore, upstream: str
) -> None:
    resources = await sql_store.add_resources({"policy": LLM(endpoint=f"{upstream}/v1", model="tiny")})
    rollouts = [await sql_store.start_rollout({"i": i}, resources_id=resources.resources_id) for i in range(6)]
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 1.0}

    async def attempt(rollout: AttemptedRollout) -> None:
        for _ in range(3):
            assert (await proxy.post(bound(rollout), json=body)).status_code == 200
        # At once, as a worker reports: the records of the calls may still be queued.
        ended = await proxy.post(
            f"/v1/agl/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}",
            json={"status": "succeeded"},
        )
        assert ended.status_code == 200, ended.text

    await asyncio.gather(*(attempt(r) for r in rollouts))

    for rollout in rollouts:  # read right after the status, with no waiting
        calls = await sql_store.query_llm_calls([rollout.rollout_id])
        spans = await sql_store.query_spans(rollout.rollout_id)
        assert len(calls) == 3 and [s.sequence_id for s in spans] == [1, 2, 3]
        assert {c.span_id for c in calls} == {s.span_id for s in spans}


@pytest.mark.parametrize(
    "database_url",
    [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
async def test_a_nul_or_lone_surrogate_in_the_answer_is_recorded_on_every_backend(
    proxy: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    """A model may emit a NUL (a tiny untrained one did), which Postgres cannot hold in jsonb: the agent gets the
    answer as the upstream sent it, and the record keeps it with U+FFFD in its place, on both backends."""
    content = "mem\u0000ory \ud800!"
    odd = FastAPI()

    @odd.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> PlainTextResponse:
        if body.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": content}, "token_ids": [7, 0, 9]}]}
            return PlainTextResponse(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", media_type="text/event-stream")
        message = {"role": "assistant", "content": content}
        choice = {"index": 0, "token_ids": [7, 0, 9], "message": message}
        answer = {"model": "odd", "prompt_token_ids": [1, 2], "choices": [choice]}
        return PlainTextResponse(json.dumps(answer), media_type="application/json")

    async with serve_app(odd) as odd_url:
        resources = await sql_store.add_resources({"policy": LLM(endpoint=f"{odd_url}/v1", model="odd")})
        for stream in (False, True):
            rollout = await sql_store.start_rollout(1, resources_id=resources.resources_id)
            response = await proxy.post(bound(rollout), json={"messages": MESSAGES, "stream": stream})
            assert response.status_code == 200 and "\\u0000" in response.text  # unchanged for the agent
            [call] = await recorded(sql_store, rollout.rollout_id)
            assert call.response is not None and call.response_token_ids == [7, 0, 9]
            assert call.response["choices"][0]["message"]["content"] == "mem\ufffdory \ufffd!"


async def test_calls_answered_ahead_of_fastapi_keep_its_door_errors_and_metrics(
    proxy: httpx.AsyncClient, rollout: AttemptedRollout
) -> None:
    """The proxy's calls are served ahead of FastAPI's router (``server/direct_proxy.py``): the body door, the
    error shapes and the metrics' route labels are those of the FastAPI routes, which still answer other kinds."""
    garbled = await proxy.post(bound(rollout), content=b"{not json", headers={"content-type": "application/json"})
    assert garbled.status_code == 422 and garbled.json()["field"] == "body"
    nul = await proxy.post(bound(rollout), json={"messages": [{"role": "user", "content": "a\x00b"}]})
    assert nul.status_code == 422 and nul.json()["field"] == "messages.0.content"
    assert (await proxy.post(bound(rollout), json=["a list"])).json()["field"] == "body"
    embeddings = await proxy.post(bound(rollout, "embeddings"), json={"input": "x"})
    assert embeddings.status_code == 404 and embeddings.json()["field"] == "path"
    ids = {"x-rollout-id": rollout.rollout_id, "x-attempt-id": rollout.attempt.attempt_id}
    for path in ("/v1/chat/completions", "/v1/completions"):
        missing = await proxy.post(path, json={"messages": MESSAGES}, headers={"x-rollout-id": rollout.rollout_id})
        assert missing.status_code == 422 and missing.json()["field"] == "attempt_id"
    answered = await proxy.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers=ids)
    assert answered.status_code == 200, answered.text
    metrics = (await proxy.get("/metrics")).text
    for route, status in (
        ("/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind:path}", 422),
        ("/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind:path}", 404),
        ("/v1/chat/completions", 422),
        ("/v1/completions", 200),
    ):
        assert f'method="POST",route="{route}",status="{status}"' in metrics, (route, status)
    assert 'route="unmatched"' not in metrics


async def test_a_call_after_an_idle_pause_does_not_meet_a_connection_the_upstream_is_closing(
    proxy: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    """A uvicorn-based upstream (vLLM's server) closes a connection idle 5 s; a call sent on it as it closes gets
    no answer, and a POST cannot be retried. The stand-in makes that race certain: it drops, unanswered, any
    request that reaches a connection idle longer than 4.5 s. The proxy must have opened a new one by then."""
    answer = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        }
    ).encode()
    dropped: list[float] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered_at: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                if answered_at is not None and loop.time() - answered_at > 4.5:
                    dropped.append(loop.time() - answered_at)
                    break  # closed as the request arrived
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)
                )
                writer.write(answer)
                await writer.drain()
                answered_at = loop.time()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        resources = await sql_store.add_resources({"policy": LLM(endpoint=f"http://127.0.0.1:{port}/v1", model="m")})
        rollout = await sql_store.start_rollout(1, resources_id=resources.resources_id)
        first = await proxy.post(bound(rollout), json={"messages": MESSAGES})
        assert first.status_code == 200, first.text
        await asyncio.sleep(4.8)
        second = await proxy.post(bound(rollout), json={"messages": MESSAGES})
        assert second.status_code == 200, second.text
        assert dropped == []
    finally:
        server.close()
        await server.wait_closed()


async def test_an_llm_resources_max_tokens_cap_bounds_every_call(
    proxy: httpx.AsyncClient, sql_store: SqlStore, upstream: str
) -> None:
    """An agent that asks for 2,048 tokens (as framework agents do) gets at most the resource's cap; one that asks
    for none gets the cap; one under it keeps its own. The record says what the upstream was asked for."""
    resources = await sql_store.add_resources(
        {"policy": LLM(endpoint=f"{upstream}/v1", model="tiny", max_tokens_cap=3)}
    )
    asks: list[dict[str, Any]] = [{"max_tokens": 2048}, {"max_completion_tokens": 2048}, {}, {"max_tokens": 2}]
    for ask in asks:
        rollout = await sql_store.start_rollout({"ask": ask}, resources_id=resources.resources_id)
        body = {"messages": MESSAGES, "temperature": 1.0, "seed": 3, **ask}
        assert (await proxy.post(bound(rollout), json=body)).status_code == 200
        [call] = await recorded(sql_store, rollout.rollout_id)
        assert len(call.response_token_ids) <= min(3, ask.get("max_tokens", 3))
        sent = call.sampling_parameters or {}
        expected = {k: min(v, 3) for k, v in ask.items()} or {"max_tokens": 3}
        assert {k: sent[k] for k in ("max_tokens", "max_completion_tokens") if k in sent} == expected
        assert call.request is not None and {k: call.request[k] for k in ask} == ask  # as the agent sent it


async def test_an_llm_resources_forced_parameters_replace_what_the_agent_asked(
    proxy: httpx.AsyncClient, sql_store: SqlStore, upstream: str
) -> None:
    """A framework that always sends a field (AutoGen's ``tool_choice: auto``) is overridden by the resource's
    ``forced_parameters``; the record keeps what the agent sent and what the upstream was asked."""
    llm = LLM(endpoint=f"{upstream}/v1", model="tiny", forced_parameters={"temperature": 0.0, "max_tokens": 2})
    resources = await sql_store.add_resources({"policy": llm})
    rollout = await sql_store.start_rollout({"forced": True}, resources_id=resources.resources_id)
    body = {"messages": MESSAGES, "temperature": 1.0, "max_tokens": 50}
    assert (await proxy.post(bound(rollout), json=body)).status_code == 200
    [call] = await recorded(sql_store, rollout.rollout_id)
    assert call.sampling_parameters is not None
    assert (call.sampling_parameters["temperature"], call.sampling_parameters["max_tokens"]) == (0.0, 2)
    assert len(call.response_token_ids) <= 2
    assert call.request is not None and (call.request["temperature"], call.request["max_tokens"]) == (1.0, 50)
