"""The token-level policy-gradient loss that every LightningRL algorithm shares.

Per response token: the clipped importance ratio ``min(ρ·A, clip(ρ, 1-ε, 1+ε)·A)`` with
``ρ = exp(logπ - logπ_old)``, plus ``β·KL(π ‖ π_ref)`` with the k3 estimator ``exp(d) - d - 1`` where
``d = logπ_ref - logπ`` (unbiased, always ≥ 0). The loss is the mean over every response token of the batch
("token-mean"); with micro-batches each one's token sum is divided by the whole batch's token count, so that
the accumulated gradient equals the full batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossTerms:
    """The loss to backpropagate and its detached parts (sums over tokens, so micro-batches add up)."""

    loss: torch.Tensor
    pg_sum: float
    kl_sum: float
    clipped_tokens: float
    tokens: float


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    total_tokens: float,
) -> LossTerms:
    """Token-mean clipped policy loss plus the k3 KL penalty, normalized by ``total_tokens`` (the response
    tokens of the whole batch, not only of this micro-batch). All tensors are ``[batch, tokens]``; ``mask``
    is 1 on response tokens. ``ref_logprobs`` is needed when ``kl_beta > 0``."""
    if kl_beta > 0 and ref_logprobs is None:
        raise ValueError("kl_beta > 0 needs ref_logprobs")
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    pg = -torch.minimum(unclipped, clipped)
    per_token = pg
    kl = torch.zeros_like(pg)
    if ref_logprobs is not None:
        diff = ref_logprobs - logprobs
        kl = torch.exp(diff) - diff - 1.0
        if kl_beta > 0:
            per_token = pg + kl_beta * kl
    loss = (per_token * mask).sum() / total_tokens
    with torch.no_grad():
        was_clipped = (clipped < unclipped).float() * mask  # the clip changed the objective for this token
        return LossTerms(
            loss=loss,
            pg_sum=float((pg * mask).sum()),
            kl_sum=float((kl * mask).sum()),
            clipped_tokens=float(was_clipped.sum()),
            tokens=float(mask.sum()),
        )


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    total_tokens: float,
) -> torch.Tensor:
    """PPO's clipped value loss: ``½·max((V - R)², (V_clipped - R)²)``, token-mean over the whole batch."""
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    loss = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return (loss * mask).sum() / total_tokens


def token_entropy_sum(logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Sum over response tokens of the policy's entropy (nats), for the ``entropy`` metric."""
    with torch.no_grad():
        logp = torch.log_softmax(logits.float(), dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return float((entropy * mask).sum())
