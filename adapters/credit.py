"""Credit assignment: how an episode's reward is shared among its LLM calls.

Each strategy maps an episode (its final reward and tool calls) to one reward per LLM call, and the return
that the policy gradient uses for that call. The paper's default, *identical*, gives every call the episode
return; *discounted* lets earlier calls count less; *AIR* (Automatic Intermediate Rewarding) mixes in the
status of the tool calls each LLM call led to, so that a sparse final reward is not the only signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from adapters.episodes import Episode


class CreditAssignment(Protocol):
    """A strategy: ``assign(episode, final)`` returns ``(rewards, returns)``, one of each per LLM call."""

    @property
    def name(self) -> str: ...

    def assign(self, episode: Episode, final: float) -> tuple[list[float], list[float]]: ...


@dataclass(frozen=True)
class Identical:
    """Every call's reward and return is the episode's final reward (LightningRL's default)."""

    name: str = "identical"

    def assign(self, episode: Episode, final: float) -> tuple[list[float], list[float]]:
        n = len(episode.calls)
        return [final] * n, [final] * n


@dataclass(frozen=True)
class Discounted:
    """The final reward arrives at the last call; call t's return is ``gamma ** (T - 1 - t) * final``."""

    gamma: float = 0.9
    name: str = "discounted"

    def __post_init__(self) -> None:
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")

    def assign(self, episode: Episode, final: float) -> tuple[list[float], list[float]]:
        n = len(episode.calls)
        rewards = [0.0] * (n - 1) + [final]
        return rewards, _returns(rewards, self.gamma)


@dataclass(frozen=True)
class AIR:
    """Automatic Intermediate Rewarding: ``r_t = alpha * status_t + (1 - alpha) * final`` for a call that led
    to tool calls, where ``status_t`` is the mean over those tool calls of ``weight(tool) * (+1 | -1)`` (success
    or failure); a call that led to no tool call gets ``final``. Each call's return is its own reward: the
    intermediate signal is the point, so it is not washed out by summing later rewards.

    ``weights`` maps a tool name to its weight (``default_weight`` for others); the reference walk-through uses
    e.g. ``{"memory": 0.3, "search": 0.2}``.
    """

    alpha: float = 0.2
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    name: str = "air"

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")

    def assign(self, episode: Episode, final: float) -> tuple[list[float], list[float]]:
        rewards = []
        for index in range(len(episode.calls)):
            tools = episode.tools_after(index)
            if not tools:
                rewards.append(final)
                continue
            status = sum(self.weights.get(t.name, self.default_weight) * (1.0 if t.ok else -1.0) for t in tools)
            rewards.append(self.alpha * status / len(tools) + (1.0 - self.alpha) * final)
        return rewards, list(rewards)


def _returns(rewards: list[float], gamma: float) -> list[float]:
    returns, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


STRATEGIES: dict[str, type[Identical] | type[Discounted] | type[AIR]] = {
    "identical": Identical,
    "discounted": Discounted,
    "air": AIR,
}


def credit_assignment(name: str, **options: object) -> CreditAssignment:
    """A strategy by name (``identical``, ``discounted``, ``air``) with its options (``gamma``, ``alpha``, ...)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown credit assignment {name!r}; choose one of {sorted(STRATEGIES)}")
    strategy: CreditAssignment = STRATEGIES[name](**options)  # type: ignore[arg-type]
    return strategy
