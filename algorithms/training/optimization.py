"""How accumulated gradients become optimizer steps: in this process, or data-parallel over several ranks.

:func:`algorithms.training.update.update` drives an :class:`Optimization`: it calls ``backward`` once per micro-batch
and ``step`` once per mini-batch. With ``world`` ranks, each rank trains every ``world``-th transition of a
mini-batch and the gradients are averaged over the ranks at ``step`` (DeepSpeed); the loss is scaled so that
the average is the whole mini-batch's token mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from algorithms.training.policy import TrainablePolicy


class Optimization(Protocol):
    """The optimizer side of one rank of a policy update (``rank`` of ``world``)."""

    rank: int
    world: int

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of ``loss`` (one micro-batch); every rank makes as many calls."""
        ...

    def step(self) -> float:
        """Apply the accumulated gradients (clipped), zero them, and return their norm before clipping."""
        ...

    def reduce(self, totals: dict[str, float]) -> dict[str, float]:
        """``totals`` summed over the ranks (the same result on every rank)."""
        ...


class LocalOptimization:
    """The policy's own optimizer, in this process: ``world`` 1."""

    rank = 0
    world = 1

    def __init__(self, policy: TrainablePolicy, max_grad_norm: float | None) -> None:
        self.optimizer = policy.optimizer
        self.max_grad_norm = max_grad_norm
        self.optimizer.zero_grad(set_to_none=True)  # nothing left over from an update that broke off

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]

    def step(self) -> float:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def reduce(self, totals: dict[str, float]) -> dict[str, float]:
        return totals
