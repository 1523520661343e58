"""How the Python API (:class:`algorithms.trainer.Trainer`) shows a run: in Jupyter a line updated in place, on a
terminal the live bar of ``store train``, elsewhere JSON lines on stderr, or nothing.

Why a display of its own in Jupyter: rich's live bar needs ``ipywidgets`` there (without it, a warning and no
bar), and a notebook saved after the run should show where it ended. An IPython display updated in place needs
nothing beyond the kernel, and what it shows last is what the saved notebook keeps.
"""

from __future__ import annotations

import html
import sys
from types import TracebackType
from typing import Any, Protocol

from algorithms.progress import HEADLINE, Summary, TrainingProgress

BAR_WIDTH = 24


class RunDisplay(Protocol):
    """What shows a run as it goes (:class:`~algorithms.progress.TrainingProgress` is one): a context manager
    around the run, told the phase, each step's metrics, and the summary once the run's processes have stopped."""

    def phase(self, text: str) -> None: ...

    def update(self, step: int, metrics: dict[str, float]) -> None: ...

    def summary(self, summary: Summary) -> None: ...

    def __enter__(self) -> RunDisplay: ...

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None: ...


class Silent:
    """The display of ``progress=False``: nothing."""

    def phase(self, text: str) -> None:
        pass

    def update(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def summary(self, summary: Summary) -> None:
        pass

    def __enter__(self) -> Silent:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        pass


def in_jupyter() -> bool:
    """This code runs in a Jupyter kernel (rich's test: an IPython shell of the ZMQ kind)."""
    from rich.console import Console

    return Console().is_jupyter


def default_display(steps: int | None) -> RunDisplay:
    """In Jupyter :class:`NotebookProgress`; on a terminal ``store train``'s live bar on stderr; otherwise (a log
    file) one JSON line per step and the summary's, on stderr: stdout stays the caller's."""
    if in_jupyter():
        return NotebookProgress(steps)
    return TrainingProgress(steps, out=sys.stderr)


class _Text:
    """One display's content: plain text, and the same in a ``<pre>`` for the notebook's HTML view."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"


class NotebookProgress:
    """A line under the cell, rewritten as the run goes: the phase, ``step N/M`` with a text bar and the latest
    headline metrics; then the summary block below it."""

    def __init__(self, steps: int | None) -> None:
        self.steps = steps
        self.step = 0
        self.label = "starting"
        self.latest: dict[str, float] = {}
        self.handle: Any = None

    def line(self) -> str:
        """What the display shows now."""
        if self.steps:
            done = round(BAR_WIDTH * min(self.step, self.steps) / self.steps)
            count = f"[{'#' * done}{'.' * (BAR_WIDTH - done)}] {self.step}/{self.steps}"
        else:
            count = f"step {self.step}"
        metrics = "  ".join(f"{k}={v:.3g}" for k, v in self.latest.items())
        return f"{self.label:<20} {count}  {metrics}".rstrip()

    def _show(self) -> None:
        if self.handle is not None:
            self.handle.update(_Text(self.line()))

    def phase(self, text: str) -> None:
        self.label = text
        self._show()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        self.step = step
        self.latest |= {k: metrics[k] for k in HEADLINE if k in metrics}
        self._show()

    def summary(self, summary: Summary) -> None:
        from IPython import display as ipython_display
        from rich.text import Text

        self.label = "done"
        self._show()
        show: Any = ipython_display.display  # untyped
        show(_Text("\n".join(Text.from_markup(line).plain for line in summary.lines())))

    def __enter__(self) -> NotebookProgress:
        from IPython import display as ipython_display

        show: Any = ipython_display.display  # untyped
        self.handle = show(_Text(self.line()), display_id=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is not None:
            self.label = "interrupted" if issubclass(kind, KeyboardInterrupt) else f"failed: {kind.__name__}"
            self._show()
