"""Advantage estimators of LightningRL: the one place where GRPO, REINFORCE++ and PPO differ.

GRPO and REINFORCE++ give each transition one scalar advantage (broadcast over its response tokens) from the
returns that credit assignment produced; PPO estimates a per-token advantage with GAE from a learned value.
Statistics are over transitions: in LightningRL a task's group is the set of transitions of its rollouts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

EPSILON = 1e-6
"""Added to a standard deviation before dividing by it."""


@dataclass
class ScalarAdvantages:
    """One advantage per transition; ``None`` marks a transition dropped because its group carried no signal
    (all returns equal). ``dropped_groups`` counts those groups."""

    values: list[float | None]
    dropped_groups: int = 0
    groups: int = 0


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def grpo(returns: Sequence[float], groups: Sequence[str], *, scale: bool = True) -> ScalarAdvantages:
    """Group-relative advantages: ``(R - mean_g) / (std_g + eps)`` within each group (``scale=False`` keeps
    ``R - mean_g``, as Dr. GRPO suggests). A group whose returns are all equal teaches nothing and is dropped.
    """
    if len(returns) != len(groups):
        raise ValueError("returns and groups must have the same length")
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    values: list[float | None] = [None] * len(returns)
    dropped = 0
    for indices in members.values():
        mean, std = _mean_std([returns[i] for i in indices])
        if std < EPSILON:
            dropped += 1
            continue
        for i in indices:
            values[i] = (returns[i] - mean) / (std + EPSILON) if scale else returns[i] - mean
    return ScalarAdvantages(values, dropped_groups=dropped, groups=len(members))


def reinforce_pp(returns: Sequence[float]) -> ScalarAdvantages:
    """REINFORCE++: the batch mean as baseline and the batch standard deviation as scale. A batch whose returns
    are all equal gives zero advantages (nothing is dropped: there is no group to drop)."""
    if not returns:
        return ScalarAdvantages([])
    mean, std = _mean_std(returns)
    return ScalarAdvantages([(r - mean) / (std + EPSILON) for r in returns], groups=1)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float, lam: float) -> torch.Tensor:
    """Generalized advantage estimation over response tokens (PPO).

    ``rewards``, ``values`` and ``mask`` are ``[batch, tokens]``; ``mask`` is 1 on response tokens (a
    contiguous prefix per row). The value after the last response token is 0 (each transition is its own
    episode; the credit assignment already put the episode's return into ``rewards``).
    """
    import torch

    advantages = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    next_value = torch.zeros_like(running)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m
        advantages[:, t] = running
        next_value = values[:, t] * m
    return advantages
