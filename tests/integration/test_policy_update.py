"""One policy update on a tiny model built offline: a single optimizer step taking its old log-probs from the
training pass itself lands on exactly the weights of the two-pass update, and ``logprob_mismatch`` measures the
distance between the behaviour log-probs the server reported and the policy's own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from adapters import Transition
from algorithms.serving.tiny_model import build_tiny_model
from algorithms.training.policy import TrainablePolicy, token_batch
from algorithms.training.update import UpdateSettings, anchor, measure, update
from tests.learning import make_transitions

ROWS = [([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14]), ([15, 16, 17], [18, 19])]
ADVANTAGES = [1.0, -0.5, 0.25]
SETTINGS = UpdateSettings(clip_eps=0.2, kl_beta=0.04, micro_batch_size=2, mini_batches=1, epochs=1, max_grad_norm=1.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def transitions(behaviour: list[list[float] | None]) -> list[Transition]:
    return make_transitions(ROWS, behaviour)


def step(policy: TrainablePolicy, batch: list[Transition], *, old_logprobs: bool) -> dict[str, float]:
    rollouts = measure(policy, batch, SETTINGS.micro_batch_size, old_logprobs=old_logprobs)
    assert (rollouts.old_logprobs is None) is not old_logprobs
    advantages = torch.tensor(ADVANTAGES).unsqueeze(1) * rollouts.mask
    return update(policy, batch, advantages, rollouts, SETTINGS)


def test_a_single_step_without_the_old_pass_matches_the_two_pass_update(model_dir: Path) -> None:
    batch = transitions([None] * len(ROWS))
    two_pass = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True)
    one_pass = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True)
    first = step(two_pass, batch, old_logprobs=True)
    second = step(one_pass, batch, old_logprobs=False)
    # Equal up to rounding: Adam's first step moves each weight by about the learning rate (1e-2) whatever its
    # gradient's size, so one with a near-zero gradient can land 1e-5 apart; a wrong old policy moves many.
    for a, b in zip(two_pass.model.parameters(), one_pass.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert first["loss"] == pytest.approx(second["loss"], abs=1e-6)
    assert "clip_fraction" not in first and "clip_fraction" not in second  # a ratio of 1 cannot clip
    start = TrainablePolicy(model_dir, learning_rate=1e-2, reference=False).model.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(start, one_pass.model.parameters(), strict=True)), "no change"
    assert "logprob_mismatch" not in second  # no behaviour log-probs were reported


def test_several_steps_refuse_old_logprobs_from_the_training_pass(model_dir: Path) -> None:
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=False)
    batch = transitions([None] * len(ROWS))
    rollouts = measure(policy, batch, 2, old_logprobs=False)
    settings = UpdateSettings(clip_eps=0.2, kl_beta=0.0, micro_batch_size=2, mini_batches=1, epochs=2, max_grad_norm=1)
    with pytest.raises(ValueError, match="single step"):
        update(policy, batch, rollouts.mask.clone(), rollouts, settings)


def test_clip_fraction_counts_the_tokens_clipped_after_the_first_optimizer_step(model_dir: Path) -> None:
    """With several optimizer steps on one batch the later ones see the ratio to the policy that collected it move
    away from 1; a large learning rate moves it past the clip range (ε = 0.2) on some tokens."""
    policy = TrainablePolicy(model_dir, learning_rate=5e-2, reference=False)
    batch = transitions([None] * len(ROWS))
    rollouts = measure(policy, batch, 2)
    settings = replace(SETTINGS, kl_beta=0.0, epochs=4)
    metrics = update(policy, batch, torch.tensor(ADVANTAGES).unsqueeze(1) * rollouts.mask, rollouts, settings)
    assert 0.0 < metrics["clip_fraction"] < 1.0


def test_logprob_mismatch_is_the_mean_distance_to_the_behaviour_logprobs(model_dir: Path) -> None:
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True)
    own = measure(policy, transitions([None] * len(ROWS)), 8)
    assert own.old_logprobs is not None
    exact = [own.old_logprobs[i, : len(r)].tolist() for i, (_, r) in enumerate(ROWS)]
    shifted = [[v - 0.1 for v in exact[0]], None, [v + 0.3 for v in exact[2]]]  # the second call reported none
    fresh = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True)
    metrics = step(fresh, transitions(shifted), old_logprobs=False)
    expected = (0.1 * len(ROWS[0][1]) + 0.3 * len(ROWS[2][1])) / (len(ROWS[0][1]) + len(ROWS[2][1]))
    assert metrics["logprob_mismatch"] == pytest.approx(expected, abs=1e-5)


def test_anchors_hold_the_untrained_calls_near_the_reference(model_dir: Path) -> None:
    """Pushing some calls up moves the shared weights; the KL anchor keeps the other calls' log-probs closer to
    where they started than the same updates without it."""
    trained = transitions([None] * len(ROWS))
    others = [replace(t, prompt_ids=[20, *t.prompt_ids], response_ids=[21, 22]) for t in trained]
    drift = {}
    for beta in (0.0, 5.0):
        policy = TrainablePolicy(model_dir, learning_rate=3e-2, reference=True)
        start = measure(policy, others, 8).old_logprobs
        metrics: dict[str, float] = {}
        for _ in range(6):
            rollouts = measure(policy, trained, 8, old_logprobs=False)
            anchors = anchor(policy, others, 8, beta) if beta else None
            metrics = update(policy, trained, rollouts.mask.clone(), rollouts, SETTINGS, anchors=anchors)
        end = measure(policy, others, 8).old_logprobs
        assert start is not None and end is not None
        drift[beta] = float((end - start).abs().mean())
        assert ("anchor_kl" in metrics) is bool(beta)
    assert drift[5.0] < 0.5 * drift[0.0], f"mean |Δ log-prob| of the anchored calls: {drift}"


def test_a_rows_log_probs_do_not_depend_on_the_rows_padded_around_it(model_dir: Path) -> None:
    """Prompts are left-padded to end together and only the response columns' logits are computed: each row's
    log-probs equal those of the row run alone, unpadded, and padding leaves no NaN in the gradients."""
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=False)
    policy.model.eval()
    out = policy.forward(token_batch(ROWS, policy.pad_id))
    for i, (prompt, response) in enumerate(ROWS):
        with torch.no_grad():
            alone = policy.model(input_ids=torch.tensor([[*prompt, *response]])).logits[0]
        wanted = torch.log_softmax(alone[len(prompt) - 1 : len(prompt) - 1 + len(response)], -1)
        expected = wanted.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(out.logprobs[i, : len(response)], expected, rtol=1e-4, atol=1e-5)
    out.logprobs.sum().backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in policy.model.parameters())
