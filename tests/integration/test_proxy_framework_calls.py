"""What frameworks do to the proxy, recorded once per call that reached the model, none lost, none doubled
(issue 40): parallel tool calls streamed in pieces, and an SDK that retries a call the upstream failed.

The upstream is a STAND-IN that streams and fails on cue (no hosted LLM offline)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from openai import AsyncOpenAI

from lightning_store import LLM, LlmCall
from lightning_store.sql import SqlStore
from tests.conftest import SQL_BACKENDS, serve_app, serving

pytestmark = SQL_BACKENDS

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in ("search", "lookup")
]


def events_of_two_parallel_calls() -> list[dict[str, Any]]:
    """Two tool calls streamed as OpenAI streams them: each call's id and name once, its arguments in pieces,
    the two interleaved; one token id per event."""
    pieces = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "search", "arguments": ""}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"q": '}},
        {"index": 1, "function": {"arguments": '{"id": 7}'}},
        {"index": 0, "function": {"arguments": '"Paris"}'}},
    ]
    events: list[dict[str, Any]] = [{"model": "stand-in", "prompt_token_ids": [1, 2, 3], "choices": []}]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        choice = {
            "index": 0,
            "delta": {"tool_calls": [piece]},
            "token_ids": [100 + i],
            "logprobs": {"content": [{"token": "t", "logprob": -0.1}]},
            "finish_reason": "tool_calls" if last else None,
        }
        events.append({"choices": [choice]})
    return events


def stand_in() -> FastAPI:
    app = FastAPI()
    app.state.calls = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.calls += 1
        if body["messages"][-1]["content"] == "flaky" and app.state.calls == 1:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        if body.get("stream"):
            lines = "".join(f"data: {json.dumps(e)}\n\n" for e in events_of_two_parallel_calls())
            return PlainTextResponse(lines + "data: [DONE]\n\n", media_type="text/event-stream")
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "fine"},
            "finish_reason": "stop",
            "token_ids": [9],
        }
        return {"model": "stand-in", "prompt_token_ids": [1], "choices": [choice]}

    return app


async def recorded(store: SqlStore, rollout_id: str, spans: int) -> tuple[list[LlmCall], int]:
    for _ in range(200):
        found = [s for s in await store.query_spans(rollout_id) if s.attributes.get("lightning_store.llm_call")]
        if len(found) >= spans:
            break
        await asyncio.sleep(0.025)
    await asyncio.sleep(0.1)  # nothing more is coming
    found = [s for s in await store.query_spans(rollout_id) if s.attributes.get("lightning_store.llm_call")]
    return await store.query_llm_calls([rollout_id]), len(found)


async def test_parallel_tool_calls_streamed_in_pieces_are_recorded_whole(sql_store: SqlStore) -> None:
    app = stand_in()
    async with serve_app(app) as upstream, serving(sql_store) as url:
        resources = await sql_store.add_resources({"policy": LLM(endpoint=f"{upstream}/v1", model="stand-in")})
        rollout = await sql_store.start_rollout({}, resources_id=resources.resources_id)
        base = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
        async with AsyncOpenAI(base_url=base, api_key="unused") as client:
            create: Any = client.chat.completions.create
            stream = await create(
                model="stand-in", messages=[{"role": "user", "content": "go"}], tools=TOOLS, stream=True
            )
            got = [chunk async for chunk in stream]
        assert sum(len(c.choices) for c in got) == 5  # the agent got every event
        calls, spans = await recorded(sql_store, rollout.rollout_id, 1)
    [call] = calls
    assert spans == 1 and call.error is None
    assert call.prompt_token_ids == [1, 2, 3] and call.response_token_ids == [100, 101, 102, 103, 104]
    assert call.finish_reason == "tool_calls" and call.response is not None
    message = call.response["choices"][0]["message"]
    assert [
        (t["id"], t["function"]["name"], json.loads(t["function"]["arguments"])) for t in message["tool_calls"]
    ] == [
        ("call_a", "search", {"q": "Paris"}),
        ("call_b", "lookup", {"id": 7}),
    ]


async def test_a_call_the_sdk_retries_is_recorded_once_per_time_it_reached_the_model(sql_store: SqlStore) -> None:
    """The upstream answers 503 once; the OpenAI SDK retries: one error span for the failed call, one LLM-call
    record (and span) for the answered one, none doubled."""
    app = stand_in()
    async with serve_app(app) as upstream, serving(sql_store) as url:
        resources = await sql_store.add_resources({"policy": LLM(endpoint=f"{upstream}/v1", model="stand-in")})
        rollout = await sql_store.start_rollout({}, resources_id=resources.resources_id)
        base = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
        async with AsyncOpenAI(base_url=base, api_key="unused", max_retries=2) as client:
            reply = await client.chat.completions.create(
                model="stand-in", messages=[{"role": "user", "content": "flaky"}]
            )
        assert reply.choices[0].message.content == "fine" and app.state.calls == 2
        calls, spans = await recorded(sql_store, rollout.rollout_id, 2)
    assert spans == 2 and [c.response_token_ids for c in calls] == [[9]]
    statuses = sorted(
        s.status.status_code
        for s in await sql_store.query_spans(rollout.rollout_id)
        if s.attributes.get("lightning_store.llm_call")
    )
    assert statuses == ["ERROR", "OK"]
