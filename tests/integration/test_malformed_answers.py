"""Malformed upstream answers cost no record (issue 39, defects 1, 2, 3 and 8), on both backends.

The upstream is a STAND-IN (an OpenAI-compatible server that answers what the test scripts, malformed on purpose):
no real policy server answers a logprob of NaN on demand. Good calls are sent together with a malformed one
through a server whose recorder gathers them into one batch; every call must be recorded, the malformed one
with an ``error`` saying why it is not trainable, and the rollout must stay readable through the API, the
dashboard and ``store export``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from lightning_store import LLM, LlmCall
from lightning_store.client import HttpStore
from lightning_store.models import AttemptedRollout
from lightning_store.sql import SqlStore
from tests.conftest import SQL_BACKENDS, serve_app, serving
from tests.export_store import read_jsonl, run_export

pytestmark = SQL_BACKENDS

GOOD_IDS = [11, 12, 13]


def good_answer(logprobs: list[Any] | None = None) -> dict[str, Any]:
    content = [{"token": str(t), "logprob": v} for t, v in zip(GOOD_IDS, logprobs or [-0.5] * 3, strict=True)]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "fine"},
        "finish_reason": "stop",
        "token_ids": GOOD_IDS,
        "logprobs": {"content": content},
    }
    return {"model": "stand-in", "prompt_token_ids": [1, 2, 3, 4], "choices": [choice]}


def with_choice(**changes: Any) -> str:
    answer = good_answer()
    answer["choices"][0].update(changes)
    return json.dumps(answer)


NAN = good_answer([-0.5, float("nan"), -0.5])
MALFORMED: dict[str, tuple[str, str]] = {
    # name: (the answer's raw text, a fragment of the error the record must carry)
    "token_ids a string": (with_choice(token_ids="11 12 13"), "choices.0.token_ids is a JSON string"),
    "logprob item without logprob": (
        with_choice(logprobs={"content": [{"token": "a"}, {"token": "b"}, {"token": "c"}]}),
        "choices.0.logprobs.content.0 has no logprob",
    ),
    "choices a string": (json.dumps({**good_answer(), "choices": "fine"}), "choices is a JSON string"),
    "choices an object": (json.dumps({**good_answer(), "choices": {"0": {}}}), "choices is a JSON object"),
    "a JSON list": (json.dumps([good_answer()]), "the answer is a JSON list"),
    "nested 900 deep": ("[" * 900 + "]" * 900, "nested deeper than 64 levels"),
    "nested past the parser": ("[" * 100_000 + "]" * 100_000, "nested too deep to parse"),
    "logprob NaN": (json.dumps(NAN), "numbers must be finite"),
    "logprob -Infinity": (json.dumps(good_answer([-0.5, float("-inf"), -0.5])), "numbers must be finite"),
    "logprob -1e400": (json.dumps(good_answer()).replace("-0.5", "-1e400", 1), "numbers must be finite"),
    "token id 2^63": (with_choice(token_ids=[11, 2**63, 13]), "integers must fit in 64 bits"),
    "token id 2^40": (with_choice(token_ids=[11, 2**40, 13]), "choices.0.token_ids.1 is 1099511627776"),
    "token id negative": (with_choice(token_ids=[11, -1, 13]), "not a token id"),
    "token id a float": (with_choice(token_ids=[11, 12.5, 13]), "not a token id"),
    "fewer logprobs than tokens": (
        with_choice(logprobs={"content": [{"token": "a", "logprob": -1.0}]}),
        "1 logprobs for 3 response token ids",
    ),
}


def stand_in() -> FastAPI:
    """Answers ``MALFORMED[<last user message>]`` when it names one, else a good answer; streams on request."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> PlainTextResponse:
        body = await request.json()
        said = body["messages"][-1]["content"]
        if body.get("stream"):
            return PlainTextResponse(stream_of(said), media_type="text/event-stream")
        if said == "plain":  # an ordinary answer without logprobs, as a hosted model gives
            answer = good_answer()
            del answer["choices"][0]["logprobs"]
            return PlainTextResponse(json.dumps(answer), media_type="application/json")
        raw = MALFORMED[said][0] if said in MALFORMED else json.dumps(good_answer())
        return PlainTextResponse(raw, media_type="application/json")

    return app


def stream_of(said: str) -> str:
    """A stream of three token events; ``odd`` puts an event of a shape no server sends in the middle."""
    events: list[Any] = [
        {"model": "stand-in", "prompt_token_ids": [1, 2], "choices": []},
        *(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": f"t{t} "},
                        "token_ids": [t],
                        "logprobs": {"content": [{"token": str(t), "logprob": -0.25}]},
                        "finish_reason": "stop" if t == GOOD_IDS[-1] else None,
                    }
                ]
            }
            for t in GOOD_IDS
        ),
    ]
    if said == "odd":
        events.insert(2, {"choices": {"index": 0, "delta": "surprise"}})
        events.insert(3, ["a list"])
    lines = [f"data: {json.dumps(event)}\n\n" for event in events]
    return "".join(lines) + "data: [DONE]\n\n"


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    async with serve_app(stand_in()) as url:
        yield f"{url}/v1"


def bound(rollout: AttemptedRollout) -> str:
    return f"/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"


async def recorded(store: SqlStore, rollout_id: str, count: int) -> list[LlmCall]:
    for _ in range(400):
        calls = await store.query_llm_calls([rollout_id])
        if len(calls) >= count:
            return calls
        await asyncio.sleep(0.025)
    raise AssertionError(f"{len(calls)} of {count} calls recorded")


def metric(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(line.split()[1])


async def test_one_malformed_answer_costs_no_other_record_and_is_recorded_as_not_trainable(
    sql_store: SqlStore, upstream: str, tmp_path: Path
) -> None:
    """For each kind of malformed answer, six good calls and the malformed one, answered together and gathered
    into one batch (a 0.3 s window): all seven are recorded; the malformed one with empty ids, the reason, its
    answer (or its raw text) and an ERROR span; the rollout reads back through the HTTP API and the dashboard."""
    resources = await sql_store.add_resources({"policy": LLM(endpoint=upstream, model="stand-in")})
    rollouts: dict[str, AttemptedRollout] = {}
    async with (
        serving(sql_store, call_record_window=0.3) as url,
        httpx.AsyncClient(base_url=url, timeout=60) as proxy,
    ):
        for kind in MALFORMED:
            rollout = await sql_store.start_rollout({"kind": kind}, resources_id=resources.resources_id)
            rollouts[kind] = rollout
            said = ["good"] * 3 + [kind] + ["good"] * 3
            answers = await asyncio.gather(
                *(proxy.post(bound(rollout), json={"messages": [{"role": "user", "content": s}]}) for s in said)
            )
            assert [a.status_code for a in answers] == [200] * 7, kind  # the agent gets what the upstream said
        client = HttpStore(url)
        try:
            for kind, (raw, reason) in MALFORMED.items():
                calls = await recorded(sql_store, rollouts[kind].rollout_id, 7)
                assert len(calls) == 7, kind
                good = [c for c in calls if c.error is None]
                [bad] = [c for c in calls if c.error is not None]
                assert len(good) == 6 and all(c.response_token_ids == GOOD_IDS for c in good), kind
                assert reason in bad.error, (kind, bad.error)  # type: ignore[operator]
                assert bad.prompt_token_ids == [] and bad.response_token_ids == [] and bad.response_logprobs is None
                assert bad.response is not None
                if "raw" in bad.response:
                    assert raw.startswith(bad.response["raw"][:1000]), kind
                # Read back through the API (a JSON null in a list once made this a 500 on Postgres).
                assert len(await client.query_llm_calls([rollouts[kind].rollout_id])) == 7, kind
                [span] = [s for s in await sql_store.query_spans(rollouts[kind].rollout_id) if s.span_id == bad.span_id]
                assert span.status.status_code == "ERROR" and span.attributes["error.type"] == "untrainable_answer"
                assert span.status.description == f"not trainable: {bad.error}"
        finally:
            await client.close()
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            metrics = (await http.get("/metrics")).text
            for kind in ("logprob NaN", "a JSON list", "nested past the parser"):
                page = await http.get(f"/dashboard/rollouts/{rollouts[kind].rollout_id}")
                assert page.status_code == 200, (kind, page.text[:500])
    assert metric(metrics, "lightning_store_llm_calls_recorded_total") == 7 * len(MALFORMED)
    assert metric(metrics, "lightning_store_llm_calls_untrainable_total") == len(MALFORMED)
    assert metric(metrics, "lightning_store_llm_call_records_lost_total") == 0


async def test_a_stream_with_an_odd_event_reaches_the_agent_whole_and_is_recorded(
    sql_store: SqlStore, upstream: str
) -> None:
    resources = await sql_store.add_resources({"policy": LLM(endpoint=upstream, model="stand-in")})
    async with serving(sql_store) as url, httpx.AsyncClient(base_url=url, timeout=60) as proxy:
        for said in ("fine", "odd"):
            rollout = await sql_store.start_rollout({"said": said}, resources_id=resources.resources_id)
            body = {"messages": [{"role": "user", "content": said}], "stream": True}
            response = await proxy.post(bound(rollout), json=body)
            assert response.status_code == 200 and response.text == stream_of(said)  # every event, [DONE] too
            [call] = await recorded(sql_store, rollout.rollout_id, 1)
            assert call.response is not None
            assert call.response["choices"][0]["message"]["content"] == "t11 t12 t13 "
            if said == "fine":
                assert call.error is None and call.response_token_ids == GOOD_IDS
                assert call.prompt_token_ids == [1, 2] and call.response_logprobs == [-0.25] * 3
            else:
                assert call.error == "stream event 3: choices is not a list" and call.response_token_ids == []


async def test_export_reads_calls_without_logprobs_and_untrainable_calls(
    sql_store: SqlStore, upstream: str, database_url: str, tmp_path: Path
) -> None:
    """An ordinary answer without logprobs (a hosted model) and a NaN one: ``store export --what llm_calls``
    writes both, as JSON Lines and as Parquet."""
    pytest.importorskip("pyarrow")
    resources = await sql_store.add_resources({"policy": LLM(endpoint=upstream, model="stand-in")})
    rollout = await sql_store.start_rollout({}, resources_id=resources.resources_id)
    async with serving(sql_store) as url, httpx.AsyncClient(base_url=url, timeout=60) as proxy:
        for said in ("plain", "logprob NaN"):
            reply = await proxy.post(bound(rollout), json={"messages": [{"role": "user", "content": said}]})
            assert reply.status_code == 200
        await recorded(sql_store, rollout.rollout_id, 2)
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / fmt
        result = await asyncio.to_thread(
            run_export, database_url, out, "--what", "llm_calls", "--format", fmt, quick=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        if fmt == "jsonl":
            rows = read_jsonl(out / "llm_calls.jsonl")
        else:
            import pyarrow.parquet as pq

            rows = pq.read_table(out / "llm_calls.parquet").to_pylist()
        by_error = {row["error"] is None: row for row in rows}
        assert len(rows) == 2
        assert by_error[True]["response_logprobs"] is None and by_error[True]["response_token_ids"] == GOOD_IDS
        assert "numbers must be finite" in by_error[False]["error"] and by_error[False]["response_token_ids"] == []
