"""It learns: each LightningRL algorithm raises the held-out Memory-first rate of the cancelled-flight agent,
starting from a tiny model that names the three tools about equally often. The whole stack runs: store served
over HTTP, LLM proxy, runner worker processes, the policy server, the trainer. Seeds fix the model, its
fine-tuning and the task order; sampling across concurrent workers is not reproducible, so the thresholds
(the issue's: GRPO 0.85, PPO and REINFORCE++ 0.8) sit below what the runs reach (about 0.9–0.99)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from algorithms.base import Algorithm
from algorithms.rl.builtin import GRPO, PPO, ReinforcePP
from examples.flight.model import build_tool_namer
from lightning_store.client import HttpStore
from tests.learning import STARTING_RATE_CEILING, train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # ~2 min on a quick day, 6 on a slow one

COMMON: dict[str, Any] = {
    "learning_rate": 2e-4,
    "tasks_per_step": 8,
    "group_size": 8,
    "kl_beta": 0.04,
    # 4 validation questions x 32 = 128 rollouts per measurement. With 64, a run that truly reaches 0.9 measured
    # below GRPO's 0.85 about once in ten (a CI run failed at 0.84); with 128, about once in thirty.
    "eval_repeats": 32,
}


# GRPO trains 60 steps, for its higher target: after 40, the trained model's true rate (1,024 seeded samples) was
# 0.875, 0.872 and 0.980 in three runs, so 128 rollouts measured below 0.85 about one run in five (a CI run failed
# at 0.844); after 60 steps it was 0.960, 0.947 and 0.996.
@pytest.mark.parametrize(
    ("algorithm", "target", "steps"),
    [
        pytest.param(GRPO(**COMMON), 0.85, 60, id="grpo"),
        # REINFORCE++ and PPO learn as GRPO does (same model, tasks and loop). After 40 steps a loaded CI run
        # measured 0.77 and 0.79 (2026-12-04; 0.41 and 0.48 with the gradient off): 60 steps, as GRPO.
        pytest.param(ReinforcePP(**COMMON), 0.8, 60, id="reinforce_pp"),
        pytest.param(PPO(**COMMON), 0.8, 60, id="ppo"),
    ],
)
async def test_training_raises_the_memory_first_rate(
    algorithm: Algorithm, target: float, steps: int, tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model")
    summary = await train(algorithm, store=store, url=url, model_dir=model, output_dir=tmp_path / "out", steps=steps)
    history = summary["history"]
    before, after = history[0]["val_reward"], history[-1]["val_reward"]
    assert before < STARTING_RATE_CEILING, (
        f"the starting model should pick Memory first about a third of the time, not {before}"
    )
    assert after >= target, f"{algorithm.name} raised the Memory-first rate from {before} to {after} only"
    assert (tmp_path / "out" / f"step-{steps}" / "config.json").exists()
    runs = (await store.query_rollouts(metadata_match={"training_run": algorithm.name})).items
    assert len(runs) == 1 and runs[0].status == "succeeded"
