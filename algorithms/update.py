"""One policy update from a batch of transitions: the step every LightningRL algorithm shares.

Old log-probabilities are recomputed with the policy before the update (the server's behaviour log-probs
differ by padding and kernels; their distance to the recomputed ones is reported as ``logprob_mismatch``).
Each optimizer step accumulates gradients over micro-batches of transitions, normalized by the token count
of the whole mini-batch, so the micro-batch size changes memory use and not the result.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adapters import Transition
from algorithms.pg_core import policy_loss, token_entropy_sum, value_loss
from algorithms.policy import TokenBatch, TrainablePolicy, token_batch


@dataclass
class Rollouts:
    """Per transition, tensors aligned to its response tokens: ``[N, T]`` (padded, with ``mask``)."""

    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    mask: torch.Tensor

    def select(self, indices: list[int]) -> Rollouts:
        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[indices]

        return Rollouts(self.old_logprobs[indices], pick(self.ref_logprobs), pick(self.values), self.mask[indices])


@dataclass(frozen=True)
class UpdateSettings:
    clip_eps: float
    kl_beta: float
    micro_batch_size: int
    mini_batches: int
    epochs: int
    max_grad_norm: float | None
    value_clip: float = 0.2
    value_coef: float = 0.5
    seed: int = 0


def _chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def _batch(policy: TrainablePolicy, transitions: Sequence[Transition], indices: list[int]) -> TokenBatch:
    return token_batch([(transitions[i].prompt_ids, transitions[i].response_ids) for i in indices], policy.pad_id)


@torch.no_grad()
def measure(policy: TrainablePolicy, transitions: Sequence[Transition], micro_batch_size: int) -> Rollouts:
    """Old (pre-update) log-probs, reference log-probs and values of every transition."""
    policy.model.eval()
    width = max(len(t.response_ids) for t in transitions)
    olds, refs, values, masks = [], [], [], []
    for chunk in _chunks(range(len(transitions)), micro_batch_size):
        batch = _batch(policy, transitions, chunk)
        out = policy.forward(batch)
        olds += list(out.logprobs)
        masks += list(batch.response_mask)
        if out.values is not None:
            values += list(out.values)
        if policy.uses_reference:
            refs += list(policy.forward(batch, reference=True).logprobs)
    return Rollouts(
        old_logprobs=_pad_rows(olds, width),
        ref_logprobs=_pad_rows(refs, width) if refs else None,
        values=_pad_rows(values, width) if values else None,
        mask=_pad_rows(masks, width),
    )


def update(
    policy: TrainablePolicy,
    transitions: Sequence[Transition],
    advantages: torch.Tensor,
    rollouts: Rollouts,
    settings: UpdateSettings,
    returns: torch.Tensor | None = None,
) -> dict[str, float]:
    """Optimize the policy on ``transitions`` with per-token ``advantages`` ``[N, T]`` (and, for PPO, value
    ``returns``); the step's metrics."""
    started = time.perf_counter()
    policy.model.train()
    totals = {"pg": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "entropy": 0.0, "loss": 0.0, "value_loss": 0.0}
    grad_norms = []
    order = list(range(len(transitions)))
    rng = random.Random(settings.seed)
    for _ in range(settings.epochs):
        rng.shuffle(order)
        mini_size = math.ceil(len(order) / settings.mini_batches)
        for mini in _chunks(order, mini_size):
            mini_tokens = float(rollouts.mask[mini].sum())
            policy.optimizer.zero_grad(set_to_none=True)
            for micro in _chunks(mini, settings.micro_batch_size):
                batch = _batch(policy, transitions, micro)
                out = policy.forward(batch)
                width = out.logprobs.shape[1]
                mask = rollouts.mask[micro, :width]
                ref = rollouts.ref_logprobs[micro, :width] if rollouts.ref_logprobs is not None else None
                terms = policy_loss(
                    out.logprobs,
                    rollouts.old_logprobs[micro, :width],
                    advantages[micro, :width],
                    mask,
                    clip_eps=settings.clip_eps,
                    ref_logprobs=ref,
                    kl_beta=settings.kl_beta,
                    total_tokens=mini_tokens,
                )
                loss = terms.loss
                if out.values is not None and returns is not None and rollouts.values is not None:
                    v_loss = value_loss(
                        out.values,
                        rollouts.values[micro, :width],
                        returns[micro, :width],
                        mask,
                        clip=settings.value_clip,
                        total_tokens=mini_tokens,
                    )
                    loss = loss + settings.value_coef * v_loss
                    totals["value_loss"] += v_loss.item() * mini_tokens
                loss.backward()  # type: ignore[no-untyped-call]
                totals["loss"] += loss.item() * mini_tokens
                totals["pg"] += terms.pg_sum
                totals["kl"] += terms.kl_sum
                totals["clipped"] += terms.clipped_tokens
                totals["tokens"] += terms.tokens
                totals["entropy"] += token_entropy_sum(out.logits, mask)
            params = [p for group in policy.optimizer.param_groups for p in group["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm or float("inf"))
            grad_norms.append(float(norm))
            policy.optimizer.step()
    policy.model.eval()
    tokens = max(totals["tokens"], 1.0)
    seconds = time.perf_counter() - started
    metrics = {
        "loss": totals["loss"] / tokens,
        "pg_loss": totals["pg"] / tokens,
        "kl": totals["kl"] / tokens,
        "clip_fraction": totals["clipped"] / tokens,
        "entropy": totals["entropy"] / tokens,
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "update_seconds": seconds,
        "train_tokens_per_second": totals["tokens"] / seconds,
    }
    if returns is not None:
        metrics["value_loss"] = totals["value_loss"] / tokens
    return metrics
