"""The whole training loop from Python, for notebooks and scripts: ``Trainer(...).fit(agent, train=..., val=...)``.
(Just past 400 lines: the argument checks that must all run before anything starts live with ``fit``.)

One call starts (or attaches to) the store, starts the policy server (for an algorithm that trains weights), the
runner processes and the trainer, waits for the run, stops what it started and returns the run's
:class:`~algorithms.progress.Summary`. ``store train`` is this class behind command-line options.

    from algorithms import GRPO, Trainer

    trainer = Trainer(GRPO(group_size=8), model="flight-model", runners=2, output="runs/flight")
    summary = trainer.fit("examples.flight.agent:flight_agent", train=train_df, val=val_df)

Why the agent is a name (``module:attribute``) or an object of an importable module: the runners are processes of
their own (``store run``) that import it, as a deployment's runners would. An agent defined in a notebook's cell or
a script's ``__main__`` cannot be imported by them: :class:`ConfigurationError` says so before anything starts.

Errors: :class:`ConfigurationError` (a ``ValueError``) before anything starts, its message opening with the
argument at fault; :class:`~algorithms.local_stack.ProcessExited` when the runners stop (an agent that does not
import), :class:`~algorithms.local_stack.ProcessFailed` when the store does not start,
``lightning_store.errors.UnauthorizedError`` when a ``store`` server wants a ``token``. On any exception,
KeyboardInterrupt included (a notebook kernel's interrupt), every process the call started is stopped before the
exception leaves ``fit``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from algorithms.base import Algorithm, ConfigurationError
from algorithms.progress import Summary
from algorithms.run_display import RunDisplay, Silent, default_display
from algorithms.trackers import Trackers, parse_report_to
from lightning_store import aio, task_sources
from lightning_store.logs import LogLevel
from lightning_store.settings import (
    OptimizerSettings,
    PolicyServerSettings,
    TrainerSettings,
    load_optimizer_settings,
    load_policy_server_settings,
    load_trainer_settings,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from algorithms.dry_run import DryRun
    from algorithms.session import ServedPolicy, TrainingSession
    from lightning_store.contract import LightningStore

logger = logging.getLogger(__name__)


def agent_name(agent: object) -> str:
    """``agent`` as the ``module:attribute`` the runner processes import: a string as it is; else the module-level
    name that holds the object, looked up in the modules it says it comes from (its own ``__module__``, or that of
    the function it wraps: an ``@rollout`` agent, an Agent Lightning ``LitAgent``), else a function's or class's
    qualified name. ConfigurationError for an object they cannot import (a notebook cell's, a local function)."""
    if isinstance(agent, str):
        return agent
    wrapped = [agent, *(getattr(agent, field, None) for field in ("__wrapped__", "fn", "func"))]
    homes = [getattr(each, "__module__", None) for each in wrapped if each is not None] + [type(agent).__module__]
    for home in dict.fromkeys(h for h in homes if isinstance(h, str)):
        module = sys.modules.get(home)
        for attribute, value in vars(module).items() if module is not None else ():
            if value is agent and home != "__main__":
                return f"{home}:{attribute}"
    module, name = getattr(agent, "__module__", None), getattr(agent, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str) and module != "__main__" and "<locals>" not in name:
        return f"{module}:{name}"
    local = isinstance(name, str) and "<locals>" in name
    where = "in a function" if local else "in a notebook cell or a script's __main__, or not at a module's top level"
    raise ConfigurationError(
        f"agent: {name or type(agent).__name__} is defined {where}, which the runner processes cannot import: put "
        "it at the top level of a module (a .py file beside the notebook) and pass it, or 'module:attribute'"
    )


def backend_problem(serving: PolicyServerSettings, training: TrainerSettings) -> tuple[str, str] | None:
    """What keeps these serving and training settings from running here, as (the setting, why); None if nothing."""
    if training.trainer == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "trainer", "the deepspeed trainer needs DeepSpeed: pip install 'lightning-store[deepspeed]'"
    if serving.policy_server == "vllm" and not serving.vllm_python:
        return "vllm_python", "vLLM needs the interpreter of its virtualenv (or LIGHTNING_STORE_VLLM_PYTHON)"
    return None


def tasks(data: Any, what: str) -> list[Any]:
    """``data`` as tasks (:func:`lightning_store.task_sources.tasks_of`); an empty ``val``/``test`` is no tasks."""
    if data is None:
        return []
    try:
        return task_sources.tasks_of(data, what=what)
    except task_sources.TaskSourceError as error:
        message = str(error)
        raise ConfigurationError(message if message.startswith(f"{what}:") else f"{what}: {message}") from None


@dataclass
class Trainer:
    """A training run on this machine. Every argument but ``algorithm`` has the default ``store train`` has.

    ``model``: the model directory (transformers format), for an algorithm that trains weights. ``store``: a store
    server's URL to attach to (with ``token``); None serves one on SQLite in ``output``. ``runners``: runner worker
    processes (``store run``), each running ``concurrency`` attempts at once; 0 leaves the rollouts to runners of
    your own against ``store``. ``steps``: the run's bound (RL default 10; APO: its own budget). ``report_to``:
    trackers to mirror the run to (``"tensorboard,mlflow"`` or a list). ``serving``, ``training``, ``optimizer``:
    the policy server's, the trainer backend's and APO's optimizer LLM's settings (default: from the
    environment, ``LIGHTNING_STORE_*``). ``progress``: True for the default display (:func:`default_display`),
    False for none, or a function of the step bound that returns a :class:`RunDisplay`. ``log_level``: what the
    processes it starts write to their logs in ``output``. ``freeze_heap``: the process only trains (``store
    train``): the startup heap is frozen (:func:`lightning_store.aio.freeze_startup_heap`)."""

    algorithm: Algorithm
    model: str | Path | None = None
    store: str | None = None
    token: str | None = None
    runners: int = 4
    concurrency: int = 1
    output: str | Path = "runs/latest"
    steps: int | None = None
    resume: bool = True
    report_to: str | Sequence[str] | None = None
    serving: PolicyServerSettings | None = None
    training: TrainerSettings | None = None
    optimizer: OptimizerSettings | None = None
    progress: bool | Callable[[int | None], RunDisplay] = True
    log_level: LogLevel | str = LogLevel.info
    freeze_heap: bool = False

    def fit(self, agent: object = None, train: Any = None, val: Any = None, test: Any = None) -> Summary:
        """Train ``agent`` on ``train`` (validating on ``val``; APO scores ``test`` at the end) and return the
        run's summary. ``agent``: ``"module:attribute"`` or the object itself (None with ``runners=0``). The
        tasks: a list of dicts (any JSON values), a pandas DataFrame, a Hugging Face ``Dataset``, or a path (JSON
        Lines, Parquet, CSV, a saved dataset, ``hf:NAME[:SPLIT]``)."""
        plan = self.plan(agent, train, val, test)
        began = time.monotonic()
        display = self._display(plan.steps)
        output = Path(self.output)
        output.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            stack.enter_context(display)
            history = self._run(stack, display, plan, output)
            display.phase("stopping")
            # The policy server, the runners and the store stop, and the live display ends, before the summary.
        summary = Summary.of(
            history,
            algorithm=self.algorithm.name,
            wall_seconds=time.monotonic() - began,
            output=output,
            checkpoint=newest_checkpoint(output) if self.algorithm.needs_policy else None,
            logs=run_logs(output),
            store=str(output / "store.db") if self.store is None else self.store,
        )
        display.summary(summary)
        return summary

    def dry_run(self, agent: object = None, train: Any = None, val: Any = None, test: Any = None) -> DryRun:
        """What :meth:`fit` would start with these arguments, and every check that can be made without starting
        it (:mod:`algorithms.dry_run`): the options, the model, the agent, the store, the algorithm's own, the
        trackers. Nothing is started or written; ``.ok`` is False when a check failed."""
        from algorithms.dry_run import dry_run

        return dry_run(self, agent, train, val, test)

    def plan(self, agent: object, train: Any, val: Any, test: Any) -> Plan:
        """The run :meth:`fit` would start, with everything checked that needs no process, file or network (the
        tasks read, the settings resolved); ConfigurationError naming the argument otherwise."""
        if self.runners < 0 or self.concurrency < 1:
            raise ConfigurationError("runners: 0 or more, with a concurrency of 1 or more")
        if self.runners == 0 and self.store is None:
            raise ConfigurationError("store: with runners=0 your own runners run the rollouts: give their store's URL")
        name = None
        if self.runners > 0:
            if agent is None:
                raise ConfigurationError("agent: give the agent (or runners=0 and runners of your own)")
            name = agent_name(agent)
        if train is None:
            raise ConfigurationError("train: give the training tasks")
        try:
            trackers = parse_report_to(
                self.report_to if self.report_to is None or isinstance(self.report_to, str) else list(self.report_to)
            )
        except ValueError as error:
            raise ConfigurationError(f"report_to: {error}") from None
        model = Path(self.model) if self.model is not None else None
        serving = training = None
        steps = self.steps
        if self.algorithm.needs_policy:
            if model is None or not model.is_dir():
                raise ConfigurationError(
                    f"model: {self.algorithm.name} trains a model: give its directory (transformers format)"
                    + (f"; {model} is not one" if model is not None else "")
                )
            serving = self.serving or load_policy_server_settings()
            training = self.training or load_trainer_settings()
            problem = backend_problem(serving, training)
            if problem is not None:
                raise ConfigurationError(f"{problem[0]}: {problem[1]}")
            from algorithms.session import DEFAULT_MAX_STEPS

            steps = DEFAULT_MAX_STEPS if steps is None else steps
        elif model is not None:
            logger.warning("%s trains no model: model is not used", self.algorithm.name)
            model = None
        return Plan(
            agent=name,
            model=model,
            steps=steps,
            splits=Splits(train=tasks(train, "train"), val=tasks(val, "val"), test=tasks(test, "test")),
            trackers=trackers,
            serving=serving,
            training=training,
            optimizer=self.optimizer or load_optimizer_settings(),
        )

    def _display(self, steps: int | None) -> RunDisplay:
        if self.progress is True:
            return default_display(steps)
        if self.progress is False:
            return Silent()
        return self.progress(steps)

    def _run(self, stack: contextlib.ExitStack, display: RunDisplay, plan: Plan, output: Path) -> list[Any]:
        """Starts the processes on ``stack`` (from this thread: they die with it), then trains; the history."""
        from algorithms.local_stack import embedded_store, runners, unless_exited

        level = LogLevel(self.log_level)
        if self.store is None:
            display.phase("starting the store")
        url = self.store or stack.enter_context(embedded_store(output, log_level=level.value))
        token = self.token if self.store else None
        runner_log = output / "runner.log"
        runner = None
        if plan.agent is not None and self.runners > 0:
            runner = stack.enter_context(
                runners(
                    plan.agent,
                    url,
                    workers=self.runners,
                    concurrency=self.concurrency,
                    log=runner_log,
                    log_level=level.value,
                    token=token,
                )
            )
        served: ServedPolicy | None = None
        if plan.serving is not None and plan.model is not None:
            display.phase("loading the model")
            served = stack.enter_context(served_policy(plan.serving, plan.model, output, level))
        mirror = Trackers(plan.trackers, output)
        finished = [False]  # the trackers' runs end FINISHED only if training did
        stack.callback(lambda: mirror.finish(succeeded=finished[0]))
        run = self._train(plan, (url, token), output, served, display, mirror)
        # Without runners of its own, the training waits for whoever claims its rollouts.
        watched = run if runner is None else unless_exited(run, runner, runner_log, "store run")
        history: list[Any] = aio.run_blocking(watched)["history"]
        finished[0] = True
        return history

    async def _train(
        self,
        plan: Plan,
        connection: tuple[str, str | None],
        output: Path,
        policy: ServedPolicy | None,
        display: RunDisplay,
        trackers: Trackers,
    ) -> dict[str, Any]:
        from lightning_store.connect import connect

        url, token = connection
        client = await connect(url, token=token)

        def step(number: int, metrics: dict[str, float]) -> None:
            display.update(number, metrics)
            trackers.log_step(number, metrics)

        session = self.session(
            plan,
            client,
            output,
            policy=policy,
            on_step=step,
            on_phase=display.phase,
            on_run=trackers.start,
            on_span=trackers.on_span,
            run_info=self._run_info(plan, output),
            freeze_heap=self.freeze_heap,
        )
        try:
            result: dict[str, Any] = await self.algorithm.train(session)
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                await close()
        return result

    def session(
        self, plan: Plan, store: LightningStore, output: Path, *, policy: ServedPolicy | None = None, **hooks: Any
    ) -> TrainingSession:
        """The session ``plan`` trains in on ``store``: its tasks, model, output, bounds and backend; ``hooks``
        adds the listeners and the rest (``on_step``, ``run_info``, …). :mod:`algorithms.dry_run` checks with one."""
        from algorithms.session import TrainingSession

        if plan.training is not None:  # else the session's default (unused: nothing is trained)
            hooks["trainer"] = plan.training
        return TrainingSession(
            store=store,
            train_tasks=plan.splits.train,
            val_tasks=plan.splits.val,
            test_tasks=plan.splits.test,
            model_dir=plan.model,
            output_dir=output,
            policy=policy,
            optimizer=plan.optimizer,
            max_steps=plan.steps,
            resume=self.resume,
            **hooks,
        )

    def _run_info(self, plan: Plan, output: Path) -> dict[str, Any]:
        """What the run's record says it is beside the algorithm's options (the dashboard's run page)."""
        splits = plan.splits
        info: dict[str, Any] = {
            "agent": plan.agent,
            "model": str(plan.model) if plan.model is not None else None,
            "runners": self.runners,
            "concurrency": self.concurrency,
            "tasks": {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)},
            "steps": plan.steps,
            "output": str(output.resolve()),
        }
        if plan.serving is not None:
            info["policy_server"] = plan.serving.policy_server
        if plan.training is not None:
            info["trainer"] = plan.training.trainer
        if plan.trackers:
            info["report_to"] = plan.trackers
        return info


@dataclass(frozen=True)
class Splits:
    """The tasks of a run: training, validation, held-out test."""

    train: list[Any]
    val: list[Any]
    test: list[Any]


@dataclass(frozen=True)
class Plan:
    """A run as checked by :meth:`Trainer.plan`: what :meth:`Trainer._run` starts."""

    agent: str | None
    model: Path | None
    steps: int | None
    splits: Splits
    trackers: list[str]
    serving: PolicyServerSettings | None
    training: TrainerSettings | None
    optimizer: OptimizerSettings


def newest_checkpoint(output: Path) -> Path | None:
    from algorithms.training.checkpoints import PREFIX, saved_steps

    steps = saved_steps(output)
    return output / f"{PREFIX}{steps[-1]}" if steps else None


def run_logs(output: Path) -> list[Path]:
    """The logs a run leaves in ``output``: the store's, the runner's, the DeepSpeed ranks', vLLM's."""
    return sorted(path for pattern in ("*.log", "vllm/*.log") for path in output.glob(pattern))


@contextlib.contextmanager
def served_policy(settings: PolicyServerSettings, model: Path, output: Path, level: LogLevel) -> Iterator[ServedPolicy]:
    """The policy server the settings name, started (and stopped on exit); ``VllmFailed`` if vLLM does not start."""
    from algorithms.progress import quiet_transformers
    from algorithms.serving.local import LocalPolicy

    quiet_transformers(level)
    if settings.policy_server == "transformers":
        local_policy = LocalPolicy(
            model, model_name=model.name, decode_threads=settings.decode_threads, host=settings.policy_host
        )
        with local_policy as local:
            yield local
        return
    from algorithms.serving.vllm import VllmPolicy

    assert settings.vllm_python is not None  # backend_problem
    vllm = VllmPolicy(
        model,
        python=settings.vllm_python,
        work_dir=output / "vllm",
        model_name=model.name,
        host=settings.policy_host,
        swap=settings.vllm_swap,
        extra_args=shlex.split(settings.vllm_args),
    )
    vllm.start()
    try:
        yield vllm
    finally:
        vllm.stop()
