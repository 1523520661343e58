"""Experiment trackers: a training run's config, step metrics and (APO) candidates mirrored to TensorBoard, MLflow
and Weights & Biases (``store train --report-to tensorboard,mlflow,wandb``).

The store stays the record of truth (``training_steps_v``, ``prompt_candidates_v``); a tracker is a mirror for
people who look at runs there. So a tracker never stops training: one that cannot be imported or fails while
logging prints one warning (naming it and why) and is dropped for the rest of the run. Each is an optional
dependency, imported only when asked for:

- ``tensorboard``: event files under ``OUTPUT/tensorboard/RUN_ID`` (the ``tensorboard`` package's writer, no
  TensorFlow or torch): each metric a scalar named as in docs/reference/metrics.md, the config and each
  candidate as text;
- ``mlflow``: a run in the experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``lightning-store``) of
  ``$MLFLOW_TRACKING_URI``, by default MLflow's own local store ``./mlflow.db`` (artifacts in ``./mlruns``): the
  config as params (flattened, ``model.lr``), metrics per step, each candidate's
  validation score as ``apo.candidate_val_score`` (step: its ordinal) and all candidates in
  ``apo/candidates.json`` (``{"candidates": [...]}``);
- ``wandb``: a run of the project ``$WANDB_PROJECT`` (default ``lightning-store``) under ``OUTPUT/wandb``,
  offline unless the user set ``WANDB_MODE`` or has an API key (``WANDB_API_KEY``): config, metrics per step
  and the candidates as a table.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")
CANDIDATE_SPAN = "lightning_store.apo.candidate"
"""The span APO writes for each candidate (``algorithms.apo.context``; not imported: this module serves every
algorithm)."""
PROJECT = "lightning-store"
INSTALL = "pip install 'lightning-store[trackers]'"
"""The MLflow experiment and the W&B project a run goes to unless the user names another."""


class Tracker(Protocol):
    """One tracker's side of a run. Any method may raise: :class:`Trackers` turns that into one warning."""

    def start(self, run_id: str, algorithm: str, config: Mapping[str, Any]) -> None: ...

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_candidate(self, candidate: Mapping[str, Any]) -> None: ...

    def finish(self, *, succeeded: bool) -> None: ...


class Trackers:
    """The trackers of a run, each dropped (with one warning) the first time it fails."""

    def __init__(self, names: list[str], output: Path) -> None:
        self.active: dict[str, Tracker] = {}
        for name in names:
            try:
                self.active[name] = _make(name, output)
            except ImportError:
                logger.warning("%s is not installed: not reporting to it (%s)", name, INSTALL)
            except Exception as exc:
                logger.warning("%s: not reporting to it (%s: %s)", name, type(exc).__name__, exc)

    def start(self, run_id: str, algorithm: str, config: Mapping[str, Any]) -> None:
        for name, tracker in list(self.active.items()):
            self._call(name, lambda t=tracker: t.start(run_id, algorithm, config))  # type: ignore[misc]

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, tracker in list(self.active.items()):
            self._call(name, lambda t=tracker: t.log_step(step, metrics))  # type: ignore[misc]

    def log_candidate(self, candidate: Mapping[str, Any]) -> None:
        for name, tracker in list(self.active.items()):
            self._call(name, lambda t=tracker: t.log_candidate(candidate))  # type: ignore[misc]

    def on_span(self, name: str, attributes: Mapping[str, Any]) -> None:
        """A span the run wrote: APO's candidates are mirrored (the steps arrive through :meth:`log_step`)."""
        if name == CANDIDATE_SPAN:
            self.log_candidate(attributes)

    def finish(self, *, succeeded: bool) -> None:
        for name, tracker in list(self.active.items()):
            self._call(name, lambda t=tracker: t.finish(succeeded=succeeded))  # type: ignore[misc]
        self.active.clear()

    def _call(self, name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # a mirror: whatever it raises, training goes on
            logger.warning("%s: not reporting to it any more (%s: %s)", name, type(exc).__name__, exc)
            self.active.pop(name, None)


def parse_report_to(value: str | list[str] | None) -> list[str]:
    """``tensorboard,mlflow`` (or a list, from a config file) as tracker names; an unknown one is a ValueError."""
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = [n.strip().lower() for n in names if n.strip() and n.strip().lower() != "none"]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"unknown tracker {unknown[0]!r}: choose from {', '.join(TRACKERS)}")
    return list(dict.fromkeys(names))


def _make(name: str, output: Path) -> Tracker:
    if name == "tensorboard":
        return TensorBoardTracker(output / "tensorboard")
    if name == "mlflow":
        return MlflowTracker()
    return WandbTracker(output)


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested options as ``a.b`` keys (what MLflow's params and TensorBoard's text show best)."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


class TensorBoardTracker:
    """Event files written with the ``tensorboard`` package's own writer (no TensorFlow, no torch)."""

    def __init__(self, directory: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb as text_summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary, self._text = event_pb2.Event, summary_pb2.Summary, text_summary
        self._writer_class = EventFileWriter
        self.directory = directory
        self._writer: Any = None

    def start(self, run_id: str, algorithm: str, config: Mapping[str, Any]) -> None:
        self._writer = self._writer_class(str(self.directory / run_id))
        rows = "\n".join(f"| {key} | {json.dumps(value)} |" for key, value in flatten(config))
        self._add(0, self._text("config", f"algorithm: {algorithm}\n\n| option | value |\n| --- | --- |\n{rows}"))

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=name, simple_value=value) for name, value in metrics.items()]
        self._add(step, self._summary(value=values))

    def log_candidate(self, candidate: Mapping[str, Any]) -> None:
        ordinal = int(candidate.get("apo.candidate", 0))
        self._add(ordinal, self._text("apo/candidate", json.dumps(dict(candidate), indent=2)))
        if "apo.val_score" in candidate:
            value = self._summary.Value(tag="apo/candidate_val_score", simple_value=float(candidate["apo.val_score"]))
            self._add(ordinal, self._summary(value=[value]))

    def finish(self, *, succeeded: bool) -> None:
        if self._writer is not None:
            self._writer.close()

    def _add(self, step: int, summary: Any) -> None:
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()  # a mirror people watch while the run goes on


class MlflowTracker:
    """A run of MLflow's tracking client, at the tracking URI MLflow itself would use."""

    def __init__(self) -> None:
        import mlflow

        # MLflow logs its store's migrations at INFO on import and first use: below --log-level debug, not shown.
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            logging.getLogger("mlflow").setLevel(logging.WARNING)
            logging.getLogger("alembic").setLevel(logging.WARNING)

        # MLflow's own default: $MLFLOW_TRACKING_URI, else ./mlflow.db (SQLite; MLflow 3 keeps the ./mlruns file
        # store in maintenance mode and refuses new runs there unless MLFLOW_ALLOW_FILE_STORE=true).
        self.client = mlflow.MlflowClient(tracking_uri=mlflow.get_tracking_uri())
        self.run_id = ""
        self.candidates: list[dict[str, Any]] = []

    def start(self, run_id: str, algorithm: str, config: Mapping[str, Any]) -> None:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        tags = {"lightning_store.run_id": run_id, "lightning_store.algorithm": algorithm}
        self.run_id = self.client.create_run(experiment, run_name=f"{algorithm}-{run_id}", tags=tags).info.run_id
        for key, value in flatten(config):
            self.client.log_param(self.run_id, key, json.dumps(value) if not isinstance(value, str) else value)

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.client.log_metric(self.run_id, name, value, step=step)

    def log_candidate(self, candidate: Mapping[str, Any]) -> None:
        self.candidates.append(dict(candidate))
        if "apo.val_score" in candidate:
            ordinal = int(candidate.get("apo.candidate", 0))
            score = float(candidate["apo.val_score"])
            self.client.log_metric(self.run_id, "apo.candidate_val_score", score, step=ordinal)
        self.client.log_dict(self.run_id, {"candidates": self.candidates}, "apo/candidates.json")

    def finish(self, *, succeeded: bool) -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, "FINISHED" if succeeded else "FAILED")


class WandbTracker:
    """A ``wandb`` run, offline unless the user chose otherwise (``WANDB_MODE``, or an API key)."""

    def __init__(self, output: Path) -> None:
        import wandb

        self.wandb = wandb
        self.output = output
        self.run: Any = None
        self.candidates: list[dict[str, Any]] = []

    def start(self, run_id: str, algorithm: str, config: Mapping[str, Any]) -> None:
        online = bool(os.environ.get("WANDB_API_KEY"))
        mode: Any = os.environ.get("WANDB_MODE") or ("online" if online else "offline")
        self.output.mkdir(parents=True, exist_ok=True)
        self.run = self.wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=f"{algorithm}-{run_id}",
            config={"algorithm": algorithm, **dict(config)},
            dir=str(self.output),
            mode=mode,
            reinit="create_new",
            settings=self.wandb.Settings(silent=True, console="off"),  # no banner in the terminal store train draws in
        )

    def log_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_candidate(self, candidate: Mapping[str, Any]) -> None:
        self.candidates.append(dict(candidate))
        columns: list[str | int] = sorted({key for row in self.candidates for key in row})
        data = [[row.get(str(c)) for c in columns] for row in self.candidates]
        table = self.wandb.Table(columns=columns, data=data)
        self.run.log({"apo/candidates": table}, commit=False)

    def finish(self, *, succeeded: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if succeeded else 1)
