"""What ``store train`` shows, and where.

When stdout is not a terminal, it carries one JSON line per step (``{"event": "step", "step": N, ...}``) and one
closing line (``{"event": "summary", ...}``), and nothing else: whatever else prints (libraries, log records) goes
to stderr. On a terminal (stdout's, else stderr's): a live progress bar labelled with what the run is doing
("evaluating", "collecting step 3", ...) and the latest headline metrics, then a short summary block.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lightning_store.logs import LogLevel, quiet_chatty_loggers

HEADLINE = ("reward_mean", "val_reward", "kl", "entropy", "loss", "step_seconds")
"""The metrics the live bar shows (the last value of each; every metric is in the JSON lines and the store)."""


class _CurrentStderr(logging.Handler):
    """Writes each record to whatever ``sys.stderr`` is at the time: under the live display that is rich's proxy,
    which prints the record above the bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def configure_logging(level: LogLevel) -> None:
    """Log records at ``level`` on stderr. Below DEBUG, the per-request lines of HTTP clients are left out, and so
    are the progress bars of transformers and huggingface_hub (and, through the environment, those of the
    subprocesses: DeepSpeed ranks, vLLM)."""
    root = logging.getLogger()
    root.handlers[:] = [_CurrentStderr()]
    root.handlers[0].setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.setLevel(level.number)
    debug = level is LogLevel.debug
    quiet_chatty_loggers(level.number)
    if not debug:
        for variable in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(variable, "1")


def quiet_transformers(level: LogLevel) -> None:
    """transformers' own switches (its logging is not Python's root logger): bars off below DEBUG, and its log
    records at ``level`` (it reads the environment only once, on import)."""
    from transformers.utils import logging as transformers_logging

    hf_logging: Any = transformers_logging  # its switches are untyped
    if level is LogLevel.debug:
        hf_logging.set_verbosity_info()
        hf_logging.enable_progress_bar()
    else:
        hf_logging.set_verbosity(max(level.number, logging.WARNING))
        hf_logging.disable_progress_bar()


@contextlib.contextmanager
def stdout_for_results() -> Iterator[TextIO]:
    """Yields the real stdout and points ``sys.stdout`` at stderr meanwhile, so that stdout carries the results
    (the JSON lines) and nothing a library prints."""
    real = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield real


@dataclass
class Summary:
    """What a finished ``store train`` reports: what ran, the validation reward before and after, and where its
    results are."""

    algorithm: str
    steps_run: int
    last_step: int
    wall_seconds: float
    output: Path
    checkpoint: Path | None
    logs: list[Path]
    store: str
    val_reward: dict[str, float] = field(default_factory=dict)
    """``first``, ``last`` (and their steps ``first_step``, ``last_step``), when the run had validation tasks."""
    untrained_steps: int = 0
    """Steps that trained nothing (metric ``untrained``: no reward variance, or no transitions)."""
    history: list[dict[str, float]] = field(default_factory=list, repr=False)
    """Every step's metrics as logged (``step`` and the metrics of docs/reference/metrics.md): what the store's
    ``training_steps_v`` holds for this run (not in :meth:`record`, the JSON line)."""

    @classmethod
    def of(
        cls,
        history: Sequence[dict[str, float]],
        *,
        algorithm: str,
        wall_seconds: float,
        output: Path,
        checkpoint: Path | None,
        logs: list[Path],
        store: str,
    ) -> Summary:
        """The summary of a run whose metrics (one dict per step, with its ``step``) are ``history``."""
        # The evaluation alone has no step_seconds (RL); APO's rounds carry round_seconds, its round 0 (the seed's
        # validation) included.
        trained = [e for e in history if "step_seconds" in e or ("round_seconds" in e and e["step"] > 0)]
        evaluated = [entry for entry in history if "val_reward" in entry]
        val_reward: dict[str, float] = {}
        if evaluated:
            first, last = evaluated[0], evaluated[-1]
            val_reward = {"first": first["val_reward"], "first_step": int(first["step"])}
            val_reward |= {"last": last["val_reward"], "last_step": int(last["step"])}
        return cls(
            algorithm=algorithm,
            steps_run=len(trained),
            last_step=int(history[-1]["step"]) if history else 0,
            wall_seconds=round(wall_seconds, 1),
            output=output,
            checkpoint=checkpoint,
            logs=logs,
            store=store,
            val_reward=val_reward,
            untrained_steps=sum(1 for entry in trained if entry.get("untrained")),
            history=[dict(entry) for entry in history],
        )

    def record(self) -> dict[str, Any]:
        """The JSON line's fields."""
        record: dict[str, Any] = {"event": "summary", "algorithm": self.algorithm, "steps_run": self.steps_run}
        record |= {"last_step": self.last_step, "wall_seconds": self.wall_seconds}
        if self.val_reward:
            record["val_reward"] = self.val_reward
        record["untrained_steps"] = self.untrained_steps
        record |= {"output": str(self.output), "checkpoint": str(self.checkpoint) if self.checkpoint else None}
        return record | {"logs": [str(log) for log in self.logs], "store": self.store}

    def lines(self) -> list[str]:
        """The block a terminal shows."""
        minutes, seconds = divmod(int(self.wall_seconds), 60)
        took = f"{minutes} min {seconds} s" if minutes else f"{self.wall_seconds:.1f} s"
        steps = f"{self.steps_run} step{'' if self.steps_run == 1 else 's'}"
        lines = [f"[bold]{self.algorithm}[/bold]: {steps} in {took} (now at step {self.last_step})"]
        if self.val_reward:
            v = self.val_reward
            lines.append(
                f"  val_reward  {v['first']:.3f} at step {v['first_step']:.0f} → [bold]{v['last']:.3f}[/bold]"
                f" at step {v['last_step']:.0f}"
            )
        if self.untrained_steps:
            lines.append(
                f"  [yellow]untrained   {self.untrained_steps} of {self.steps_run} steps trained nothing (no reward "
                "variance or no transitions; see the log)[/yellow]"
            )
        # Paths and URLs are the user's: escaped, so that "[…]" in them is shown, not read as markup.
        if self.checkpoint is not None:
            lines.append(f"  checkpoint  {escape(str(self.checkpoint))}")
        if self.logs:
            lines.append(f"  logs        {escape(', '.join(str(log) for log in self.logs))}")
        lines.append(f"  store       {escape(str(self.store))}")
        return lines


class TrainingProgress:
    """``phase(text)`` as the run moves on, ``update(step, metrics)`` after each step, ``summary(...)`` at the
    end; a context manager around the run. ``out`` receives the results (default: ``sys.stdout``): JSON lines
    unless it is a terminal (``json_lines``). ``live`` (default: ``out`` or stderr is a terminal) shows the bar and
    the summary block, on stderr when that is a terminal, else on ``out``. ``steps`` is the bar's total; None where
    the run's length is the algorithm's to decide (APO without ``--steps``): the bar counts steps without a total."""

    def __init__(
        self,
        steps: int | None,
        *,
        out: TextIO | None = None,
        live: bool | None = None,
        json_lines: bool | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.json_lines = not self.out.isatty() if json_lines is None else json_lines
        self.live = (self.out.isatty() or sys.stderr.isatty()) if live is None else live
        self.console = Console(file=sys.stderr if sys.stderr.isatty() else self.out, highlight=False)
        self.latest: dict[str, float] = {}
        self.progress = Progress(
            TextColumn("[bold]{task.description:<20}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=self.console,
        )
        self.task = self.progress.add_task("starting", total=steps, metrics="")

    def phase(self, text: str) -> None:
        """What the run is doing now (the bar's label)."""
        if self.live:
            self.progress.update(self.task, description=text)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step`` is done with these metrics."""
        if self.json_lines:
            print(json.dumps({"event": "step", "step": step, **metrics}), file=self.out, flush=True)
        if not self.live:
            return
        self.latest |= {k: metrics[k] for k in HEADLINE if k in metrics}
        text = "  ".join(f"{k}={v:.3g}" for k, v in self.latest.items())
        self.progress.update(self.task, completed=step, metrics=text)

    def summary(self, summary: Summary) -> None:
        """The closing summary: one JSON line, and a block on a terminal (after the bar has stopped)."""
        if self.json_lines:
            print(json.dumps(summary.record()), file=self.out, flush=True)
        if self.live:
            for line in summary.lines():
                self.console.print(line)

    def __enter__(self) -> TrainingProgress:
        if self.live:
            self.progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.live:
            self.progress.stop()
