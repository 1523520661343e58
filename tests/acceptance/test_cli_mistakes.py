"""A new user's mistakes cost one line each: ``store run`` (and ``store train``) with a mistyped agent stop at
once instead of restarting workers for ever with a traceback each time (a worker that takes more than the
crash-loop window to start, on a busy machine, never tripped that rule); a store address without its scheme is
named as such, and a server URL copied with its ``/v1/agl`` works."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from examples.flight.model import build_tool_namer
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import Server, clean_env, wait_healthy

AGENT = "from runners import rollout\n\n\n@rollout\ndef agent(task):\n    return 1.0\n"


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("my_agnet:agent", "cannot import 'my_agnet' (no module named 'my_agnet'; run from the directory"),
        ("my_agent.py:agent", "cannot import 'my_agent.py' (no module named 'my_agent.py'; run from the"),
        ("my_agent.agent", "cannot load the agent 'my_agent.agent': ValueError: an agent is given as module:name"),
        ("my_agent:agnet", "cannot load the agent 'my_agent:agnet': AttributeError: module 'my_agent' has no"),
    ],
)
async def test_a_mistyped_agent_is_one_line_and_exit_2(spec: str, line: str, tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(AGENT)
    server = Server(cwd=tmp_path)
    try:
        await wait_healthy(server.url, server.process)
        done = await asyncio.to_thread(
            subprocess.run,
            [*store_command(), "run", spec, "--store", server.url, "--workers", "2", "--no-progress"],
            cwd=tmp_path,
            env={**clean_env(), "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    said = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and said.startswith(f"store run: {line}"), said
    assert len(said.splitlines()) == 1 and "Traceback" not in said, said


def test_store_train_with_a_mistyped_agent_stops_with_the_runners_line(tmp_path: Path) -> None:
    """``store train`` watches the runner it started: once that exits (here: the agent does not load), the run
    stops with the runner's last line and exit status 2, instead of waiting for rollouts no one will run."""
    build_tool_namer(tmp_path / "model", steps=1)
    (tmp_path / "train.jsonl").write_text('{"q": 1}\n{"q": 2}\n')
    argv = [*store_command(), "train", "--algorithm", "grpo", "--agent", "my_agnet:agent"]
    argv += ["--model", str(tmp_path / "model"), "--train", str(tmp_path / "train.jsonl"), "--steps", "1"]
    argv += ["--output", str(tmp_path / "run")]
    done = subprocess.run(argv, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "store train: store run exited (status 2): store run: cannot import 'my_agnet' (no module named "
        "'my_agnet'; run from the directory that holds it, and give it as module:function without .py)"
    ), done.stderr


def run_store(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*store_command(), *arguments],
        cwd=cwd,
        env={**clean_env(), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_store_address_without_its_scheme_is_one_line_and_the_api_suffix_is_forgiven(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(AGENT)
    server = Server(cwd=tmp_path)
    try:
        await wait_healthy(server.url, server.process)
        address = server.url.removeprefix("http://")
        ran = await asyncio.to_thread(run_store, "run", "my_agent:agent", "--store", address, cwd=tmp_path)
        listed = await asyncio.to_thread(run_store, "rollouts", "list", "--store", address, cwd=tmp_path)
        suffixed = await asyncio.to_thread(
            run_store, "rollouts", "list", "--store", f"{server.url}/v1/agl", cwd=tmp_path
        )
    finally:
        server.stop()
    said = f"{address!r} has no scheme: a store serve is {server.url}, a database a URL such as sqlite:///"
    assert ran.returncode == 2 and ran.stderr.strip().startswith(f"store run: {said}"), ran.stderr
    assert listed.returncode == 1 and said in listed.stderr and len(listed.stderr.strip().splitlines()) == 1
    assert suffixed.returncode == 0 and "no rollouts" in suffixed.stdout, suffixed.stdout + suffixed.stderr


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--workers", "0"], "--store"),  # no runners of its own and no server for other runners to claim from
        (["--workers", "2"], "--agent"),  # runners of its own and no agent for them
        (["--agent", "my_agent:agent"], "--train"),
    ],
)
def test_store_train_says_which_option_is_missing(options: list[str], named: str, tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"q": 1}\n')
    argv = [*store_command(), "train", "--algorithm", "apo", *options, "--output", str(tmp_path / "run")]
    if named != "--train":
        argv += ["--train", str(tmp_path / "train.jsonl")]
    done = subprocess.run(argv, cwd=tmp_path, env={**clean_env(), "COLUMNS": "300"}, capture_output=True, text=True)
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything started
