"""``store algorithms list`` and ``store train`` (added to the ``store`` CLI through entry points).

``store train`` runs the whole loop on one machine: ``store serve`` and ``store run`` as subprocesses
(``algorithms.local_stack``; the store on SQLite in the output directory unless ``--store`` names a server), the
policy server and the trainer in this process. Metrics go into the store and onto stdout
(:mod:`algorithms.progress`).

Both commands need the ``train`` extra: this module imports without torch (what needs it is imported inside the
commands), so that a plain install can list the ``store`` commands and say which extra these need
(:mod:`algorithms.extras`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from algorithms.base import load_algorithm, registered
from algorithms.extras import needs_train_extra
from algorithms.progress import Summary, TrainingProgress, configure_logging, stdout_for_results
from lightning_store import aio
from lightning_store.logs import LogLevel
from lightning_store.settings import (
    PolicyServerSettings,
    TrainerSettings,
    load_policy_server_settings,
    load_trainer_settings,
)

if TYPE_CHECKING:
    from algorithms.session import ServedPolicy

algorithms = needs_train_extra(
    typer.Typer(help="Training algorithms registered through the lightning_store.algorithms entry points.")
)
console = Console(stderr=True)


@algorithms.command("list")
def list_algorithms(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show every registered algorithm, where it comes from, and what it does."""
    rows = []
    for name, entry in sorted(registered().items()):
        try:
            summary = load_algorithm(name).summary
        except Exception as error:  # a broken plugin is shown, not fatal
            summary = f"(cannot load: {error})"
        source = entry.dist.name if entry.dist else "?"
        rows.append({"name": name, "target": entry.value, "distribution": source, "summary": summary})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("name", "target", "package", "summary")
    for row in rows:
        table.add_row(row["name"], row["target"], row["distribution"], row["summary"])
    Console().print(table)


def read_tasks(path: Path) -> list[Any]:
    """Tasks from a JSON Lines file: one JSON value per non-empty line."""
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise typer.BadParameter(f"{path}:{number}: not JSON ({error.msg})") from None
    if not tasks:
        raise typer.BadParameter(f"{path} holds no tasks")
    return tasks


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{path}: the config must be a mapping of option names to values")
    return loaded


@needs_train_extra
def train(
    algorithm: Annotated[str, typer.Option(help="Registered algorithm (store algorithms list).")],
    agent: Annotated[str, typer.Option(help="The agent, as module:name.")],
    train_file: Annotated[Path, typer.Option("--train", help="Training tasks, JSON Lines.", exists=True)],
    model: Annotated[Path, typer.Option(help="Model directory (transformers format).", exists=True)],
    val_file: Annotated[Path | None, typer.Option("--val", help="Validation tasks, JSON Lines.", exists=True)] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of algorithm options.", exists=True)] = None,
    output: Annotated[Path, typer.Option(help="Checkpoints, logs and the embedded store.")] = Path("runs/latest"),
    steps: Annotated[int, typer.Option(min=1, help="Training steps.")] = 10,
    workers: Annotated[int, typer.Option(min=1, help="Runner worker processes.")] = 4,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Attempts each worker runs at once (their LLM calls are decoded together).")
    ] = 1,
    store: Annotated[str | None, typer.Option(help="A store server URL (default: serve one on SQLite).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the newest checkpoint in --output.")] = True,
    policy_server: Annotated[
        str | None, typer.Option(help="transformers (built in, the default) or vllm.", show_default=False)
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="The Python of a virtualenv with vLLM (--policy-server vllm).")
    ] = None,
    vllm_args: Annotated[str | None, typer.Option(help="Extra arguments of the vLLM server, quoted as one.")] = None,
    trainer: Annotated[
        str | None, typer.Option(help="torch (in this process, the default) or deepspeed.", show_default=False)
    ] = None,
    processes: Annotated[
        int | None, typer.Option(help="DeepSpeed ranks, this process included [default: 2].", show_default=False)
    ] = None,
    zero_stage: Annotated[int | None, typer.Option(help="DeepSpeed ZeRO stage, 1 or 2 [default: 2].")] = None,
    deepspeed_config: Annotated[
        Path | None, typer.Option(help="JSON file of DeepSpeed options over the generated ones.", exists=True)
    ] = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(help="Log records shown, the subprocesses' too; debug adds HTTP requests and progress bars."),
    ] = LogLevel.info,
) -> None:
    """Train an agent: store, policy server, runners and trainer on this machine.

    On a terminal: a progress bar, then a summary. Otherwise: one JSON line per step on stdout, then a summary line."""
    configure_logging(log_level)
    try:
        serving = load_policy_server_settings(policy_server=policy_server, vllm_python=vllm_python, vllm_args=vllm_args)
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--policy-server") from None
    try:
        training = load_trainer_settings(
            trainer=trainer,
            trainer_processes=processes,
            deepspeed_zero_stage=zero_stage,
            deepspeed_config=str(deepspeed_config) if deepspeed_config else None,
        )
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--trainer") from None
    if training.trainer == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        missing = "the deepspeed trainer needs DeepSpeed: pip install 'lightning-store[deepspeed]'"
        raise typer.BadParameter(missing, param_hint="--trainer")
    if serving.policy_server == "vllm" and not serving.vllm_python:
        missing = "vLLM needs the interpreter of its virtualenv (or LIGHTNING_STORE_VLLM_PYTHON)"
        raise typer.BadParameter(missing, param_hint="--vllm-python")
    try:
        algorithm_class = load_algorithm(algorithm)
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0]), param_hint="--algorithm") from None
    try:
        instance = algorithm_class(**read_config(config))
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--config") from None
    tasks = read_tasks(train_file)
    val_tasks = read_tasks(val_file) if val_file else []
    output.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with stdout_for_results() as results, contextlib.ExitStack() as stack:
        from algorithms.local_stack import ProcessFailed, embedded_store, runners

        progress = stack.enter_context(TrainingProgress(steps, out=results))
        if store is None:
            progress.phase("starting the store")
        try:
            url = store or stack.enter_context(embedded_store(output, log_level=log_level.value))
        except ProcessFailed as error:
            console.print(f"[red]{error}[/red]")
            raise typer.Exit(code=1) from None
        runner_log = output / "runner.log"
        stack.enter_context(
            runners(agent, url, workers=workers, concurrency=concurrency, log=runner_log, log_level=log_level.value)
        )
        progress.phase("loading the model")
        served = stack.enter_context(_policy(serving, model, output, log_level))
        run = _train(instance, url, tasks, val_tasks, model, output, steps, resume, served, training, progress)
        history = aio.run(run)["history"]
        progress.phase("stopping")
        stack.close()  # the policy server, the runners and the store stop, and the display ends, before the summary
        progress.summary(
            Summary.of(
                history,
                algorithm=algorithm,
                wall_seconds=time.monotonic() - began,
                output=output,
                checkpoint=_newest_checkpoint(output),
                logs=_logs(output),
                store=str(output / "store.db") if store is None else store,
            )
        )


def _newest_checkpoint(output: Path) -> Path | None:
    from algorithms.checkpoints import PREFIX, saved_steps

    steps = saved_steps(output)
    return output / f"{PREFIX}{steps[-1]}" if steps else None


def _logs(output: Path) -> list[Path]:
    """The logs a run leaves in ``output``: the store's, the runner's, the DeepSpeed ranks', vLLM's."""
    return sorted(path for pattern in ("*.log", "vllm/*.log") for path in output.glob(pattern))


@contextlib.contextmanager
def _policy(settings: PolicyServerSettings, model: Path, output: Path, log_level: LogLevel) -> Iterator[ServedPolicy]:
    """The policy server the settings name, started (and stopped on exit)."""
    from algorithms.progress import quiet_transformers
    from algorithms.serving.local import LocalPolicy

    quiet_transformers(log_level)
    if settings.policy_server == "transformers":
        with LocalPolicy(model, model_name=model.name, decode_threads=settings.decode_threads) as local:
            yield local
        return
    from algorithms.serving.vllm import VllmFailed, VllmPolicy

    assert settings.vllm_python is not None
    vllm = VllmPolicy(
        model,
        python=settings.vllm_python,
        work_dir=output / "vllm",
        model_name=model.name,
        swap=settings.vllm_swap,
        extra_args=shlex.split(settings.vllm_args),
    )
    try:
        vllm.start()
    except VllmFailed as error:
        console.print(f"[red]{error}[/red]")
        raise typer.Exit(code=1) from None
    try:
        yield vllm
    finally:
        vllm.stop()


async def _train(
    instance: Any,
    url: str,
    tasks: list[Any],
    val_tasks: list[Any],
    model: Path,
    output: Path,
    steps: int,
    resume: bool,
    policy: ServedPolicy,
    trainer: TrainerSettings,
    progress: TrainingProgress,
) -> dict[str, Any]:
    from algorithms.session import TrainingSession
    from lightning_store.connect import connect

    client = await connect(url)
    session = TrainingSession(
        store=client,
        train_tasks=tasks,
        val_tasks=val_tasks,
        model_dir=model,
        output_dir=output,
        policy=policy,
        max_steps=steps,
        resume=resume,
        on_step=progress.update,
        on_phase=progress.phase,
        trainer=trainer,
        freeze_heap=True,
    )
    try:
        result: dict[str, Any] = await instance.train(session)
    finally:
        close = getattr(client, "close", None)
        if close is not None:
            await close()
    return result
