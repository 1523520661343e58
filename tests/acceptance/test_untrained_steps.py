"""A GRPO step whose rewards carry no signal (issue 40): it says so (a warning and the ``untrained`` metric), does
not publish the unchanged policy as a new version, and the run's summary counts it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from algorithms.progress import Summary
from algorithms.rl.builtin import GRPO
from examples.flight.model import build_tool_namer
from lightning_store.client import HttpStore
from tests.learning import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def test_a_step_without_reward_variance_says_so_and_publishes_no_new_version(
    tmp_path: Path, trainer_store: tuple[HttpStore, str], caplog: pytest.LogCaptureFixture
) -> None:
    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model", steps=10)
    algorithm = GRPO(tasks_per_step=2, group_size=2, learning_rate=1e-3)
    tasks = [{"q": i} for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="algorithms.rl.lightning_rl"):
        summary = await train(
            algorithm,
            store=store,
            url=url,
            model_dir=model,
            output_dir=tmp_path / "out",
            steps=2,
            workers=1,
            concurrency=4,
            train_tasks=tasks,
            val_tasks=[],
            agent="tests.llm_agents:flat_agent",
        )
    steps = [h for h in summary["history"] if "step_seconds" in h]
    assert len(steps) == 2
    assert all(s["untrained"] == 1.0 and s["trained_transitions"] == 0.0 for s in steps), steps
    assert all(s["transitions"] == 4.0 and s["dropped_groups"] == s["groups"] == 2.0 for s in steps), steps
    assert steps[0]["version"] == steps[1]["version"]  # no new version of the same weights
    policy = await store.get_resources_by_id("policy")
    assert policy is not None and policy.version == steps[-1]["version"]
    warned = [r.getMessage() for r in caplog.records if "trained nothing" in r.getMessage()]
    assert len(warned) == 2 and "rewards seen: 0" in warned[0], warned
    run = Summary.of(
        summary["history"], algorithm="grpo", wall_seconds=1.0, output=tmp_path, checkpoint=None, logs=[], store=url
    )
    assert run.untrained_steps == 2 and run.record()["untrained_steps"] == 2
    assert any("2 of 2 steps trained nothing" in line for line in run.lines())
