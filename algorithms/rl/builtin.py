"""The built-in LightningRL algorithms, registered through the ``lightning_store.algorithms`` entry points
like any plugin: GRPO (group-normalized advantages), REINFORCE++ (batch-normalized), PPO (value head + GAE)."""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from adapters import Transition
from algorithms.base import AlgorithmConfig
from algorithms.rl import advantages as estimators
from algorithms.rl.lightning_rl import Estimate, LightningRL, LightningRLConfig
from algorithms.training.update import Rollouts


def _broadcast(values: list[float], rollouts: Rollouts, keep: list[int]) -> torch.Tensor:
    """One advantage per transition, spread over its response tokens (zero on padding)."""
    return torch.tensor(values).unsqueeze(1) * rollouts.mask[keep]


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    tensor = torch.tensor(values)
    return {
        f"{prefix}_mean": float(tensor.mean()),
        f"{prefix}_std": float(tensor.std(unbiased=False)),
        f"{prefix}_min": float(tensor.min()),
        f"{prefix}_max": float(tensor.max()),
    }


class GRPOConfig(LightningRLConfig):
    scale_by_std: bool = Field(True, description="Divide by the group's standard deviation (False: Dr. GRPO).")


class GRPO(LightningRL):
    name = "grpo"
    summary = "GRPO: advantages normalized within each task's group of rollouts; flat groups dropped."
    Config: ClassVar[type[AlgorithmConfig]] = GRPOConfig
    config: GRPOConfig

    def flat(self, transitions: list[Transition]) -> dict[str, float] | None:
        """Every group's returns equal: GRPO would drop them all."""
        result = estimators.grpo(
            [t.return_ for t in transitions], [t.group for t in transitions], scale=self.config.scale_by_std
        )
        if any(v is not None for v in result.values):
            return None
        return {
            "groups": float(result.groups),
            "dropped_groups": float(result.dropped_groups),
            "trained_transitions": 0.0,
        }

    def advantages(self, transitions: list[Transition], rollouts: Rollouts) -> Estimate:
        result = estimators.grpo(
            [t.return_ for t in transitions], [t.group for t in transitions], scale=self.config.scale_by_std
        )
        keep = [i for i, v in enumerate(result.values) if v is not None]
        kept = [v for v in result.values if v is not None]
        metrics = {"groups": float(result.groups), "dropped_groups": float(result.dropped_groups)}
        return Estimate(keep, _broadcast(kept, rollouts, keep), metrics=metrics | _stats("advantage", kept))


class ReinforcePP(LightningRL):
    name = "reinforce_pp"
    summary = "REINFORCE++: advantages normalized over the whole batch (no critic, no groups)."

    def advantages(self, transitions: list[Transition], rollouts: Rollouts) -> Estimate:
        values = [v or 0.0 for v in estimators.reinforce_pp([t.return_ for t in transitions]).values]
        keep = list(range(len(transitions)))
        return Estimate(keep, _broadcast(values, rollouts, keep), metrics=_stats("advantage", values))


class PPOConfig(LightningRLConfig):
    gae_gamma: float = Field(1.0, gt=0, le=1, description="Discount over response tokens in GAE.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE λ.")
    value_clip: float = Field(0.2, gt=0, description="Clip range of the value update.")
    value_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    normalize_advantages: bool = Field(True, description="Whiten advantages over the batch's response tokens.")


class PPO(LightningRL):
    name = "ppo"
    summary = "PPO: a value head on the policy and GAE over response tokens."
    Config: ClassVar[type[AlgorithmConfig]] = PPOConfig
    config: PPOConfig
    value_head = True

    def advantages(self, transitions: list[Transition], rollouts: Rollouts) -> Estimate:
        if rollouts.values is None:
            raise RuntimeError("PPO needs the policy's value head")
        mask = rollouts.mask
        rewards = torch.zeros_like(mask)
        lengths = mask.sum(1).long()
        for i, transition in enumerate(transitions):
            if lengths[i] > 0:
                rewards[i, lengths[i] - 1] = transition.return_  # the call's return arrives at its last token
        per_token = estimators.gae(
            rewards, rollouts.values, mask, gamma=self.config.gae_gamma, lam=self.config.gae_lambda
        )
        returns = per_token + rollouts.values
        if self.config.normalize_advantages and mask.sum() > 1:
            real = per_token[mask.bool()]
            per_token = (per_token - real.mean()) / (real.std() + estimators.EPSILON) * mask
        keep = list(range(len(transitions)))
        metrics = _stats("advantage", per_token[mask.bool()].tolist()) | _stats(
            "value", rollouts.values[mask.bool()].tolist()
        )
        return Estimate(keep, per_token, returns=returns, metrics=metrics)

    def update_options(self) -> dict[str, float]:
        return {"value_clip": self.config.value_clip, "value_coef": self.config.value_coef}
