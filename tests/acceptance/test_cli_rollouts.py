"""``store rollouts list|show|transcript`` on a store that a real run filled.

Real parts only: a ``store serve`` subprocess on SQLite, a ``store run`` subprocess running the small OpenAI-SDK
agent below through the server's LLM proxy to the scripted stand-in upstream (``tests.scripted_upstream``: a tool
call on the first turn, an answer on the second). The commands then read the store through the server URL and
through the database URL, and what they print is checked against what the store holds. Most invocations run the
real ``store`` Typer app in this process (a subprocess each would cost seconds of plugin imports);
``test_the_installed_store_command`` runs the installed script itself.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionToolParam
from typer.testing import CliRunner

from lightning_store import LLM
from lightning_store.cli import app
from lightning_store.cli.rollouts import ModeChoice, StatusChoice
from lightning_store.client import HttpStore
from lightning_store.llm_calls import LlmCall
from lightning_store.models import ROLLOUT_MODES, ROLLOUT_STATUSES, AttemptedRollout, RolloutConfig, RolloutMode
from runners import rollout
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_run_cli import start_runner
from tests.acceptance.test_serve import Server, clean_env, wait_healthy
from tests.conftest import serve_app
from tests.scripted_upstream import create_app
from tracers import emit_reward, operation

SYSTEM = "You answer questions about the weather. Call lookup_weather first."
WEATHER_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "lookup_weather",
        "description": "The weather in a city now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@rollout
def weather_agent(task: dict[str, Any], llm: LLM, rollout: AttemptedRollout) -> None:
    """Asks the model, runs the tool call it makes, asks again with the result, and rewards a sunny answer.
    ``fail``: ``always`` or ``first`` (the first attempt only) makes the tool raise."""
    with OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
        first = client.chat.completions.create(model=llm.model, messages=messages, tools=[WEATHER_TOOL])
        reply = first.choices[0].message
        [call] = reply.tool_calls or []
        with operation(call.function.name, tool=True, call_id=call.id) as op:  # type: ignore[union-attr]
            city = json.loads(call.function.arguments)["city"]  # type: ignore[union-attr]
            op.record_input({"city": city})
            if task["fail"] == "always" or (task["fail"] == "first" and rollout.attempt.sequence_id == 1):
                raise LookupError(f"no weather station in {city} (task {task['id']})")
            op.record_output(f"sunny in {city}")
        messages += [
            reply.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"sunny in {city}"},
        ]
        second = client.chat.completions.create(model=llm.model, messages=messages, tools=[WEATHER_TOOL])
        answer = second.choices[0].message.content or ""
    emit_reward(1.0 if "sunny" in answer else 0.0, attributes={"feedback": f"the answer was {answer!r}"})


@dataclass
class Filled:
    """The served store after the run: its URL, its database URL, and its LLM-call records by attempt."""

    url: str
    database_url: str
    calls: dict[str, list[LlmCall]]
    attempts: dict[str, list[str]]


TASKS: dict[str, tuple[dict[str, Any], RolloutMode, int]] = {
    "ro-ok": ({"id": "ok", "question": "What is the weather in Paris?", "fail": "never"}, "train", 1),
    "ro-broken": ({"id": "broken", "question": "Weather in Paris?", "fail": "always"}, "val", 1),
    "ro-flaky": ({"id": "flaky", "question": "Is it sunny in Paris?", "fail": "first"}, "train", 2),
}


async def fill(url: str) -> tuple[dict[str, list[LlmCall]], dict[str, list[str]]]:
    """Enqueue the tasks and run them with ``store run`` through the proxy; the LLM calls and attempt ids."""
    store = HttpStore(url)
    try:
        async with serve_app(create_app({"city": "Paris"})) as upstream:
            await store.add_resources({"main_llm": LLM(endpoint=f"{upstream}/v1", model="scripted")})
            for rollout_id, (task, mode, tries) in TASKS.items():
                config = RolloutConfig(max_attempts=tries, retry_condition=["failed"])
                await store.enqueue_rollout(task, mode=mode, config=config, rollout_id=rollout_id)
            runner = start_runner(url, f"{__name__}:weather_agent", "--idle-exit", "1")
            code = await asyncio.to_thread(runner.wait, 120)
            assert code == 0, runner.stdout.read() if runner.stdout else ""
            if runner.stdout is not None:
                runner.stdout.close()
        for _ in range(200):  # the proxy writes its records just after it answered
            calls = await store.query_llm_calls(list(TASKS))
            if len(calls) == 6:
                break
            await asyncio.sleep(0.05)
        by_attempt: dict[str, list[LlmCall]] = {}
        for call in calls:
            by_attempt.setdefault(call.attempt_id, []).append(call)
        attempts = {r: [a.attempt_id for a in await store.query_attempts(r)] for r in TASKS}
        return by_attempt, attempts
    finally:
        await store.close()


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Filled]:
    cwd = tmp_path_factory.mktemp("rollouts")
    server = Server(cwd=cwd)  # SQLite: ./lightning_store.db
    try:
        asyncio.run(wait_healthy(server.url, server.process))
        calls, attempts = asyncio.run(fill(server.url))
        assert sum(len(c) for c in calls.values()) == 6
        yield Filled(server.url, f"sqlite+aiosqlite:///{cwd / 'lightning_store.db'}", calls, attempts)
    finally:
        server.stop()


def cli(*args: str, code: int = 0) -> tuple[str, str]:
    """Run ``store ARGS`` (the real Typer app, in this process) in a terminal 200 columns wide; its stdout and
    stderr."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result.stdout, result.stderr


def usage_error(*args: str) -> str:
    """The usage error (exit status 2) of ``store ARGS``, as one line of words (typer draws it in a box)."""
    err = cli(*args, code=2)[1]
    return " ".join(err.replace("│", " ").split())


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_list_shows_statuses_rewards_and_errors(filled: Filled) -> None:
    rows = json_lines(cli("rollouts", "list", "--store", filled.url, "--json")[0])

    assert [r["rollout_id"] for r in rows] == ["ro-flaky", "ro-broken", "ro-ok"]  # newest first
    by_id = {r["rollout_id"]: r for r in rows}
    assert (by_id["ro-ok"]["status"], by_id["ro-ok"]["attempts"], by_id["ro-ok"]["reward"]) == ("succeeded", 1, 1.0)
    assert by_id["ro-ok"]["error"] is None and by_id["ro-ok"]["mode"] == "train"
    broken = by_id["ro-broken"]
    assert (broken["status"], broken["attempts"], broken["reward"], broken["mode"]) == ("failed", 1, None, "val")
    assert broken["error"] == "LookupError: no weather station in Paris (task broken)"
    flaky = by_id["ro-flaky"]  # the retry succeeded: the latest attempt decides
    assert (flaky["status"], flaky["attempts"], flaky["reward"], flaky["error"]) == ("succeeded", 2, 1.0, None)
    assert all(r["duration_seconds"] > 0 for r in rows)


def test_list_filters_and_pages(filled: Filled) -> None:
    def ids(*options: str) -> list[str]:
        return [
            r["rollout_id"] for r in json_lines(cli("rollouts", "list", "--store", filled.url, "--json", *options)[0])
        ]

    assert ids("--status", "failed") == ["ro-broken"]
    assert ids("--status", "failed", "--status", "succeeded") == ["ro-flaky", "ro-broken", "ro-ok"]
    assert ids("--status", "queuing") == []
    assert ids("--mode", "train") == ["ro-flaky", "ro-ok"]
    assert ids("--limit", "1", "--offset", "1") == ["ro-broken"]
    err = usage_error("rollouts", "list", "--store", filled.url, "--status", "done")
    assert "'done' is not one of" in err and "'succeeded'" in err and "'requeuing'" in err
    assert "'prod' is not one of 'train', 'val', 'test'" in usage_error("rollouts", "list", "--mode", "prod")


def test_show_lists_the_attempts(filled: Filled) -> None:
    [record] = json_lines(cli("rollouts", "show", "ro-flaky", "--store", filled.url, "--json")[0])

    assert record["rollout_id"] == "ro-flaky" and record["status"] == "succeeded" and record["mode"] == "train"
    assert record["input"] == TASKS["ro-flaky"][0] and record["config"]["max_attempts"] == 2
    assert record["resources_id"] and record["resources_version"] == 1
    first, second = record["attempts"]
    assert [first["attempt_id"], second["attempt_id"]] == filled.attempts["ro-flaky"]
    assert (first["sequence_id"], first["status"], first["reward"]) == (1, "failed", None)
    assert first["error"] == "LookupError: no weather station in Paris (task flaky)"
    assert (second["sequence_id"], second["status"], second["reward"], second["error"]) == (2, "succeeded", 1.0, None)
    assert first["worker_id"] and second["duration_seconds"] > 0

    text, _ = cli("rollouts", "show", "ro-broken", "--store", filled.url)
    assert "ro-broken" in text and "failed" in text and '"question": "Weather in Paris?"' in text
    assert filled.attempts["ro-broken"][0] in text and "LookupError: no weather station" in text


def test_transcript_shows_what_the_agent_did(filled: Filled) -> None:
    [attempt] = filled.attempts["ro-ok"]
    calls = filled.calls[attempt]
    prompt, completion = sum(len(c.prompt_token_ids) for c in calls), sum(len(c.response_token_ids) for c in calls)

    text, _ = cli("rollouts", "transcript", "ro-ok", "--store", filled.url)

    assert f"attempt {attempt} (#1, succeeded)" in text
    assert f"system: {SYSTEM}" in text and "user: What is the weather in Paris?" in text  # the prompt
    assert '→ tool call: lookup_weather {"city": "Paris"}' in text  # the model's tool call
    assert "tool lookup_weather (call_1) OK" in text and "output: sunny in Paris" in text  # the tool span
    assert "tool: sunny in Paris" in text and "→ assistant: Answer: sunny in Paris" in text  # the second call
    assert "(3 earlier messages)" in text  # the second call shows only its new message, the tool result
    assert "reward 1 (primary)" in text and "feedback: the answer was 'Answer: sunny in Paris'" in text
    for call in calls:
        assert f"{len(call.prompt_token_ids)} prompt + {len(call.response_token_ids)} completion tokens" in text
    assert f"total: 2 LLM calls · {prompt} prompt tokens · {completion} completion tokens" in text
    assert text.index("lookup_weather {") < text.index("tool lookup_weather") < text.index("Answer:")


def test_transcript_json_lines_carry_tokens_and_errors(filled: Filled) -> None:
    [attempt] = filled.attempts["ro-ok"]
    events = json_lines(cli("rollouts", "transcript", "ro-ok", "--store", filled.url, "--json", "--tokens")[0])

    assert events[0]["event"] == "attempt" and events[0]["attempt_id"] == attempt
    assert [e["event"] for e in events[1:]] == ["llm_call", "tool", "llm_call", "reward", "totals"]
    llm = [e for e in events if e["event"] == "llm_call"]
    for event, call in zip(llm, filled.calls[attempt], strict=True):
        assert event["prompt_token_ids"] == call.prompt_token_ids
        assert event["response_token_ids"] == call.response_token_ids
        assert (event["prompt_tokens"], event["completion_tokens"]) == (
            len(call.prompt_token_ids),
            len(call.response_token_ids),
        )
    assert llm[0]["tool_calls"] == [{"id": "call_1", "name": "lookup_weather", "arguments": '{"city": "Paris"}'}]
    assert events[-1]["prompt_tokens"] == sum(e["prompt_tokens"] for e in llm) and events[-1]["reward"] == 1.0

    failed = json_lines(cli("rollouts", "transcript", "ro-broken", "--store", filled.url, "--json")[0])
    assert failed[0]["status"] == "failed" and "no weather station" in failed[0]["error"]
    tool = next(e for e in failed if e["event"] == "tool")
    assert tool["status"] == "ERROR" and tool["input"] == {"city": "Paris"} and "LookupError" in tool["error"]
    exception = next(e for e in failed if e["event"] == "exception")
    assert exception["type"] == "LookupError" and exception["message"] == "no weather station in Paris (task broken)"
    assert failed[-1]["event"] == "totals" and failed[-1]["exceptions"] == 1 and failed[-1]["reward"] is None

    first = filled.attempts["ro-flaky"][0]
    earlier = json_lines(
        cli("rollouts", "transcript", "ro-flaky", "--attempt", first, "--store", filled.url, "--json")[0]
    )
    assert earlier[0]["attempt_id"] == first and earlier[0]["status"] == "failed"
    assert sum(e["event"] == "llm_call" for e in earlier) == len(filled.calls[first]) == 1


def test_the_database_url_reads_the_same(filled: Filled) -> None:
    for command in (["list"], ["show", "ro-flaky"], ["transcript", "ro-ok", "--tokens"]):
        served = cli("rollouts", *command, "--json", "--store", filled.url)[0]
        direct = cli("rollouts", *command, "--json", "--store", filled.database_url)[0]
        assert json_lines(direct) == json_lines(served)


@pytest.mark.parametrize("where", ["server", "database"])
def test_unknown_ids_fail_with_one_line(filled: Filled, where: str) -> None:
    target = filled.url if where == "server" else filled.database_url
    for command, line in [
        (["show", "ro-nope"], "cannot show rollout: no rollout 'ro-nope'"),
        (["transcript", "ro-nope"], "cannot show transcript: no rollout 'ro-nope'"),
        (
            ["transcript", "ro-ok", "--attempt", "at-nope"],
            "cannot show transcript: rollout 'ro-ok' has no attempt 'at-nope'",
        ),
    ]:
        out, err = cli("rollouts", *command, "--store", target, code=1)
        assert (out, err) == ("", line + "\n")


def test_the_installed_store_command(filled: Filled) -> None:
    """The ``store`` script itself (a subprocess each, run side by side): a table, a transcript, a failure."""
    env = clean_env() | {"COLUMNS": "200"}
    commands = [
        ["rollouts", "list", "--store", filled.url],
        ["rollouts", "transcript", "ro-flaky", "--store", filled.url],
        ["rollouts", "show", "ro-nope", "--store", filled.url],
    ]
    started = [
        subprocess.Popen([*store_command(), *c], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c in commands
    ]
    (listed, _), (transcript, _), (_, missing) = (p.communicate(timeout=120) for p in started)

    assert [p.returncode for p in started] == [0, 0, 1]
    row = next(line for line in listed.splitlines() if "ro-broken" in line)
    assert "failed" in row and "val" in row and "LookupError: no weather station in Paris" in row
    assert "1–3 of 3 rollouts, newest first" in listed
    assert "(#2, succeeded)" in transcript and "→ assistant: Answer: sunny in Paris" in transcript
    assert missing == "cannot show rollout: no rollout 'ro-nope'\n"


def test_the_choices_are_the_models_literals() -> None:
    assert [s.value for s in StatusChoice] == list(ROLLOUT_STATUSES)
    assert [m.value for m in ModeChoice] == list(ROLLOUT_MODES)


def test_an_unreachable_store_fails_with_one_line(tmp_path: Path) -> None:
    _, err = cli("rollouts", "list", "--store", f"sqlite+aiosqlite:///{tmp_path}/missing/x.db", code=1)
    assert err.startswith("cannot list rollouts: ") and err.count("\n") == 1
