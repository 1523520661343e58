"""Training progress: a rich progress bar with the latest step's headline metrics on a terminal, one JSON
line per step otherwise (for logs and CI)."""

from __future__ import annotations

import json
import sys
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

HEADLINE = ("reward_mean", "val_reward", "kl", "clip_fraction", "entropy", "loss", "step_seconds")


class TrainingProgress:
    """``update(step, metrics)`` after each step; a context manager around the run."""

    def __init__(self, steps: int, *, enabled: bool | None = None) -> None:
        self.console = Console(stderr=True)
        self.live = sys.stderr.isatty() if enabled is None else enabled
        self.progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
        )
        self.task = self.progress.add_task("train", total=steps, metrics="")

    def update(self, step: int, metrics: dict[str, float]) -> None:
        shown = {k: round(metrics[k], 4) for k in HEADLINE if k in metrics}
        if self.live:
            text = "  ".join(f"{k}={v}" for k, v in shown.items())
            self.progress.update(self.task, completed=step, metrics=text)
        else:
            print(json.dumps({"event": "step", "step": step, **metrics}), file=sys.stderr, flush=True)

    def __enter__(self) -> TrainingProgress:
        if self.live:
            self.progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.live:
            self.progress.stop()
