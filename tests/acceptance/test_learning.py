"""It learns: GRPO on the cancelled-flight agent raises the held-out Memory-first rate of a tiny model that
starts by naming the three tools about equally often. The whole stack runs: store served over HTTP, LLM proxy,
runner worker processes, the policy server, the trainer. Seeds fix the model, its fine-tuning and the task
order; sampling across concurrent workers is not reproducible, so the thresholds keep a margin."""

from __future__ import annotations

from pathlib import Path

import pytest

from algorithms.builtin import GRPO
from lightning_store.sql import SqlStore
from tests.learning import build_tool_namer, train

pytestmark = pytest.mark.slow


async def test_grpo_learns_to_check_memory_first(tmp_path: Path, served: tuple[SqlStore, str]) -> None:
    store, url = served
    model = build_tool_namer(tmp_path / "model")
    grpo = GRPO(learning_rate=2e-4, tasks_per_step=8, group_size=8, kl_beta=0.04, eval_repeats=16, seed=0)
    summary = await train(grpo, store=store, url=url, model_dir=model, output_dir=tmp_path / "out", steps=40)
    history = summary["history"]
    before, after = history[0]["val_reward"], history[-1]["val_reward"]
    assert before < 0.5, f"the starting model should pick Memory first about a third of the time, not {before}"
    assert after >= 0.85, f"GRPO raised the Memory-first rate from {before} to {after} only"
    assert (tmp_path / "out" / "step-40" / "config.json").exists()
    runs = (await store.query_rollouts(metadata_match={"training_run": "grpo"})).items
    assert len(runs) == 1 and runs[0].status == "succeeded"
