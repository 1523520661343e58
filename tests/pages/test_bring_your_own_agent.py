"""docs/how-to/bring-your-own-agent.md works as written: its Python file is saved under the name its first line
gives, its ``bash`` commands run in order in one shell (as a reader types them into one terminal), in a fresh
directory that has the repository's ``examples`` beside it, and what the page says the reader will see holds."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.doc_scripts import page_commands, page_files, run_commands

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "how-to" / "bring-your-own-agent.md"

# What a reader waits for after starting a server in the background (the page says so for the policy server;
# `store serve` answers its health route within a second or two).
READY = {
    "store serve": "until python -c \"import httpx; httpx.get('http://127.0.0.1:4747/v1/agl/health').raise_for_status()\""
    " 2>/dev/null; do sleep 0.2; done",
    "store policy serve": "until grep -q '^serving ' policy.log; do sleep 0.2; done",
}


def test_the_page_runs_as_written_and_shows_what_it_says(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for name, source in page_files(PAGE).items():
        (tmp_path / name).write_text(source)
    assert "my_agent.py" in page_files(PAGE)
    commands = page_commands(PAGE)
    assert [c.split()[:2] for c in commands[:2]] == [["store", "serve"], ["python", "-m"]], commands
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("LIGHTNING_STORE_DATABASE_URL", "LIGHTNING_STORE_URL", "LIGHTNING_STORE_TOKEN"):
        env.pop(name, None)
    out = dict(zip(commands, run_commands(commands, READY, cwd=tmp_path, env=env, timeout=840), strict=True))

    def said(prefix: str) -> str:
        return next(text for command, text in out.items() if command.startswith(prefix))

    # Step 3: the policy server's line, a resources id, the LLM shown.
    assert (
        'serving my-model at http://127.0.0.1:8000/v1 (model name "my-model")' in (tmp_path / "policy.log").read_text()
    )
    assert re.fullmatch(r"rs-\w+\n", said("store resources set-llm")), said("store resources set-llm")
    assert "http://127.0.0.1:8000/v1" in said("store resources show") and "my-model" in said("store resources show")
    # Step 4: the four ids, the tasks' own.
    assert said("store enqueue").split() == ["paris", "home", "nine", "morning"]
    # Step 5: every rollout succeeded.
    summary = json.loads(said("store run").strip().splitlines()[-1])
    assert summary == {"summary": {"succeeded": 4}, "worker_restarts": 0}
    # Step 6: the list, the transcript, the token ids and the rewards.
    listing = said("store rollouts list")
    assert all(re.search(rf"\b{name}\s+succeeded\b", listing) for name in ("paris", "home", "nine", "morning"))
    transcript = said("store rollouts transcript paris")
    assert "LLM call" in transcript and "prompt" in transcript and "completion tokens" in transcript
    assert "reward" in transcript and "My flight to Paris was cancelled" in transcript
    calls = said('store sql "SELECT rollout_id, model')
    assert calls.count("my-model") == 4 and re.search(r"\[\d+(, \d+)*\]", calls), calls
    rewards = said('store sql "SELECT count(*) AS rollouts')
    assert re.search(r"\b4\b", rewards), rewards
    # Step 7: one JSON line per step on stdout, then the summary the page shows.
    lines = [json.loads(line) for line in said("store train").splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines if line.get("event") == "step"][-1] == 3
    final = lines[-1]
    assert final["event"] == "summary" and final["steps_run"] == 3 and final["checkpoint"] == "runs/mine/step-3"
    assert {"first", "last"} <= set(final["val_reward"])
    assert (tmp_path / "runs" / "mine" / "step-3" / "config.json").exists()
