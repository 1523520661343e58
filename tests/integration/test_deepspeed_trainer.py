"""The DeepSpeed training backend: two real ranks (this process and a subprocess, over gloo) train their shares
of each mini-batch and land on the weights and metrics of the single-process update; a checkpoint carries the
partitioned optimizer state into a resumed run."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from algorithms.serving.tiny_model import build_tiny_model
from algorithms.training.trainers import LocalTrainer, PolicySpec, Trainer
from algorithms.training.update import UpdateJob, UpdateSettings, anchor, measure
from lightning_store.settings import TrainerSettings
from tests.learning import make_transitions

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"),
]

# Five transitions over two ranks with micro-batches of two: in each mini-batch one rank has fewer micro-batches
# than the other and pads with an empty backward pass.
ROWS = [([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14]), ([15, 16, 17], [18, 19]), ([20], [21, 22]), ([23, 24], [25])]
ADVANTAGES = [1.0, -0.5, 0.25, -1.0, 0.75]
SETTINGS = UpdateSettings(clip_eps=0.2, kl_beta=0.04, micro_batch_size=2, mini_batches=2, epochs=1, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def train_once(trainer: Trainer, *, anchored: bool = False) -> dict[str, float]:
    batch = make_transitions(ROWS)
    rollouts = measure(trainer.policy, batch, SETTINGS.micro_batch_size)
    advantages = torch.tensor(ADVANTAGES).unsqueeze(1) * rollouts.mask
    anchors = None
    if anchored:
        anchors = anchor(
            trainer.policy, make_transitions([([30, 31], [32, 33]), ([34], [35])], agent="checker"), 2, 1.0
        )
    returns = None if rollouts.values is None else advantages + 0.5  # PPO's value targets, when it has a head
    return trainer.update(UpdateJob(batch, advantages, rollouts, SETTINGS, returns=returns, anchors=anchors))


def deepspeed(spec: PolicySpec, tmp_path: Path, stage: int) -> Trainer:
    from algorithms.training.deepspeed_trainer import DeepSpeedTrainer

    settings = TrainerSettings(
        trainer="deepspeed", trainer_processes=2, deepspeed_zero_stage=stage, trainer_timeout=120
    )
    return DeepSpeedTrainer(
        spec, reference=True, settings=settings, micro_batch_size=2, max_grad_norm=1.0, log_dir=tmp_path
    )


def assert_same_weights(a: Trainer, b: Trainer) -> None:
    """Equal up to summation order: Adam's first steps move every weight by about the learning rate (0.01)
    whatever its gradient's size, so a weight with a near-zero gradient can land ~1e-4 apart; a wrong shard
    or scale moves many by ~1e-2. (The gradient norms are compared exactly, as Adam hides a scale.)"""
    first, second = a.policy.state_dict(), b.policy.state_dict()
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        torch.testing.assert_close(tensor, second[name], rtol=0, atol=1e-3, msg=name)


@pytest.mark.parametrize("stage", [1, 2])
def test_two_ranks_land_on_the_single_process_update(model_dir: Path, tmp_path: Path, stage: int) -> None:
    spec = PolicySpec(model_dir, learning_rate=1e-2)
    local = LocalTrainer(spec, reference=True)
    expected = train_once(local, anchored=True)
    ranks = deepspeed(spec, tmp_path, stage)
    try:
        got = train_once(ranks, anchored=True)
        assert_same_weights(local, ranks)
        assert got["kl"] == pytest.approx(expected["kl"], rel=1e-4, abs=1e-7)
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4)
        assert got["anchor_kl"] == pytest.approx(expected["anchor_kl"], rel=1e-4, abs=1e-7)
        assert got["clip_fraction"] == expected["clip_fraction"]
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
    finally:
        ranks.close()
    moved = [not torch.equal(t, local.policy.reference.state_dict()[k]) for k, t in local.policy.state_dict().items()]
    assert any(moved)  # the update did something, so agreeing means something


# Two conversations (3 and 2 calls, each prompt its previous prompt + response + a tool result) and two single
# calls: 7 calls in 4 packed sequences, which the ranks share as units (one gets 3 calls, the other 4).
CONVERSATION_ROWS = [
    ([5, 6], [7, 8]),
    ([5, 6, 7, 8, 9], [10]),
    ([5, 6, 7, 8, 9, 10, 11, 12], [13, 14]),
    ([20, 21, 22], [23]),
    ([20, 21, 22, 23, 24], [25, 26]),
    ([30], [31, 32]),
    ([33, 34], [35]),
]
CONVERSATIONS = [("c0", 0), ("c0", 1), ("c0", 2), ("c1", 0), ("c1", 1), ("s0", 0), ("s1", 0)]


def test_packed_conversations_train_on_ranks_as_in_one_process(model_dir: Path, tmp_path: Path) -> None:
    batch = [
        replace(t, rollout_id=rollout, step=step)
        for t, (rollout, step) in zip(make_transitions(CONVERSATION_ROWS), CONVERSATIONS, strict=True)
    ]
    advantages = [1.0, -0.5, 0.25, -1.0, 0.75, 0.5, -0.25]
    settings = replace(SETTINGS, mini_batches=1)
    spec = PolicySpec(model_dir, learning_rate=1e-2)
    local = LocalTrainer(spec, reference=True)

    def train(trainer: Trainer) -> dict[str, float]:
        rollouts = measure(trainer.policy, batch, 2)
        per_token = torch.tensor(advantages).unsqueeze(1) * rollouts.mask
        return trainer.update(UpdateJob(batch, per_token, rollouts, settings))

    expected = train(local)
    assert expected["train_sequences"] == 4.0 and expected["packed_calls"] == 5.0
    ranks = deepspeed(spec, tmp_path, 2)
    try:
        got = train(ranks)
        assert_same_weights(local, ranks)
        for name in ("loss", "kl", "grad_norm"):
            assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-7), name
        assert got["train_sequences"] == 4.0
    finally:
        ranks.close()


@pytest.mark.parametrize("option", ["value_head", "lora"])
def test_ppos_value_head_and_lora_adapters_train_on_ranks_as_in_one_process(
    model_dir: Path, tmp_path: Path, option: str
) -> None:
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]} if option == "lora" else None
    spec = PolicySpec(model_dir, learning_rate=1e-2, value_head=option == "value_head", lora=lora)
    torch.manual_seed(0)  # LoRA's initial adapters are random; both runs start from the same
    local = LocalTrainer(spec, reference=True)
    expected = train_once(local)
    torch.manual_seed(0)
    ranks = deepspeed(spec, tmp_path, 2)
    try:
        got = train_once(ranks)
        assert_same_weights(local, ranks)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)
        if option == "value_head":
            assert got["value_loss"] == pytest.approx(expected["value_loss"], rel=1e-4)
            assert local.policy.value_head is not None and ranks.policy.value_head is not None
            moved = local.policy.value_head.weight.detach()
            assert moved.abs().sum() > 0  # it started at zero
            torch.testing.assert_close(moved, ranks.policy.value_head.weight.detach(), rtol=0, atol=1e-3)
    finally:
        ranks.close()


def test_a_checkpoint_carries_the_partitioned_optimizer_state(model_dir: Path, tmp_path: Path) -> None:
    spec = PolicySpec(model_dir, learning_rate=1e-2)
    ranks = deepspeed(spec, tmp_path / "first", 2)
    try:
        train_once(ranks)
        ranks.save(tmp_path / "step-1")
        train_once(ranks)
        uninterrupted = ranks.policy.state_dict()
    finally:
        ranks.close()
    assert (tmp_path / "step-1" / "config.json").exists()
    assert len(list((tmp_path / "step-1" / "deepspeed").rglob("zero_pp_rank_*optim_states.pt"))) == 2

    resumed = deepspeed(PolicySpec(model_dir, learning_rate=1e-2, checkpoint=tmp_path / "step-1"), tmp_path, 2)
    try:
        train_once(resumed)
        for name, tensor in resumed.policy.state_dict().items():
            torch.testing.assert_close(tensor, uninterrupted[name], rtol=1e-5, atol=1e-6, msg=name)
    finally:
        resumed.close()
    # The control: without the optimizer state Adam's second step is a first step again, and lands elsewhere.
    (tmp_path / "step-1" / "deepspeed").rename(tmp_path / "optimizer-moved-away")
    fresh = deepspeed(PolicySpec(model_dir, learning_rate=1e-2, checkpoint=tmp_path / "step-1"), tmp_path, 2)
    try:
        train_once(fresh)
        state = fresh.policy.state_dict()
        assert any(not torch.allclose(state[name], tensor, atol=1e-6) for name, tensor in uninterrupted.items())
    finally:
        fresh.close()


def test_a_rank_that_dies_fails_the_update_with_its_log(model_dir: Path, tmp_path: Path) -> None:
    from algorithms.training.deepspeed_trainer import DeepSpeedTrainer, TrainerFailed

    ranks = deepspeed(PolicySpec(model_dir, learning_rate=1e-2), tmp_path, 2)
    assert isinstance(ranks, DeepSpeedTrainer)
    try:
        ranks.processes[0].kill()
        ranks.processes[0].wait()
        with pytest.raises(TrainerFailed, match=r"rank 1 exited .*deepspeed-rank-1\.log"):
            train_once(ranks)
    finally:
        ranks.close()


def test_resuming_with_another_number_of_ranks_is_refused(model_dir: Path, tmp_path: Path) -> None:
    from algorithms.training.deepspeed_trainer import DeepSpeedTrainer, TrainerFailed

    ranks = deepspeed(PolicySpec(model_dir, learning_rate=1e-2), tmp_path, 2)
    try:
        ranks.save(tmp_path / "step-1")
    finally:
        ranks.close()
    settings = TrainerSettings(trainer="deepspeed", trainer_processes=1, trainer_timeout=120)
    spec = PolicySpec(model_dir, learning_rate=1e-2, checkpoint=tmp_path / "step-1")
    with pytest.raises(TrainerFailed, match="optimizer state of 2 ranks"):
        DeepSpeedTrainer(
            spec, reference=False, settings=settings, micro_batch_size=2, max_grad_norm=1.0, log_dir=tmp_path
        )
