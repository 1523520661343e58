"""``store algorithms list`` and ``store train`` (added to the ``store`` CLI through entry points).

``store train`` runs the whole loop on one machine through the Python API (:class:`algorithms.trainer.Trainer`):
``store serve`` and ``store run`` as subprocesses (the store on SQLite in the output directory unless ``--store``
names a server), the policy server (for an algorithm that trains weights: ``Algorithm.needs_policy``) and the
trainer in this process. This module reads the options, checks them as usage errors, and shows the run: metrics
go into the store and onto stdout (:mod:`algorithms.progress`).

This module imports without torch (what needs it is imported inside the commands), and both commands run on a
plain install: what needs the ``train`` extra is the algorithm, not the command. ``store algorithms list`` shows
an algorithm that cannot run here with the install hint as its summary; ``store train`` with one prints the hint
and exits 2 (:mod:`algorithms.extras`), while an algorithm that trains no weights (APO) runs.
(Just past 400 lines: most of it is ``store train``'s option declarations, one per documented flag.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from algorithms.base import Algorithm, ConfigurationError, load_algorithm, registered
from algorithms.extras import TRAIN_INSTALL, install_hint, lacks_train_modules, train_extra_missing
from algorithms.local_stack import ProcessExited, ProcessFailed
from algorithms.progress import TrainingProgress, configure_logging, stdout_for_results
from algorithms.serving.vllm import VllmFailed
from algorithms.trackers import parse_report_to
from algorithms.trainer import Trainer, backend_problem
from lightning_store import task_sources
from lightning_store.errors import UnauthorizedError
from lightning_store.logs import LogLevel
from lightning_store.settings import (
    PolicyServerSettings,
    TrainerSettings,
    load_optimizer_settings,
    load_policy_server_settings,
    load_trainer_settings,
)

algorithms = typer.Typer(help="Training algorithms registered through the lightning_store.algorithms entry points.")
console = Console(stderr=True)

NEEDS_TRAIN_EXTRA = f"(needs the 'train' extra: {TRAIN_INSTALL})"
"""The summary ``store algorithms list`` shows for an algorithm that cannot run in this installation."""


class TrainExtraMissing(Exception):
    """The algorithm needs the ``train`` extra (torch, transformers), which this installation lacks."""


def load_runnable(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name`` (``KeyError`` if none is); :class:`TrainExtraMissing` where it
    needs the ``train`` extra and that is missing: its module fails to import torch, or it trains weights
    (``needs_policy``)."""
    try:
        loaded = load_algorithm(name)
    except ImportError as error:
        if lacks_train_modules(error):
            raise TrainExtraMissing(name) from error
        raise
    if loaded.needs_policy and train_extra_missing() is not None:
        raise TrainExtraMissing(name)
    return loaded


@algorithms.command("list")
def list_algorithms(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show every registered algorithm, where it comes from, and what it does."""
    rows = []
    for name, entry in sorted(registered().items()):
        try:
            summary = load_runnable(name).summary
        except TrainExtraMissing:
            summary = NEEDS_TRAIN_EXTRA
        except Exception as error:  # a broken plugin is shown, not fatal
            summary = f"(cannot load: {error})"
        source = entry.dist.name if entry.dist else "?"
        rows.append({"name": name, "target": entry.value, "distribution": source, "summary": summary})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("name", "target", "package", "summary")
    for row in rows:
        table.add_row(*(escape(row[key]) for key in ("name", "target", "distribution", "summary")))
    Console().print(table)


TASKS = "JSON Lines, .parquet, .csv, a saved Hugging Face dataset or hf:NAME[:SPLIT]"


def read_tasks(source: str | Path, option: str | None = None) -> list[Any]:
    """Tasks from JSON Lines, Parquet, CSV or a Hugging Face dataset (``lightning_store.task_sources``); a source
    that cannot be read, or a bad row, is a usage error naming it (and ``option``, the one that gave it)."""
    try:
        return task_sources.read_tasks(str(source))
    except task_sources.TaskSourceError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import yaml

    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise typer.BadParameter(f"{path}: the config must be a mapping of option names to values")
    return loaded


def override(options: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """``options`` with each ``NAME=VALUE`` of ``--set`` laid over them, in order: ``VALUE`` read as YAML reads a
    value (``2``, ``2.0e-4``, ``true``, ``[q_proj, v_proj]``), a dotted ``NAME`` one key of a nested option
    (``lora.r=4``). What the algorithm does not take is refused later, as an unknown key of ``--config`` is."""
    import yaml

    merged = dict(options)
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        keys = name.split(".")
        if not sep or not all(keys):
            raise typer.BadParameter(
                f"{assignment!r}: give NAME=VALUE (NAME may be dotted: lora.r=4)", param_hint="--set"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise typer.BadParameter(f"{assignment!r}: the value is not YAML: {error}", param_hint="--set") from None
        target = merged
        for key in keys[:-1]:
            nested = target.get(key, {})
            if not isinstance(nested, dict):
                raise typer.BadParameter(f"{assignment!r}: {key} is not a mapping", param_hint="--set")
            target[key] = target = dict(nested)
        target[keys[-1]] = value
    return merged


def _runnable_algorithm(name: str) -> str:
    """``--algorithm``'s check, made before the other options are read (it is eager): an algorithm that needs the
    missing ``train`` extra is the install hint and exit 2, whatever else the command line lacks."""
    try:
        load_runnable(name)
    except TrainExtraMissing:
        typer.echo(install_hint("train"), err=True)
        raise typer.Exit(2) from None
    except KeyError as error:
        raise typer.BadParameter(str(error.args[0])) from None
    return name


def train(
    algorithm: Annotated[
        str,
        typer.Option(help="Registered algorithm (store algorithms list).", is_eager=True, callback=_runnable_algorithm),
    ],
    agent: Annotated[
        str | None, typer.Option(help="The agent, as module:name (not with --workers 0).", show_default=False)
    ] = None,
    train_file: Annotated[str | None, typer.Option("--train", help=f"Training tasks (required): {TASKS}.")] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="Model directory (transformers format); the RL algorithms' only.", exists=True),
    ] = None,
    val_file: Annotated[str | None, typer.Option("--val", help=f"Validation tasks: {TASKS}.")] = None,
    test_file: Annotated[
        str | None, typer.Option("--test", help=f"Held-out test tasks (APO scores them): {TASKS}.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of algorithm options.", exists=True)] = None,
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="An algorithm option over --config's, as NAME=VALUE (VALUE in YAML; lora.r=4 for a nested one); "
            "repeatable.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[Path, typer.Option(help="Checkpoints, logs and the embedded store.")] = Path("runs/latest"),
    steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Training steps (default 10; for an algorithm that trains no weights, as apo: its own bound).",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Runner worker processes; 0: none, the rollouts are run by runners you start against --store "
            "(store run, or Agent Lightning's).",
        ),
    ] = 4,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Attempts each worker runs at once (their LLM calls are decoded together).")
    ] = 1,
    store: Annotated[str | None, typer.Option(help="A store server URL (default: serve one on SQLite).")] = None,
    token: Annotated[
        str | None, typer.Option(envvar="LIGHTNING_STORE_TOKEN", help="Bearer token of the --store server.")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the newest checkpoint in --output.")] = True,
    policy_server: Annotated[
        str | None, typer.Option(help="transformers (built in, the default) or vllm.", show_default=False)
    ] = None,
    vllm_python: Annotated[
        str | None, typer.Option(help="The Python of a virtualenv with vLLM (--policy-server vllm).")
    ] = None,
    vllm_args: Annotated[str | None, typer.Option(help="Extra arguments of the vLLM server, quoted as one.")] = None,
    decode_threads: Annotated[
        int | None,
        typer.Option(
            help="Threads the built-in policy server decodes with \\[default: every core] (docs/reference/sizing.md).",
            show_default=False,
        ),
    ] = None,
    policy_host: Annotated[
        str | None,
        typer.Option(
            help="Address the policy server listens on and the store's proxy calls it at: one of this machine's "
            "that the --store servers reach, when they run elsewhere \\[default: 127.0.0.1].",
            show_default=False,
        ),
    ] = None,
    trainer: Annotated[
        str | None, typer.Option(help="torch (in this process, the default) or deepspeed.", show_default=False)
    ] = None,
    processes: Annotated[
        int | None, typer.Option(help="DeepSpeed ranks, this process included \\[default: 2].", show_default=False)
    ] = None,
    zero_stage: Annotated[
        int | None, typer.Option(help="DeepSpeed ZeRO stage, 1 or 2 \\[default: 2].", show_default=False)
    ] = None,
    deepspeed_config: Annotated[
        Path | None, typer.Option(help="JSON file of DeepSpeed options over the generated ones.", exists=True)
    ] = None,
    optimizer_url: Annotated[
        str | None, typer.Option(help="APO: base URL of the optimizer LLM's OpenAI-compatible API.")
    ] = None,
    optimizer_model: Annotated[str | None, typer.Option(help="APO: the optimizer LLM's model name.")] = None,
    optimizer_api_key: Annotated[
        str | None, typer.Option(help="APO: bearer key of the optimizer endpoint.", show_default=False)
    ] = None,
    report_to: Annotated[
        str | None,
        typer.Option(
            help="Mirror the run to these trackers, comma-separated: tensorboard, mlflow, wandb (or report_to in "
            "--config).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        LogLevel,
        typer.Option(help="Log records shown, the subprocesses' too; debug adds HTTP requests and progress bars."),
    ] = LogLevel.info,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what would run and check it (options, model, agent, store, the algorithm's own checks, "
            "trackers), starting nothing; exit 1 if a check failed.",
        ),
    ] = False,
) -> None:
    """Train an agent: store, policy server, runners and trainer on this machine.

    On a terminal: a progress bar, then a summary. Otherwise: one JSON line per step on stdout, then a summary line.
    An algorithm that trains no weights (apo) needs no --model and starts no policy server. --dry-run: what would
    run, and the checks that need nothing started."""
    configure_logging(log_level)
    if train_file is None:
        raise typer.BadParameter(f"give the training tasks ({TASKS})", param_hint="--train")
    if workers == 0 and store is None:
        raise typer.BadParameter(
            "with --workers 0 your own runners run the rollouts: give the store server they claim from",
            param_hint="--store",
        )
    if workers > 0 and agent is None:
        hint = "give the agent as module:name (or --workers 0 and runners of your own)"
        raise typer.BadParameter(hint, param_hint="--agent")
    algorithm_class = load_runnable(algorithm)  # checked by _runnable_algorithm
    serving: PolicyServerSettings | None = None
    training: TrainerSettings | None = None
    if algorithm_class.needs_policy:
        if model is None:
            raise typer.BadParameter(
                f"{algorithm} trains a model: give its directory (transformers format)", param_hint="--model"
            )
        serving, training = _policy_settings(
            policy_server,
            vllm_python,
            vllm_args,
            decode_threads,
            policy_host,
            trainer,
            processes,
            zero_stage,
            deepspeed_config,
        )
    elif model is not None:
        console.print(f"[yellow]{algorithm} trains no model: --model is not used[/yellow]")
        model = None
    try:
        optimizer = load_optimizer_settings(
            optimizer_url=optimizer_url, optimizer_model=optimizer_model, optimizer_api_key=optimizer_api_key
        )
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--optimizer-* (or LIGHTNING_STORE_OPTIMIZER_*)") from None
    options = override(read_config(config), assignments or [])
    from_config = options.pop("report_to", None)  # a run option, not the algorithm's
    trackers = report_to if report_to is not None else from_config  # the command-line option wins
    try:
        parse_report_to(trackers)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--report-to") from None
    try:
        instance = algorithm_class(**options)
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--config" if not assignments else "--config/--set") from None
    train_tasks = read_tasks(train_file, "--train")
    val_tasks = read_tasks(val_file, "--val") if val_file else None
    test_tasks = read_tasks(test_file, "--test") if test_file else None
    run = Trainer(
        instance,
        model=model,
        store=store,
        token=token,
        runners=workers,
        concurrency=concurrency,
        output=output,
        steps=steps,
        resume=resume,
        report_to=trackers,
        serving=serving,
        training=training,
        optimizer=optimizer,
        log_level=log_level,
        freeze_heap=True,
    )
    if dry_run:
        checked = run.dry_run(agent, train=train_tasks, val=val_tasks, test=test_tasks)
        for line in checked.lines():
            typer.echo(line)
        raise typer.Exit(0 if checked.ok else 1)
    with stdout_for_results() as results:
        run.progress = lambda bound: TrainingProgress(bound, out=results)
        try:
            run.fit(agent, train=train_tasks, val=val_tasks, test=test_tasks)
        except (ProcessExited, ConfigurationError) as error:  # an agent that does not load; a bad config's value
            typer.echo(f"store train: {error}", err=True)  # one line, however wide the terminal
            raise typer.Exit(code=2) from None
        except UnauthorizedError as error:  # the --store server wants a token this run does not have
            typer.echo(f"store train: {store}: {error}; pass --token or set LIGHTNING_STORE_TOKEN", err=True)
            raise typer.Exit(code=2) from None
        except (ProcessFailed, VllmFailed) as error:  # the store or vLLM did not start
            console.print(f"[red]{escape(str(error))}[/red]")
            raise typer.Exit(code=1) from None


def _policy_settings(
    policy_server: str | None,
    vllm_python: str | None,
    vllm_args: str | None,
    decode_threads: int | None,
    policy_host: str | None,
    trainer: str | None,
    processes: int | None,
    zero_stage: int | None,
    deepspeed_config: Path | None,
) -> tuple[PolicyServerSettings, TrainerSettings]:
    """The policy server's and the trainer's settings (argument, else environment, else default), checked."""
    try:
        serving = load_policy_server_settings(
            policy_server=policy_server,
            vllm_python=vllm_python,
            vllm_args=vllm_args,
            decode_threads=decode_threads,
            policy_host=policy_host,
        )
    except ValidationError as error:
        hint = "--policy-host" if any(e["loc"] == ("policy_host",) for e in error.errors()) else "--policy-server"
        raise typer.BadParameter(str(error), param_hint=hint) from None
    try:
        training = load_trainer_settings(
            trainer=trainer,
            trainer_processes=processes,
            deepspeed_zero_stage=zero_stage,
            deepspeed_config=str(deepspeed_config) if deepspeed_config else None,
        )
    except ValidationError as error:
        raise typer.BadParameter(str(error), param_hint="--trainer") from None
    problem = backend_problem(serving, training)
    if problem is not None:
        setting, why = problem
        raise typer.BadParameter(why, param_hint=f"--{setting.replace('_', '-')}")
    return serving, training
