"""``store train --dry-run`` (and ``Trainer.dry_run``): what would run and every check that needs nothing started,
as a user runs it; nothing is started, nothing written to the output directory or the store.

Real parts: ``store train`` and ``store doctor`` as subprocesses, the tutorial's tiny model, a ``store serve`` on
SQLite; the scripted stand-in of ``tests.scripted_optimizer`` is APO's optimizer LLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import apo_agents as agents
from tests.acceptance.test_apo import runs, stack, write_tasks
from tests.scripted_optimizer import OPTIMIZER_MODEL, create_app

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
FLIGHT = ROOT / "examples" / "flight"


def store_train(*argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "lightning_store.cli", "train", *argv, "--dry-run"]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT)


def checks(result: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    """Each check's lines, ``OUTCOME  detail``."""
    found: dict[str, list[str]] = {}
    lines = result.stdout.split("checks:\n")[-1].splitlines()
    for line in lines:
        outcome, check, detail = line[:4].strip(), line[6:15].strip(), line[17:]
        found.setdefault(check, []).append(f"{outcome}  {detail}")
    return found


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.flight.model import build_tool_namer

    return build_tool_namer(tmp_path_factory.mktemp("model") / "flight-model", steps=1)


def test_a_grpo_run_is_described_and_every_check_passes(tmp_path: Path, model: Path) -> None:
    output = tmp_path / "run"
    result = store_train(
        "--algorithm", "grpo", "--agent", "examples.flight.agent:flight_agent", "--model", str(model),
        "--train", str(FLIGHT / "train.jsonl"), "--val", str(FLIGHT / "val.jsonl"),
        "--config", str(FLIGHT / "grpo.yaml"), "--output", str(output), "--workers", "3", "--report-to", "tensorboard",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    would_run = result.stdout.split("checks:\n")[0]
    assert would_run.startswith("would run:\n  algorithm  grpo {")
    assert '"group_size": 8' in would_run and '"learning_rate": 0.0004' in would_run
    assert "  tasks      train 8, val 4, test 0\n" in would_run
    assert "store run examples.flight.agent:flight_agent: 3 workers, 1 attempt at once each" in would_run
    assert f"store serve on {output / 'store.db'}" in would_run and "  steps      10\n" in would_run
    found = checks(result)
    assert all(lines[0].startswith("ok") for lines in found.values()), result.stdout
    assert set(found) == {"options", "model", "agent", "store", "algorithm", "trackers"}
    assert "Qwen2ForCausalLM" in found["model"][0] and "with a chat template" in found["model"][0]
    assert "(new)" in found["store"][0]
    assert not output.exists()  # nothing written


def test_a_mistyped_agent_and_a_directory_that_is_no_model_fail_in_one_line_each(tmp_path: Path) -> None:
    result = store_train(
        "--algorithm", "grpo", "--agent", "examples.flight.agent:flight_agnet", "--model", str(tmp_path),
        "--train", str(FLIGHT / "train.jsonl"), "--output", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    found = checks(result)
    assert found["agent"] == [
        "FAIL  cannot load the agent 'examples.flight.agent:flight_agnet': AttributeError: module "
        "'examples.flight.agent' has no attribute 'flight_agnet'"
    ]
    assert found["model"][0].startswith(f"FAIL  {tmp_path} does not load: ")
    assert "Traceback" not in result.stdout + result.stderr and not (tmp_path / "run").exists()


def test_apo_is_checked_against_the_store_and_its_optimizer(tmp_path: Path) -> None:
    write_tasks(tmp_path, train=agents.classify_tasks("train"), val=agents.classify_tasks("val"))
    common = ["--algorithm", "apo", "--agent", "tests.apo_agents:classify", "--train", str(tmp_path / "train.jsonl")]
    common += ["--val", str(tmp_path / "val.jsonl"), "--output", str(tmp_path / "run")]

    # The embedded store a run would start is new: it holds no prompt to optimize.
    result = store_train(*common, "--optimizer-url", "http://127.0.0.1:9/v1", "--optimizer-model", "m")
    assert result.returncode == 1
    assert checks(result)["algorithm"][0].startswith("FAIL  resources_id: the store holds no resources; write")

    with stack(tmp_path, create_app({}), {"prompt_template": agents.CLASSIFY_SEED}) as env:
        optimizer = ["--optimizer-url", env["llm"], "--optimizer-model", OPTIMIZER_MODEL]
        result = store_train(*common, "--store", env["store"], *optimizer)
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        found = checks(result)
        assert [line.split()[0] for line in found["store"] + found["resources"] + found["llm"]] == ["ok"] * 3
        assert found["algorithm"][0] == "ok  seed: resources main, templates prompt_template", found
        assert found["algorithm"][1] == f"ok  optimizer: {OPTIMIZER_MODEL} at {env['llm']} answers"

        unreachable = ["--optimizer-url", "http://127.0.0.1:9/v1", "--optimizer-model", "m"]
        result = store_train(*common, "--store", env["store"], *unreachable)
        assert result.returncode == 1
        assert checks(result)["algorithm"][0].startswith("FAIL  --optimizer-url: cannot reach http://127.0.0.1:9/v1")
        assert runs(env["db"]) == []  # nothing written: no run began
    assert not (tmp_path / "run").exists()


def test_the_python_api_returns_the_same_findings(tmp_path: Path) -> None:
    from algorithms import APO, Trainer

    checked = Trainer(APO(), runners=0, output=tmp_path / "run").dry_run(train=[{"q": 1}])
    assert not checked.ok and checked.would_run == []
    assert (
        repr(checked)
        == "FAIL  options    store: with runners=0 your own runners run the rollouts: give their store's URL"
    )
