"""What an algorithm trains with: the store, the tasks, the model, where checkpoints go, how the served
policy is updated, and where metrics are logged.

Metrics are written into the store itself: a training run is a rollout (``metadata.training_run`` names the
algorithm) whose spans ``lightning_store.train.step`` carry one step's metrics as ``metric.<name>``
attributes, so that a run can be analysed with SQL next to the rollouts it produced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout, AttemptStatus
from lightning_store.resources import LLM
from lightning_store.settings import OptimizerSettings, TrainerSettings
from lightning_store.spans import Span

STEP_SPAN = "lightning_store.train.step"

DEFAULT_MAX_STEPS = 10
"""The steps of an RL run whose session bounds none (``max_steps=None``)."""


class ServedPolicy(Protocol):
    """The server that answers the agents' LLM calls with the policy being trained."""

    def llm(self) -> LLM:
        """The LLM resource that points at it (endpoint and model name)."""
        ...

    def load_state(self, state: Mapping[str, Any], version: int) -> None:
        """Serve these weights from now on (called between steps)."""
        ...


@dataclass
class MetricsLog:
    """Step metrics: written as spans of the run's rollout, and passed to ``on_step`` (the progress display)."""

    store: LightningStore
    run: AttemptedRollout
    on_step: Callable[[int, dict[str, float]], None] = lambda step, metrics: None
    on_span: Callable[[str, Mapping[str, Any]], None] = lambda name, attributes: None
    """Told each span written to the run (steps, APO's candidates), once it is stored: the trackers' feed."""
    history: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    async def start(
        cls, store: LightningStore, algorithm: str, config: Mapping[str, Any], run: Mapping[str, Any] | None = None
    ) -> MetricsLog:
        """The run's record: a rollout whose input is the algorithm, its options (``config``) and what else the run
        is (``run``: :attr:`TrainingSession.run_info`), which the dashboard's run page shows."""
        described = {"algorithm": algorithm, "config": dict(config), **({"run": dict(run)} if run else {})}
        rollout = await store.start_rollout(described, metadata={"training_run": algorithm})
        return cls(store, rollout)

    async def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        self.history.append({"step": float(step), **values})
        attributes = {"step": step, **{f"metric.{k}": v for k, v in values.items()}}
        await self.add_span(STEP_SPAN, f"{step:016x}", attributes)
        self.on_step(step, values)

    async def add_span(self, name: str, span_id: str, attributes: Mapping[str, Any]) -> None:
        """A span of the run's rollout. Its id is the caller's, so that writing it again (a resumed run) is an
        ignored duplicate."""
        sequence = await self.store.get_next_span_sequence_id(self.run.rollout_id, self.run.attempt.attempt_id)
        now = time.time()
        await self.store.add_span(
            Span(
                rollout_id=self.run.rollout_id,
                attempt_id=self.run.attempt.attempt_id,
                sequence_id=sequence,
                trace_id=self.run.rollout_id.encode().hex()[:32].ljust(32, "0"),
                span_id=span_id,
                name=name,
                start_time=now,
                end_time=now,
                attributes=dict(attributes),
            )
        )
        self.on_span(name, attributes)

    async def finish(self, *, succeeded: bool) -> None:
        status: AttemptStatus = "succeeded" if succeeded else "failed"
        await self.store.update_attempt(self.run.rollout_id, self.run.attempt.attempt_id, status=status)


@dataclass
class TrainingSession:
    """Everything ``Algorithm.train`` needs. ``output_dir`` receives checkpoints (``step-N``) and is where a
    resumed run continues from; ``max_steps`` bounds the run; ``trainer`` picks the training backend
    (default: the environment's, else the policy update in this process)."""

    store: LightningStore
    train_tasks: Sequence[Any]
    model_dir: Path | None
    """The model being trained (None for algorithms that train no weights, as APO)."""
    output_dir: Path
    policy: ServedPolicy | None
    """The server of the policy being trained (None where ``Algorithm.needs_policy`` is False)."""
    val_tasks: Sequence[Any] = ()
    test_tasks: Sequence[Any] = ()
    """Held-out tasks: an algorithm that reports a test score (APO) evaluates on them at the end, nothing more."""
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    """The optimizer LLM of prompt optimization (APO)."""
    max_steps: int | None = None
    """The bound of the run in the algorithm's own steps (RL: training steps, APO: rounds); None where the user set
    none (``store train`` without ``--steps``): RL then runs :data:`DEFAULT_MAX_STEPS`, an algorithm with a bound of
    its own (APO's budgets) uses that."""
    resume: bool = True
    on_step: Callable[[int, dict[str, float]], None] = lambda step, metrics: None
    on_phase: Callable[[str], None] = lambda text: None
    """Told what the algorithm does next ("evaluating", "collecting step 3", ...): the progress display's label."""
    on_run: Callable[[str, str, Mapping[str, Any]], None] = lambda run_id, algorithm, config: None
    """Told the run's id, algorithm and config once its record is in the store (the trackers start there)."""
    on_span: Callable[[str, Mapping[str, Any]], None] = lambda name, attributes: None
    """Told each span the run writes (:attr:`MetricsLog.on_span`)."""
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    run_info: Mapping[str, Any] = field(default_factory=dict)
    """What the run is beside the algorithm's options (the model, the agent, the runners, the number of tasks),
    as the one that started it knows it (``Trainer``): written into the run's record (:meth:`MetricsLog.start`)."""
    freeze_heap: bool = False
    """The process is the trainer's own: once the models are loaded, what exists is exempted from full garbage
    collections (:func:`lightning_store.aio.freeze_startup_heap`). Off where training shares a process (tests)."""

    def attach(self, log: MetricsLog) -> None:
        """Wire the run's metrics log to this session's listeners (the progress display, the trackers): what an
        algorithm calls once it has its :class:`MetricsLog`."""
        log.on_step = self.on_step
        log.on_span = self.on_span
        task = log.run.input if isinstance(log.run.input, dict) else {}
        config = task.get("config") if isinstance(task.get("config"), dict) else {}
        self.on_run(log.run.rollout_id, str(task.get("algorithm", "")), config or {})
