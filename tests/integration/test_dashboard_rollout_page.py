"""The dashboard's page of one rollout against the views, on SQLite and Postgres (the store of
``dashboard_rollouts_fill.py``, served for real): header, attempts, rewards, errors, the span waterfall, the LLM
calls with their text, and the token ids loaded on demand; unknown ids are 404 pages."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest

from lightning_store.spans import Span, TraceStatus
from tests.integration.dashboard_html import Element, number
from tests.integration.dashboard_rollouts_fill import (
    ERROR_TEXT,
    HOSTILE_ID,
    TOKEN_TEXTS,
    TOOLS,
    UPSTREAM_ERROR,
    Site,
    site_for,
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


@pytest.fixture
async def site(database_url: str) -> AsyncIterator[Site]:
    async with site_for(database_url) as opened:
        yield opened


def parsed(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def value(element: Element) -> float | None:
    return number(element.attrs["data-value"])


async def test_a_retried_rollout_shows_what_the_views_hold(site: Site) -> None:
    rollout_id = site.filled.retried
    page = await site.page(f"/dashboard/rollouts/{rollout_id}")
    (r,) = await site.sql("SELECT * FROM rollouts_v WHERE rollout_id = :r", r=rollout_id)
    assert page.testid("rollout-status").text() == r["status"] == "succeeded"
    assert page.testid("rollout-mode").text() == r["mode"]
    assert page.testid("rollout-resources-id").text() == r["resources_id"]
    assert page.testid("rollout-resources-version").text() == str(r["resources_version"])
    assert page.testid("rollout-step").text() == str(r["step"])
    assert page.testid("rollout-task").text() == r["task_id"]
    assert value(page.testid("rollout-start")) == r["start_time"]
    assert value(page.testid("rollout-end")) == r["end_time"]
    assert value(page.testid("rollout-duration")) == r["duration_seconds"]
    assert page.testid("rollout-num-attempts").text() == str(r["num_attempts"]) == "2"
    assert json.loads(page.testid("rollout-metadata").text()) == parsed(r["metadata"])
    assert json.loads(page.testid("rollout-input").text()) == parsed(r["input"])

    attempts = await site.sql("SELECT * FROM attempts_v WHERE rollout_id = :r ORDER BY sequence_id", r=rollout_id)
    rows = page.testids("attempt-row")
    assert [row.attrs["data-attempt-id"] for row in rows] == [a["attempt_id"] for a in attempts]
    for row, a in zip(rows, attempts, strict=True):
        assert row.testid("attempt-sequence").text() == str(a["sequence_id"])
        assert row.testid("attempt-status").text() == a["status"]
        assert row.testid("attempt-worker").text() == a["worker_id"]
        assert value(row.testid("attempt-start")) == a["start_time"]
        assert value(row.testid("attempt-end")) == a["end_time"]
        assert value(row.testid("attempt-duration")) == a["duration_seconds"]
        assert value(row.testid("attempt-heartbeat")) == a["last_heartbeat_time"]

    rewards = await site.sql("SELECT * FROM rewards_v WHERE rollout_id = :r ORDER BY sequence_id", r=rollout_id)
    shown = page.testids("reward-row")
    assert [
        (w.testid("reward-name").text(), value(w.testid("reward-value")), w.testid("reward-attempt").text())
        for w in shown
    ] == [(w["reward_name"], w["reward"], "2") for w in rewards]

    errors = await site.sql(
        "SELECT * FROM spans_v WHERE rollout_id = :r AND status_code = 'ERROR' ORDER BY sequence_id", r=rollout_id
    )
    assert [e.testid("error-message").text() for e in page.testids("error-item")] == [
        e["status_message"] for e in errors
    ]
    assert errors and errors[0]["status_message"] == f"ValueError: {ERROR_TEXT}"
    assert page.testid("error-type").text() == "ValueError"
    assert page.testid("error-exception-message").text() == ERROR_TEXT
    assert "Traceback" in page.testid("error-stacktrace").text()
    assert page.testid("attempt-error").text() == f"ValueError: {ERROR_TEXT}"


async def test_the_waterfall_has_a_row_per_span_nested_by_parent(site: Site) -> None:
    rollout_id = site.filled.retried
    page = await site.page(f"/dashboard/rollouts/{rollout_id}")
    spans = await site.sql("SELECT * FROM spans_v WHERE rollout_id = :r", r=rollout_id)
    rows = {row.attrs["data-span-id"]: row for row in page.testids("span-row")}
    assert set(rows) == {s["span_id"] for s in spans}
    assert {row.attrs["id"] for row in rows.values()} == {f"span-{s['span_id']}" for s in spans}
    by_id = {s["span_id"]: s for s in spans}
    calls = {
        c["span_id"] for c in await site.sql("SELECT span_id FROM llm_calls_v WHERE rollout_id = :r", r=rollout_id)
    }
    rewarded = {
        w["span_id"] for w in await site.sql("SELECT span_id FROM rewards_v WHERE rollout_id = :r", r=rollout_id)
    }
    for span_id, row in rows.items():
        span = by_id[span_id]
        parent = span["parent_id"]
        depth = int(row.attrs["data-depth"])
        assert depth == (int(rows[parent].attrs["data-depth"]) + 1 if parent else 0), span["name"]
        kind = (
            "error"
            if span["status_code"] == "ERROR"
            else "reward"
            if span_id in rewarded
            else "llm"
            if span_id in calls
            else ""
        )
        assert row.attrs["data-kind"] == kind, span["name"]
        assert json.loads(row.testid("span-attributes").text()) == parsed(span["attributes"])
    assert {row.attrs["data-kind"] for row in rows.values()} == {"", "llm", "reward", "error"}
    for waterfall in page.testids("waterfall"):  # children follow their parent
        order = [row.attrs["data-span-id"] for row in waterfall.testids("span-row")]
        for span_id in order:
            parent = by_id[span_id]["parent_id"]
            assert parent is None or order.index(parent) < order.index(span_id)


async def test_llm_calls_show_the_records_numbers_and_text(site: Site) -> None:
    rollout_id = site.filled.retried
    page = await site.page(f"/dashboard/rollouts/{rollout_id}")
    calls = await site.sql("SELECT * FROM llm_calls_v WHERE rollout_id = :r ORDER BY sequence_id", r=rollout_id)
    shown = page.testids("llm-call")
    assert [c.attrs["data-span-id"] for c in shown] == [c["span_id"] for c in calls] and len(calls) == 2
    records = {c.span_id: c for c in await site.store.query_llm_calls([rollout_id])}
    for element, call in zip(shown, calls, strict=True):
        assert element.attrs["id"] == f"call-{call['span_id']}"
        assert element.testid("call-agent").text() == call["agent_name"]
        assert element.testid("call-model").text() == call["model"]
        assert element.testid("call-resources-version").text() == str(call["resources_version"])
        assert value(element.testid("call-latency")) == call["latency_seconds"]
        assert element.testid("call-finish-reason").text() == call["finish_reason"]
        assert element.testid("call-prompt-tokens").text() == str(call["prompt_tokens"])
        assert element.testid("call-response-tokens").text() == str(call["response_tokens"])
        assert element.testid("call-usage-prompt-tokens").text() == str(call["usage_prompt_tokens"])
        assert element.testid("call-usage-completion-tokens").text() == str(call["usage_completion_tokens"])
        record = records[call["span_id"]]
        assert record.request is not None and record.response is not None
        texts = [m.all(lambda e: e.tag == "pre")[0].text() for m in element.testids("call-message")]
        assert texts == [m["content"] for m in record.request["messages"]] and len(texts) == 2
        assert element.testid("call-response").text() == record.response["choices"][0]["message"]["content"]
        # What the agent asked for beside the messages: the tools it offered, the sampling parameters sent.
        assert [t.text() for t in element.testids("call-tool-offered")] == list(TOOLS)
        sampling = {p.attrs["data-name"]: p.text() for p in element.testids("call-sampling-parameter")}
        assert record.sampling_parameters == {"temperature": 0.7, "max_tokens": 64}
        assert sampling == {k: f"{k}={json.dumps(v)}" for k, v in record.sampling_parameters.items()}
        assert element.testids("call-untrainable") == []


async def test_token_ids_load_on_demand_and_match_the_record(site: Site) -> None:
    rollout_id = site.filled.retried
    page = await site.page(f"/dashboard/rollouts/{rollout_id}")
    calls = {c["span_id"]: c for c in await site.sql("SELECT * FROM llm_calls_v WHERE rollout_id = :r", r=rollout_id)}
    assert page.testids("call-tokens") == []  # not on the page until asked for
    for toggle in page.testids("call-tokens-toggle"):
        fragment = await site.page(toggle.attrs["hx-get"])
        tokens = fragment.testid("call-tokens")
        call = calls[tokens.attrs["data-span-id"]]
        prompt = [int(t.attrs["data-id"]) for t in tokens.testids("prompt-token")]
        assert prompt == parsed(call["prompt_token_ids"])
        response = [(int(t.attrs["data-id"]), float(t.attrs["data-logprob"])) for t in tokens.testids("response-token")]
        assert response == list(zip(parsed(call["response_token_ids"]), parsed(call["response_logprobs"]), strict=True))
        assert tokens.testid("prompt-token-count").text() == str(len(prompt))
        assert [t.text() for t in tokens.testids("response-token-text")] == list(TOKEN_TEXTS)  # the answer's
        assert tokens.testids("token-texts-missing") == []
    missing = await site.page(f"/dashboard/rollouts/{rollout_id}/calls/nope/tokens", status=404)
    assert missing.testids("tokens-missing")
    other = await site.page(f"/dashboard/rollouts/{site.filled.failed}/calls/{next(iter(calls))}/tokens", status=404)
    assert other.testids("tokens-missing")  # a call of another rollout is not this rollout's


async def test_other_rollouts_pages(site: Site) -> None:
    two = await site.page(f"/dashboard/rollouts/{site.filled.two_rewards}")
    values = [value(w.testid("reward-value")) for w in two.testids("reward-row")]
    assert len(values) == 2
    listed = await site.page("/dashboard/rollouts?q=" + quote(site.filled.two_rewards))
    assert value(listed.testid("rollout-reward")) == values[-1]  # the last reward span counts
    queued = await site.page(f"/dashboard/rollouts/{site.filled.queued[0]}")
    assert queued.testid("rollout-status").text() == "queuing"
    assert queued.testids("attempts-empty") and queued.testids("rewards-empty") and queued.testids("calls-empty")
    failed = await site.page(f"/dashboard/rollouts/{site.filled.failed}")
    assert failed.testid("rollout-status").text() == "failed" and failed.testids("error-item")


async def test_a_rollout_whose_calls_failed_shows_them_and_why(site: Site) -> None:
    """Its model's upstream answered 502: the proxy recorded each call's span with the error and no call record;
    the page lists those calls with the upstream's answer instead of saying that no call was made."""
    page = await site.page(f"/dashboard/rollouts/{site.filled.failed}")
    attempts = await site.sql("SELECT attempt_id FROM attempts_v WHERE rollout_id = :r", r=site.filled.failed)
    failed_calls = page.testids("failed-call")
    assert len(failed_calls) == len(attempts) >= 1
    assert [f.testid("failed-call-message").text() for f in failed_calls] == [UPSTREAM_ERROR] * len(attempts)
    assert page.testids("llm-call") == [] and page.testids("calls-empty") == []
    spans = {row.attrs["data-span-id"] for row in page.testids("span-row")}
    assert {f.attrs["data-span-id"] for f in failed_calls} <= spans


async def test_llm_spans_that_did_not_go_through_the_proxy_are_named_as_such(site: Site) -> None:
    """An agent whose instrumentation recorded its LLM calls but which called its model directly: the page says
    the calls were made and why they have no token ids."""
    rollout = await site.store.start_rollout({"q": 1})
    span = Span(
        rollout_id=rollout.rollout_id,
        attempt_id=rollout.attempt.attempt_id,
        sequence_id=1,
        trace_id="cd" * 16,
        span_id="direct-call",
        name="ChatOpenAI",
        status=TraceStatus(status_code="OK"),
        attributes={"openinference.span.kind": "LLM"},
        start_time=rollout.attempt.start_time,
        end_time=rollout.attempt.start_time + 0.5,
    )
    await site.store.add_span(span)
    page = await site.page(f"/dashboard/rollouts/{rollout.rollout_id}")
    assert "recorded 1 LLM span " in page.testid("calls-unproxied").text()
    assert page.testids("calls-empty") == [] and page.testids("failed-call") == []


async def test_an_unknown_rollout_is_a_404_page(site: Site) -> None:
    for missing in ("ro-does-not-exist", HOSTILE_ID + "x", "<b>x</b>", "x" * 500, "ro-1' OR '1'='1"):
        response = await site.http.get(f"/dashboard/rollouts/{quote(missing, safe='')}")
        assert response.status_code == 404
        assert "<b>x</b>" not in response.text
        page = await site.page(f"/dashboard/rollouts/{quote(missing, safe='')}", status=404)
        assert page.testids("rollout-not-found")
        assert page.testid("missing-rollout-id").text().startswith(missing[:100])
