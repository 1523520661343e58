"""Advantage estimators and the policy-gradient loss against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.rl.advantages import EPSILON, gae, grpo, reinforce_pp
from algorithms.training.pg_core import policy_loss, value_loss


def test_grpo_normalizes_within_groups_and_drops_flat_ones() -> None:
    result = grpo([1.0, 0.0, 1.0, 1.0, 0.5, 0.5], ["a", "a", "a", "a", "b", "b"])
    # Group a: mean 0.75, population std sqrt(0.1875) = 0.4330.
    std = math.sqrt(0.1875)
    expected = [0.25 / (std + EPSILON), -0.75 / (std + EPSILON), 0.25 / (std + EPSILON), 0.25 / (std + EPSILON)]
    assert result.values[:4] == pytest.approx(expected)
    assert result.values[4:] == [None, None]
    assert (result.groups, result.dropped_groups) == (2, 1)
    assert grpo([1.0, 0.0], ["a", "a"], scale=False).values == [0.5, -0.5]


def test_reinforce_pp_normalizes_over_the_batch() -> None:
    result = reinforce_pp([1.0, 0.0, 0.0, 0.0])
    std = math.sqrt(0.1875)
    assert result.values == pytest.approx([0.75 / (std + EPSILON), *[-0.25 / (std + EPSILON)] * 3])
    assert reinforce_pp([2.0, 2.0]).values == [0.0, 0.0]


def test_gae_by_hand() -> None:
    # One row, 3 response tokens then padding; reward 1 on the last response token.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    gamma, lam = 0.9, 0.5
    d2 = 1.0 - 0.7
    d1 = 0.0 + gamma * 0.7 - 0.6
    d0 = 0.0 + gamma * 0.6 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    assert gae(rewards, values, mask, gamma=gamma, lam=lam)[0].tolist() == pytest.approx([a0, a1, a2, 0.0])


def test_policy_loss_clips_and_adds_the_k3_kl() -> None:
    # Token 0: ratio e^0.5 ≈ 1.65 with A=+1 → clipped at 1.2. Token 1: ratio 1 with A=-2 → -(-2) = 2.
    # Token 2 is padding.
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0, 0.0]])
    advantages = torch.tensor([[1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    terms = policy_loss(logprobs, old, advantages, mask, clip_eps=0.2, ref_logprobs=ref, kl_beta=0.1, total_tokens=2.0)
    kl1 = math.exp(1.0) - 1.0 - 1.0  # d = ref - logp = 1 on token 1; token 0 has d = 0
    assert terms.pg_sum == pytest.approx(-1.2 + 2.0)
    assert terms.kl_sum == pytest.approx(kl1)
    assert terms.loss.item() == pytest.approx((-1.2 + 2.0 + 0.1 * kl1) / 2.0)
    assert (terms.clipped_tokens, terms.tokens) == (1.0, 2.0)
    terms.loss.backward()  # type: ignore[no-untyped-call]
    assert logprobs.grad is not None
    # Clipped token: no policy gradient; KL gradient there is 0 (d = 0). Token 1: d/dlogp of -ratio*A = -A*ratio
    # = 2, plus beta * d/dlogp (e^(ref-logp) - (ref-logp) - 1) = beta * (1 - e^1); all over 2 tokens.
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, (2.0 + 0.1 * (1 - math.e)) / 2.0, 0.0])


def test_micro_batches_add_up_to_the_full_batch() -> None:
    torch.manual_seed(0)
    logprobs = torch.randn(4, 5)
    old = logprobs + 0.1 * torch.randn(4, 5)
    advantages = torch.randn(4, 1).expand(4, 5)
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    total = float(mask.sum())
    full = policy_loss(logprobs, old, advantages, mask, clip_eps=0.2, total_tokens=total).loss
    halves = sum(
        policy_loss(logprobs[s], old[s], advantages[s], mask[s], clip_eps=0.2, total_tokens=total).loss
        for s in (slice(0, 2), slice(2, 4))
    )
    assert float(halves) == pytest.approx(float(full))


def test_value_loss_takes_the_worse_of_clipped_and_unclipped() -> None:
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2)
    # Token 0: unclipped (1-0)^2 = 1, clipped V=0.2 → 0.04 → max 1. Token 1: both (0-1)^2 = 1.
    assert float(value_loss(values, old, returns, mask, clip=0.2, total_tokens=2.0)) == pytest.approx(0.5)
