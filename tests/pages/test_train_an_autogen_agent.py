"""docs/how-to/train-an-autogen-agent.md works as written, and the AutoGen calculator agent of
``examples/calc_agent`` is recorded as the issue asks: every LLM call with its token ids (one record per call
AutoGen made, its tool calls forced by the resource's ``forced_parameters``), each ``calculator`` call one tool
span with its input and output (AutoGen's own ``execute_tool`` span, without either, not written), the reward
stored, AutoGen's INFO log kept out of the runner's output; then one GRPO step runs.

Real parts throughout: ``store serve`` on SQLite, the built-in policy server on SmolLM2-135M-Instruct, ``store run``
worker processes with AutoGen and its OpenInference instrumentation, ``store train``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.smollm2 import available as smollm2_available
from tests.doc_scripts import ROOT, rows, run_page, store_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(not smollm2_available(), reason="the page needs the train and smollm2 extras"),
]
pytest.importorskip("autogen_agentchat")

PAGE = ROOT / "docs" / "how-to" / "train-an-autogen-agent.md"
READY = store_ready(4796)


def test_the_page_runs_as_written_and_the_agent_and_its_tool_calls_are_recorded(tmp_path: Path) -> None:
    said = run_page(PAGE, tmp_path, READY, timeout=1100)

    assert re.fullmatch(r"rs-\w+\n", said("store resources set-llm")), said("store resources set-llm")
    run = said("store run")
    assert json.loads(run.strip().splitlines()[-1]) == {"summary": {"succeeded": 8}, "worker_restarts": 0}
    assert "autogen" not in run.lower(), run  # AutoGen's INFO lines are kept out

    store = tmp_path / "lightning_store.db"
    calls = rows(store, "SELECT prompt_token_ids, response_token_ids, finish_reason, error FROM llm_calls_v")
    assert len(calls) == 8 and all(c["error"] is None for c in calls)
    assert all(json.loads(c["prompt_token_ids"]) and json.loads(c["response_token_ids"]) for c in calls)
    assert {c["finish_reason"] for c in calls} <= {"tool_calls", "length", "stop"}
    tool_calls = sum(c["finish_reason"] == "tool_calls" for c in calls)
    assert tool_calls >= len(calls) / 2, calls  # "nearly all": stop and length are the exceptions
    spans = {r["name"]: r["n"] for r in rows(store, "SELECT name, count(*) AS n FROM spans GROUP BY name")}
    assert spans["calculator_agent.calculator"] == tool_calls and "execute_tool calculator" not in spans
    for span in rows(store, "SELECT attributes, status FROM spans WHERE name = 'calculator_agent.calculator'"):
        attributes = json.loads(span["attributes"])
        assert isinstance(json.loads(attributes["input.value"])["expression"], str)
        assert attributes["output.value"] and json.loads(span["status"])["status_code"] == "OK"
    rewards = [r["reward"] for r in rows(store, "SELECT reward FROM rewards_v")]
    assert len(rewards) == 8 and 1.0 in rewards, rewards  # "some exact answers"
    assert all(0 <= r <= 0.5 for r in rewards if r != 1.0), rewards  # "a miss scores at most 0.5"
    assert "tool call: calculator" in said("store rollouts transcript p-146")
    assert re.search(rf"\b8\b.*\b{tool_calls}\b", said('store sql "SELECT count(*) AS calls'), re.S)
    assert re.search(rf"calculator_agent\.calculator\s.*\b{tool_calls}\b", said('store sql "SELECT name'))

    lines = [json.loads(line) for line in said("store train").splitlines() if line.startswith("{")]
    step = next(line for line in lines if line.get("event") == "step" and line["step"] == 1)
    assert lines[-1]["event"] == "summary" and lines[-1]["steps_run"] == 1
    assert step["rollouts"] == 8 and step["transitions"] == 8  # --set tasks_per_step=2, 4 times each
