"""GRPO on the cancelled-flight agent (see test_learning.py) in its other modes: asynchronous collection, which
trains on rollouts sampled by an older policy version and drops the too-stale ones; LoRA, which trains adapters
only (the reference policy is the base model with the adapters switched off); and two DeepSpeed ranks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from algorithms.rl.builtin import GRPO
from algorithms.training.policy import ADAPTER_DIR
from examples.flight.model import build_tool_namer
from lightning_store.client import HttpStore
from lightning_store.settings import TrainerSettings
from tests.learning import STARTING_RATE_CEILING, train

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

COMMON: dict[str, Any] = {"tasks_per_step": 8, "group_size": 8, "kl_beta": 0.04, "eval_repeats": 16}


async def test_asynchronous_grpo_learns_from_slightly_stale_rollouts(
    tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model")
    algorithm = GRPO(**COMMON, learning_rate=2e-4, asynchronous=True, max_staleness=1)
    summary = await train(algorithm, store=store, url=url, model_dir=model, output_dir=tmp_path / "out", steps=40)
    history = summary["history"]
    before, after = history[0]["val_reward"], history[-1]["val_reward"]
    assert before < STARTING_RATE_CEILING and after >= 0.8, (
        f"asynchronous GRPO moved the Memory-first rate from {before} to {after}"
    )
    steps = [h for h in history if "staleness_max" in h]
    assert max(h["staleness_max"] for h in steps) == 1, "a queued batch is trained one version after it was sampled"
    assert all(h["staleness_max"] <= 1 for h in steps)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
async def test_grpo_learns_with_two_deepspeed_ranks(tmp_path: Path, trainer_store: tuple[HttpStore, str]) -> None:
    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model")
    algorithm = GRPO(**COMMON, learning_rate=2e-4)
    ranks = TrainerSettings(trainer="deepspeed", trainer_processes=2, deepspeed_zero_stage=2)
    out = tmp_path / "out"
    summary = await train(algorithm, store=store, url=url, model_dir=model, output_dir=out, steps=40, trainer=ranks)
    history = summary["history"]
    before, after = history[0]["val_reward"], history[-1]["val_reward"]
    assert before < STARTING_RATE_CEILING and after >= 0.85, (
        f"GRPO on two DeepSpeed ranks moved the rate from {before} to {after}"
    )
    assert len(list((out / "step-40" / "deepspeed").rglob("zero_pp_rank_*_optim_states.pt"))) == 2


async def test_lora_grpo_learns_and_saves_merged_weights_and_adapters(
    tmp_path: Path, trainer_store: tuple[HttpStore, str]
) -> None:
    from transformers import AutoModelForCausalLM

    store, url = trainer_store
    model = build_tool_namer(tmp_path / "model")
    targets = ["q_proj", "v_proj", "o_proj"]
    lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": targets}
    algorithm = GRPO(**COMMON, learning_rate=2e-3, lora=lora)
    out = tmp_path / "out"
    summary = await train(algorithm, store=store, url=url, model_dir=model, output_dir=out, steps=40)
    history = summary["history"]
    before, after = history[0]["val_reward"], history[-1]["val_reward"]
    assert before < STARTING_RATE_CEILING and after >= 0.8, (
        f"LoRA GRPO moved the Memory-first rate from {before} to {after}"
    )

    final = out / "step-40"
    assert (final / ADAPTER_DIR / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    base = AutoModelForCausalLM.from_pretrained(model).state_dict()
    assert not any("lora" in key for key in merged), "the checkpoint is a plain model"
    changed = {key for key in base if not torch.equal(base[key], merged[key])}
    assert changed and all(any(m in key for m in targets) for key in changed), changed
