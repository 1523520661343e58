"""``store policy serve`` as users run it: a subprocess serving a tiny model built offline, called with the
OpenAI SDK and httpx, stopped by SIGTERM; its help (and ``python -m algorithms.serving.policy_cli``'s); a bad
model directory."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from algorithms.serving.tiny_model import build_tiny_model
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import clean_env

REPO = Path(__file__).resolve().parents[2]
SERVING = re.compile(r'^serving (?P<model>.+) at (?P<url>http://\S+/v1) \(model name "(?P<name>[^"]+)"\)$')
MODULE = [sys.executable, "-m", "algorithms.serving.policy_cli"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("policy") / "tiny")


def env() -> dict[str, str]:
    return {**clean_env(), "COLUMNS": "200", "NO_COLOR": "1"}


class Lines:
    """The lines a process writes to stdout, read in a thread so that a test can wait for one with a timeout."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert process.stdout is not None
        stdout = process.stdout

        def read() -> None:
            for line in stdout:
                self.lines.put(line.rstrip("\n"))
            self.lines.put(None)

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def wait_for(self, pattern: re.Pattern[str], seconds: float) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if match := pattern.match(line):
                return match
        raise AssertionError("no line matched; the output was:\n" + "\n".join(self.seen))


@pytest.fixture
def policy_server(model_dir: Path) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    process = subprocess.Popen(
        [*store_command(), "policy", "serve", str(model_dir), "--port", "0", "--model-name", "tiny-policy"],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = Lines(process)
    yield process, lines
    if process.poll() is None:
        process.kill()
        process.wait()
    lines.reader.join(10)
    assert process.stdout is not None
    process.stdout.close()


def test_serves_token_ids_over_the_openai_api_and_stops_on_sigterm(
    policy_server: tuple[subprocess.Popen[str], Lines], model_dir: Path
) -> None:
    process, lines = policy_server
    started = lines.wait_for(SERVING, 120)
    assert started["model"] == str(model_dir) and started["name"] == "tiny-policy"
    url = started["url"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url)

    client = OpenAI(base_url=url, api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="tiny-policy",
        messages=[{"role": "user", "content": "My flight was cancelled."}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    extra = answer.model_extra or {}
    [choice] = answer.choices
    token_ids = (choice.model_extra or {})["token_ids"]
    assert extra["prompt_token_ids"] and all(isinstance(t, int) for t in extra["prompt_token_ids"])
    assert token_ids and all(isinstance(t, int) for t in token_ids)
    assert answer.usage is not None and answer.usage.completion_tokens == len(token_ids)
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == len(token_ids)
    completion = httpx.post(
        f"{url}/completions", json={"prompt": "The answer is", "max_tokens": 3, "return_token_ids": True}, timeout=60
    ).json()
    assert completion["choices"][0]["prompt_token_ids"] and completion["choices"][0]["token_ids"]
    assert [m["id"] for m in httpx.get(f"{url}/models").json()["data"]] == ["tiny-policy"]

    process.send_signal(signal.SIGTERM)
    stopping = time.monotonic()
    assert process.wait(timeout=20) == 0, "\n".join(lines.seen)
    assert time.monotonic() - stopping < 10
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models")


@pytest.mark.parametrize("command", [[*store_command(), "policy", "serve"], MODULE], ids=["store", "python-m"])
def test_help_says_what_it_serves(command: list[str]) -> None:
    result = subprocess.run([*command, "--help"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "OpenAI-compatible endpoint" in text and "token ids" in text
    assert "transformers" in text and "vllm" in text and "--model-name" in text


@pytest.mark.parametrize("kind", ["missing", "not-a-model"])
def test_a_bad_model_dir_is_one_line_and_a_non_zero_exit(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "model"
    if kind == "not-a-model":
        path.mkdir()
    result = subprocess.run([*MODULE, str(path)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    what = "does not exist" if kind == "missing" else "is not a model directory (no config.json)"
    assert lines == [f"cannot serve the policy: {path} {what}"]


def test_the_command_module_imports_without_torch() -> None:
    """A plain install (no ``train`` extra) can load the command, so that ``store`` can list it and say what it
    needs."""
    blocked = "import sys; sys.modules.update(torch=None, transformers=None); import algorithms.serving.policy_cli"
    result = subprocess.run([sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert os.sep not in result.stdout  # nothing printed
