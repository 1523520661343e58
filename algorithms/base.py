"""The algorithm plugin interface and its registry.

An algorithm is a class with a ``name``, a pydantic ``Config`` (documented, validated fields) and an async
``train(session)``. Algorithms are found through the entry-point group ``lightning_store.algorithms``: the
built-ins register there like any third-party package, so a plugin needs no change to this project. Listing
the registry loads no ML library (entry points are read, their classes are imported only when asked for).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from algorithms.session import TrainingSession

GROUP = "lightning_store.algorithms"


class ConfigurationError(ValueError):
    """A run cannot start as configured; raised before any rollout, its message starts with the option at fault
    (``templates: …``, ``--val: …``). ``store train`` prints it as one line and exits 2."""


class AlgorithmConfig(BaseModel):
    """Base of algorithm configs: unknown fields are refused, so a typo in a YAML file is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Algorithm(ABC):
    """A training algorithm: reads rollouts from the store through the session, improves the resources
    (model weights, prompts), and publishes them back."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    needs_policy: ClassVar[bool] = True
    """It trains model weights: ``store train`` needs ``--model``, serves the policy and needs the ``train`` extra.
    False for algorithms that train no weights (APO): no model, no policy server, no torch."""

    def __init__(self, config: AlgorithmConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass a config or options, not both")
        self.config = config if config is not None else self.Config.model_validate(options)
        if not isinstance(self.config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(self.config).__name__}")

    @abstractmethod
    async def train(self, session: TrainingSession) -> dict[str, Any]:
        """Run the training; returns a summary (final metrics)."""

    async def check(self, session: TrainingSession) -> list[str]:
        """What ``store train --dry-run`` asks the algorithm before anything runs: its options against the
        session's tasks and store, read-only (nothing written, no model loaded). Returns what it found, a line
        each; raises :class:`ConfigurationError` naming the option at fault. The default checks nothing."""
        return []


def registered() -> dict[str, EntryPoint]:
    """Every algorithm entry point by name (a later duplicate name does not replace the first)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def load_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``; ``KeyError`` naming the available ones otherwise."""
    entry = registered().get(name)
    if entry is None:
        raise KeyError(f"no algorithm {name!r}; available: {', '.join(sorted(registered())) or 'none'}")
    target = entry.load()
    if not (isinstance(target, type) and issubclass(target, Algorithm)):
        raise TypeError(f"entry point {name!r} ({entry.value}) is not an Algorithm subclass")
    return target
