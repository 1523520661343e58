"""``store train`` end to end as a user runs it: a subprocess that serves the store on SQLite, starts the runner
and the policy server, trains, checkpoints, and resumes from the checkpoint when run again; what it prints (JSON
lines on stdout when that is not a terminal, no third-party progress bars) and the logs it leaves."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.flight.model import TRAIN_TASKS, VAL_TASKS, build_tool_namer

pytestmark = pytest.mark.slow


VLLM_PYTHON = os.environ.get("LIGHTNING_STORE_TEST_VLLM_PYTHON")


def store_train(
    tmp_path: Path, steps: int, *extra: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "lightning_store.cli", "train", "--algorithm", "grpo"]
    argv += ["--agent", "examples.flight.agent:flight_agent", "--model", str(tmp_path / "model")]
    argv += ["--train", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl")]
    argv += ["--config", str(tmp_path / "grpo.yaml"), "--steps", str(steps), "--workers", "2"]
    argv += ["--output", str(tmp_path / "run"), *extra]
    cwd = Path(__file__).parents[2]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def records(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """What ``store train`` printed on stdout, which holds JSON lines and nothing else (``json.loads`` fails on
    anything else)."""
    return [json.loads(line) for line in result.stdout.splitlines()]


def steps_of(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [record for record in records(result) if record["event"] == "step"]


def test_store_train_runs_checkpoints_and_resumes(tmp_path: Path) -> None:
    build_tool_namer(tmp_path / "model", steps=20)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN_TASKS[:2]))
    (tmp_path / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n")
    (tmp_path / "grpo.yaml").write_text("tasks_per_step: 2\ngroup_size: 2\neval_repeats: 2\nlearning_rate: 1.0e-4\n")
    run = tmp_path / "run"
    first = store_train(tmp_path, 1, "--report-to", "tensorboard")
    assert first.returncode == 0, first.stderr[-3000:]
    *steps_logged, summary = records(first)
    assert [s["event"] for s in steps_logged] == ["step", "step"]
    assert [s["step"] for s in steps_logged] == [0, 1] and "val_reward" in steps_logged[-1]
    # One optimizer step per batch (the default): the importance ratio is 1, nothing can clip, no clip_fraction.
    assert all("clip_fraction" not in s for s in steps_logged)
    assert summary["event"] == "summary" and (summary["steps_run"], summary["last_step"]) == (1, 1)
    assert summary["val_reward"] == {
        "first": steps_logged[0]["val_reward"],
        "first_step": 0,
        "last": steps_logged[-1]["val_reward"],
        "last_step": 1,
    }
    assert summary["checkpoint"] == str(run / "step-1") and summary["store"] == str(run / "store.db")
    assert sorted(summary["logs"]) == [str(run / "runner.log"), str(run / "serve.log")]
    assert (run / "step-1" / "config.json").exists()
    # No progress bar of transformers ("Loading weights", "Writing model shards") in what the user reads.
    assert "it/s]" not in first.stderr and "Loading weights" not in first.stderr, first.stderr[-3000:]
    serve_log = (run / "serve.log").read_text()
    assert "store on sqlite" in serve_log and "Uvicorn running on" in serve_log, serve_log
    assert "HTTP/1.1" not in serve_log  # no line per request below debug
    runner_log = (run / "runner.log").read_text()
    assert "HTTP Request" not in runner_log, runner_log[-3000:]
    lines = [line for line in runner_log.splitlines() if line.startswith('{"event": "attempt_finished"')]
    finished = [json.loads(line) for line in lines]
    assert len(finished) >= 2 + 4 + 2  # the evaluations before and after the step, and the step's rollouts
    succeeded = [record for record in finished if record["status"] == "succeeded"]
    assert succeeded and all(record["reward"] in (0.0, 1.0) for record in succeeded)  # what the agent returned

    second = store_train(tmp_path, steps=2)  # resumes at step 1 and runs one more
    assert second.returncode == 0, second.stderr[-3000:]
    assert [s["step"] for s in steps_of(second)] == [1, 2]
    assert records(second)[-1]["event"] == "summary" and records(second)[-1]["steps_run"] == 1
    assert (run / "step-2" / "config.json").exists()
    with sqlite3.connect(tmp_path / "run" / "store.db") as db:
        logged = db.execute(
            "SELECT json_extract(attributes, '$.step') FROM spans WHERE name = 'lightning_store.train.step'"
            " ORDER BY start_time"
        ).fetchall()
    assert [row[0] for row in logged] == [0, 1, 1, 2]  # each run logs its starting evaluation, then its steps
    # The first run mirrored to TensorBoard (tests/acceptance/test_trackers.py checks every tracker on APO).
    from tests.acceptance.test_trackers import tensorboard_curves

    [board_dir] = (run / "tensorboard").iterdir()
    board, texts = tensorboard_curves(board_dir)
    # Every metric of every step (a step whose groups were all flat trains nothing and logs no loss: two groups
    # of two make that common), and the run's config.
    names = {name for s in steps_logged for name in s} - {"event", "step"}
    assert "val_reward" in names and "reward_mean" in names and "config" in texts
    for name in names:
        curve = {s["step"]: s[name] for s in steps_logged if name in s}
        assert board[name] == pytest.approx(curve, rel=1e-6), name


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_store_train_with_deepspeed_ranks_checkpoints_and_resumes(tmp_path: Path) -> None:
    """Two DeepSpeed ranks (ZeRO-2) train; each checkpoint holds both optimizer partitions, and the second run
    resumes from them.

    Sampling is not seeded, so a step may draw groups whose rewards are all equal and train nothing (GRPO drops
    them). Groups of 4 make that rare (about 4% a step, 0.2% for both steps), and the assertion on gradients
    holds for every step that trained, with at least one that did."""
    build_tool_namer(tmp_path / "model", steps=20)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN_TASKS[:2]))
    (tmp_path / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n")
    (tmp_path / "grpo.yaml").write_text("tasks_per_step: 2\ngroup_size: 4\neval_repeats: 2\nlearning_rate: 1.0e-4\n")
    deepspeed = ("--trainer", "deepspeed", "--processes", "2")
    first = store_train(tmp_path, 1, *deepspeed)
    assert first.returncode == 0, first.stderr[-3000:]
    partitions = sorted(p.name for p in (tmp_path / "run" / "step-1" / "deepspeed").rglob("zero_pp_rank_*.pt"))
    assert len(partitions) == 2, partitions
    assert (tmp_path / "run" / "deepspeed-rank-1.log").exists()
    second = store_train(tmp_path, 2, *deepspeed)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (tmp_path / "run" / "step-2" / "config.json").exists()
    steps_logged = steps_of(second)
    assert [s["step"] for s in steps_logged] == [1, 2]
    first_logged = steps_of(first)
    trained = [s for s in first_logged + steps_logged if s.get("trained_transitions", 0) > 0]
    assert trained and all(s["grad_norm"] > 0 for s in trained), first_logged + steps_logged


def test_bad_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    build_tool_namer(tmp_path / "model", steps=1)
    (tmp_path / "train.jsonl").write_text(json.dumps(TRAIN_TASKS[0]) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n")
    (tmp_path / "grpo.yaml").write_text("group_sise: 2\n")
    result = store_train(tmp_path, steps=1)
    assert result.returncode != 0 and "group_sise" in result.stderr
    # The same from --set, over a valid file.
    (tmp_path / "grpo.yaml").write_text("group_size: 2\n")
    result = store_train(tmp_path, 1, "--set", "tasks_per_step=2", "--set", "group_sise=2")
    assert result.returncode != 0 and "group_sise" in result.stderr and "--config/--set" in result.stderr
    assert not (tmp_path / "run").exists()


def test_bad_serving_or_trainer_options_are_refused_before_anything_starts(tmp_path: Path) -> None:
    build_tool_namer(tmp_path / "model", steps=1)
    (tmp_path / "train.jsonl").write_text(json.dumps(TRAIN_TASKS[0]) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n")
    (tmp_path / "grpo.yaml").write_text("group_size: 2\n")
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_STORE_VLLM_PYTHON"}
    result = store_train(tmp_path, 1, "--policy-server", "vllm", env=env)
    assert result.returncode != 0 and "--vllm-python" in result.stderr
    result = store_train(tmp_path, 1, "--policy-server", "tgi", env=env)
    assert result.returncode != 0 and "policy_server" in result.stderr
    result = store_train(tmp_path, 1, "--decode-threads", "0", env=env)
    assert result.returncode != 0 and "decode_threads" in result.stderr
    result = store_train(tmp_path, 1, "--trainer", "deepspeed", "--zero-stage", "3", env=env)
    assert result.returncode != 0 and "deepspeed_zero_stage" in result.stderr
    result = store_train(tmp_path, 1, "--trainer", "megatron", env=env)
    assert result.returncode != 0 and "trainer" in result.stderr
    result = store_train(tmp_path, 1, "--policy-host", "0.0.0.0", env=env)  # can be listened on, not called
    assert result.returncode != 0 and "--policy-host" in result.stderr and "wildcard" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(900)
@pytest.mark.skipif(not VLLM_PYTHON, reason="LIGHTNING_STORE_TEST_VLLM_PYTHON names no vLLM interpreter")
def test_store_train_serves_the_policy_with_vllm(tmp_path: Path) -> None:
    """One GRPO step with vLLM serving the policy: the rollouts before the step and the evaluation after it are
    answered by vLLM (token ids recorded by the proxy), and the step's weights are swapped into it.

    A step whose groups all scored alike trains nothing and swaps nothing in (vLLM's sampling is not seeded): with
    groups of 2 that happened in CI (no ``vllm/v1``); groups of 8 make it very unlikely."""
    build_tool_namer(tmp_path / "model", steps=20, heads=2)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN_TASKS[:2]))
    (tmp_path / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n")
    (tmp_path / "grpo.yaml").write_text("tasks_per_step: 2\ngroup_size: 8\neval_repeats: 2\nlearning_rate: 1.0e-4\n")
    vllm = ["--policy-server", "vllm", "--vllm-args", "--dtype float32 --enforce-eager --max-model-len 512"]
    env = os.environ | {"LIGHTNING_STORE_VLLM_PYTHON": str(VLLM_PYTHON), "VLLM_CPU_KVCACHE_SPACE": "1"}
    env |= {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    result = store_train(tmp_path, 1, *vllm, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "step-1" / "config.json").exists()
    [step] = [s for s in steps_of(result) if s["step"] == 1]
    assert step.get("trained_transitions", 0) > 0, step  # else nothing was swapped in: see the docstring
    swapped = sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run" / "vllm").rglob("*.safetensors"))
    assert (tmp_path / "run" / "vllm" / "v1" / "model.safetensors").exists(), (swapped, result.stderr[-3000:])
    assert "vllm" in (tmp_path / "run" / "vllm" / "vllm.log").read_text().lower()
    with sqlite3.connect(tmp_path / "run" / "store.db") as db:
        versions = db.execute(
            "SELECT resources_version, count(*) FROM llm_calls WHERE json_array_length(response_token_ids) > 0"
            " GROUP BY resources_version ORDER BY resources_version"
        ).fetchall()
    assert [version for version, _ in versions] == [1, 2], versions  # before the step, and the evaluation after


def test_store_train_sends_its_store_servers_token(tmp_path: Path) -> None:
    """Against a ``store serve`` that wants a bearer token, ``store train --store URL`` sends ``--token`` (or
    ``$LIGHTNING_STORE_TOKEN``); without it, one line that says what is missing, not a traceback."""
    from algorithms.local_stack import wait_healthy
    from bench.harness import free_port, stop

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}
    serve = [sys.executable, "-m", "lightning_store.cli", "serve", "--port", str(port)]
    serve += ["--database-url", f"sqlite:///{tmp_path / 'store.db'}"]
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            serve,
            env=env | {"LIGHTNING_STORE_TOKEN": "sekret"},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, log)
        examples = Path(__file__).parents[2] / "examples" / "apo"
        argv = [sys.executable, "-m", "lightning_store.cli", "train", "--algorithm", "apo"]
        argv += ["--agent", "examples.apo.agent:answer", "--train", str(examples / "train.jsonl")]
        argv += ["--config", str(examples / "apo.yaml"), "--workers", "1", "--store", url]
        argv += ["--optimizer-url", "http://127.0.0.1:9/v1", "--optimizer-model", "stand-in"]
        cwd = Path(__file__).parents[2]

        def train(*extra: str) -> subprocess.CompletedProcess[str]:
            out = ["--output", str(tmp_path / f"run{len(extra)}")]
            return subprocess.run([*argv, *out, *extra], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)

        without = train()
        assert without.returncode == 2, without.stderr[-2000:]
        assert without.stderr.strip().splitlines()[-1] == (
            f"store train: {url}: missing or wrong bearer token; pass --token or set LIGHTNING_STORE_TOKEN"
        )
        with_token = train("--token", "sekret")  # past the token: the store it reached holds no prompt yet
        assert with_token.returncode == 2 and "the store holds no resources" in with_token.stderr, with_token.stderr
    finally:
        stop(server)
