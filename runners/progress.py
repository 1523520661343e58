"""What the runner shows: a live rich display on a terminal, otherwise one JSON line per finished attempt on
stdout; and how the runner and its workers log (on stderr)."""

from __future__ import annotations

import json
import logging
import sys
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lightning_store.logs import quiet_chatty_loggers


class ProgressView:
    """Counts attempts by outcome and averages the rewards their agents returned. ``enabled=None`` shows the live
    display only when stderr is a terminal."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.console = Console(stderr=True)
        self.enabled = self.console.is_terminal if enabled is None else enabled
        self.counts: dict[str, int] = {"running": 0, "succeeded": 0, "failed": 0, "timeout": 0}
        self.reward_sum = 0.0
        self.rewarded = 0
        """Finished attempts whose agent returned a reward (a failed one returned none)."""
        self.started = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        self.started = time.monotonic()
        if self.enabled:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(kind, error, tb)
            self._live = None

    def claimed(self) -> None:
        self.counts["running"] += 1
        self._refresh()

    def finished(self, status: str, *, rollout_id: str, worker_id: str, reward: float | None = None) -> None:
        """An attempt ended with ``status``; ``reward`` is what its agent returned (None: nothing, or it failed)."""
        self.counts["running"] = max(0, self.counts["running"] - 1)
        self.counts[status] = self.counts.get(status, 0) + 1
        if reward is not None:
            self.reward_sum += reward
            self.rewarded += 1
        if not self.enabled:
            record: dict[str, object] = {"event": "attempt_finished", "status": status, "rollout_id": rollout_id}
            record |= {"worker": worker_id, "reward": reward, "done": self.done, "rate_per_s": round(self.rate, 3)}
            if self.reward_mean is not None:
                record["reward_mean"] = round(self.reward_mean, 4)
            # On stdout, bare: a JSON line per attempt that jq reads as it is (the log, with its prefixes, is stderr).
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
        self._refresh()

    @property
    def done(self) -> int:
        return sum(n for status, n in self.counts.items() if status != "running")

    @property
    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started, 1e-9)

    @property
    def reward_mean(self) -> float | None:
        """Mean reward of the finished attempts whose agent returned one; None before the first."""
        return self.reward_sum / self.rewarded if self.rewarded else None

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Table:
        table = Table(title="store run", title_justify="left", show_edge=False)
        for column in ("running", "succeeded", "failed", "timeout", "reward (mean)", "rollouts/s"):
            table.add_column(column, justify="right")
        mean = self.reward_mean
        table.add_row(
            str(self.counts["running"]),
            f"[green]{self.counts['succeeded']}",
            f"[red]{self.counts['failed']}",
            f"[yellow]{self.counts['timeout']}",
            "-" if mean is None else f"{mean:.3f}",
            f"{self.rate:.2f}",
        )
        return table


def configure_logging(level: int = logging.INFO) -> None:
    """The runner's logging: records at ``level`` on stderr, HTTP clients' request lines only at DEBUG."""
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    quiet_chatty_loggers(level)
