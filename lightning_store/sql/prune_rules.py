"""Retention: delete the spans (or whole rollouts) of finished rollouts older than an age or outside some modes,
in short transactions beside a serving store: the rules, what a prune reports, and the runs that protect rollouts.
The deleter is :class:`lightning_store.sql.pruner.Pruner`, the SQL :mod:`lightning_store.sql.retention`,
``store prune`` (:mod:`lightning_store.cli.prune`) the command; docs/reference/prune.md states the rules.

Rules, in short: only terminal rollouts that ended before the cutoff go, never a training run's own rollout
(unless asked), never what a training run in progress may still read. A batch is a set of whole rollouts, all of
one rollout's rows go in one transaction, and that transaction checks the selection again before it deletes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_store.models import ROLLOUT_MODES

What = Literal["spans", "rollouts"]
MODE_NONE = "none"
"""How ``--keep-mode`` names the rollouts without a mode."""
MODES = (*ROLLOUT_MODES, MODE_NONE)
"""What ``--keep-mode`` takes: a rollout mode, or ``none`` for the rollouts without one."""
GRACE_SECONDS = 60.0
"""A rollout that ended less than this long ago is never pruned: late spans of it may still be on their way."""
DEFAULT_BATCH_ROWS = 1000
DEFAULT_PAUSE = 0.02
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``3600s`` or ``2w``; ``ValueError`` saying what is wrong otherwise."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        raise ValueError(f"{text!r} is not a duration: a number and a unit, s, m, h, d or w (30d, 12h, 90m, 3600s)")
    seconds = float(found.group(1)) * _UNITS[found.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all: give a positive duration")
    return seconds


@dataclass(frozen=True)
class Rules:
    """What to prune: rollouts that ended more than ``older_than`` seconds ago and/or whose mode is not one of
    ``keep_modes`` (both, when both are given); ``what`` they lose; whether training runs' own rollouts count."""

    older_than: float | None = None
    keep_modes: frozenset[str] | None = None
    what: What = "spans"
    include_runs: bool = False

    def __post_init__(self) -> None:
        if self.older_than is None and self.keep_modes is None:
            raise ValueError("give an age (older_than), modes to keep (keep_modes) or both")
        if self.older_than is not None and self.older_than <= 0:
            raise ValueError("older_than must be positive")
        if self.keep_modes is not None:
            unknown = sorted(self.keep_modes - set(MODES))
            if unknown:
                raise ValueError(f"unknown modes {unknown}: keep_modes takes {', '.join(MODES)}")
            if self.keep_modes >= set(MODES):
                raise ValueError(f"keep_modes keeps every mode ({', '.join(MODES)}): nothing would be pruned")

    def cutoff(self, now: float) -> float:
        """Rollouts that ended before this time are old enough (never less than :data:`GRACE_SECONDS` ago)."""
        return now - max(self.older_than or 0.0, GRACE_SECONDS)


@dataclass(frozen=True)
class Run:
    """A training run in progress: its own rollout, ``metadata.training_run`` and the rollout's start."""

    rollout_id: str
    algorithm: str
    start_time: float


@dataclass(frozen=True)
class Runs:
    """The training runs in progress (rollouts with ``metadata.training_run`` that are not terminal)."""

    runs: tuple[Run, ...] = ()

    @property
    def protect_from(self) -> float | None:
        """Rollouts enqueued at or after this time are kept: the earliest start of a run in progress."""
        return min((run.start_time for run in self.runs), default=None)

    @property
    def apo(self) -> bool:
        """An APO run is in progress: every rollout with ``metadata.apo_run`` (its cache) is kept."""
        return any(run.algorithm == "apo" for run in self.runs)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(run.rollout_id for run in self.runs)


@dataclass
class Tally:
    """Rollouts and their rows that went (or would), and the span of their end times."""

    rollouts: int = 0
    attempts: int = 0
    spans: int = 0
    llm_calls: int = 0
    oldest_end_time: float | None = None
    newest_end_time: float | None = None

    def add(self, attempts: int, spans: int, llm_calls: int, end_time: float) -> None:
        self.rollouts += 1
        self.attempts += attempts
        self.spans += spans
        self.llm_calls += llm_calls
        self.oldest_end_time = min(end_time, self.oldest_end_time or end_time)
        self.newest_end_time = max(end_time, self.newest_end_time or end_time)

    def merge(self, other: Tally) -> None:
        self.rollouts += other.rollouts
        self.attempts += other.attempts
        self.spans += other.spans
        self.llm_calls += other.llm_calls
        ends = [t for t in (self.oldest_end_time, other.oldest_end_time) if t is not None]
        self.oldest_end_time = min(ends, default=None)
        ends = [t for t in (self.newest_end_time, other.newest_end_time) if t is not None]
        self.newest_end_time = max(ends, default=None)

    @property
    def rows(self) -> int:
        return self.rollouts + self.attempts + self.spans + self.llm_calls


@dataclass
class Summary:
    """What a prune deleted (or, dry, would delete), by mode (``none``: no mode)."""

    rules: Rules
    dry_run: bool
    runs: Runs = field(default_factory=Runs)
    protected: int = 0
    """Rollouts the rules select that a run in progress keeps (counted by the plan only)."""
    by_mode: dict[str, Tally] = field(default_factory=dict)
    batches: int = 0
    seconds: float = 0.0

    @property
    def total(self) -> Tally:
        total = Tally()
        for tally in self.by_mode.values():
            total.merge(tally)
        return total

    @property
    def rows(self) -> int:
        """The rows counted against ``--batch-size``: spans, or (whole rollouts) every row."""
        total = self.total
        return total.rows if self.rules.what == "rollouts" else total.spans

    def add(self, mode: str, attempts: int, spans: int, llm_calls: int, end_time: float) -> None:
        self.by_mode.setdefault(mode, Tally()).add(attempts, spans, llm_calls, end_time)

    def as_json(self) -> dict[str, Any]:
        def tally(t: Tally) -> dict[str, Any]:
            return {
                "rollouts": t.rollouts,
                "attempts": t.attempts,
                "spans": t.spans,
                "llm_calls": t.llm_calls,
                "oldest_end_time": t.oldest_end_time,
                "newest_end_time": t.newest_end_time,
            }

        return {
            "dry_run": self.dry_run,
            "what": self.rules.what,
            **tally(self.total),
            "by_mode": {mode: tally(self.by_mode[mode]) for mode in sorted(self.by_mode)},
            "runs_in_progress": [
                {"rollout_id": r.rollout_id, "algorithm": r.algorithm, "start_time": r.start_time}
                for r in self.runs.runs
            ],
            "protected_rollouts": self.protected,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
        }
