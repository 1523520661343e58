"""``store train --dry-run`` and ``Trainer.dry_run``: what a run would start, and every check that can be made
without starting it.

Checks, each ``ok``, ``warn`` or ``FAIL`` with what was found (the shape of ``store doctor``'s):

- **options**: the arguments and the tasks, as ``Trainer.fit`` checks them (a ConfigurationError is this FAIL);
- **model** (an algorithm that trains weights): its directory loads as transformers loads it (config, tokenizer),
  and its tokenizer has a chat template (the policy server needs one);
- **agent** (with runners of its own): it imports as ``store run`` imports it (``store doctor --agent-only``, in a
  process of its own: this package does not import the runners);
- **store**: a ``store`` server answers (``store doctor``), with its resources and the LLM they name for an
  algorithm that trains no weights (its agents call that LLM); an embedded store is named, new or reused;
- **algorithm**: the algorithm's own :meth:`~algorithms.base.Algorithm.check` against the tasks and the store (APO:
  the seed prompt, the budget, the optimizer LLM reachable); an embedded store that does not exist yet is checked
  as the empty store it will be, made in a temporary directory;
- **trackers**: each ``report_to`` tracker's library is installed.

Nothing is started, nothing is written to the store or to the output directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from algorithms.base import ConfigurationError
from algorithms.local_stack import store_command
from lightning_store import aio

if TYPE_CHECKING:
    from algorithms.trainer import Plan, Trainer

Outcome = Literal["ok", "warn", "FAIL"]
TRACKER_MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
DOCTOR_TIMEOUT = 120.0


@dataclass(frozen=True)
class Finding:
    check: str
    outcome: Outcome
    detail: str


@dataclass
class DryRun:
    """What would run (``(what, detail)`` pairs) and what the checks found."""

    would_run: list[tuple[str, str]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check failed (warnings pass)."""
        return all(finding.outcome != "FAIL" for finding in self.findings)

    def lines(self) -> Iterator[str]:
        if self.would_run:
            yield "would run:"
            yield from (f"  {what:<10} {detail}" for what, detail in self.would_run)
            yield "checks:"
        yield from (f"{f.outcome:<4}  {f.check:<9}  {f.detail}" for f in self.findings)

    def __repr__(self) -> str:
        return "\n".join(self.lines())


def dry_run(trainer: Trainer, agent: object, train: Any, val: Any, test: Any) -> DryRun:
    """``trainer``'s run on these tasks, described and checked; nothing started or written."""
    try:
        plan = trainer.plan(agent, train, val, test)
    except ConfigurationError as error:
        return DryRun(findings=[Finding("options", "FAIL", str(error))])
    result = DryRun(would_run=describe(trainer, plan))
    result.findings.append(Finding("options", "ok", "the arguments and the tasks are valid"))
    if plan.model is not None:
        result.findings.append(_model_check(plan.model))
    if plan.agent is not None:
        result.findings += _doctor(["--agent", plan.agent, "--agent-only"], token=None)
    if trainer.store is not None:
        wanted = {"store"} if trainer.algorithm.needs_policy else {"store", "resources", "llm", "token ids", "tools"}
        found = _doctor(["--store", trainer.store], token=trainer.token)
        result.findings += [finding for finding in found if finding.check in wanted]
    else:
        database = Path(trainer.output) / "store.db"
        reused = "reused" if database.exists() else "new"
        embedded = f"embedded: SQLite at {database} ({reused}), served on 127.0.0.1"
        result.findings.append(Finding("store", "ok", embedded))
    result.findings += aio.run_blocking(_algorithm_check(trainer, plan))
    for name in plan.trackers:
        if importlib.util.find_spec(TRACKER_MODULES[name]) is None:
            hint = f"{name} is not installed: the run goes on without it (pip install 'lightning-store[trackers]')"
            result.findings.append(Finding("trackers", "warn", hint))
        else:
            result.findings.append(Finding("trackers", "ok", f"{name} is installed"))
    return result


def describe(trainer: Trainer, plan: Plan) -> list[tuple[str, str]]:
    """What the run would start and with what, as ``(what, detail)`` pairs."""
    algorithm = trainer.algorithm
    options = json.dumps(algorithm.config.model_dump(mode="json", exclude_defaults=True))
    lines = [("algorithm", f"{algorithm.name} {options}")]
    if plan.model is not None:
        lines.append(("model", str(plan.model)))
    splits = plan.splits
    lines.append(("tasks", f"train {len(splits.train)}, val {len(splits.val)}, test {len(splits.test)}"))
    output = Path(trainer.output)
    lines.append(("store", trainer.store or f"store serve on {output / 'store.db'}"))
    if plan.agent is not None:
        each = f"{trainer.concurrency} attempt{'s' if trainer.concurrency > 1 else ''} at once"
        lines.append(("runners", f"store run {plan.agent}: {trainer.runners} workers, {each} each"))
    else:
        lines.append(("runners", f"none: your own runners claim the rollouts from {trainer.store}"))
    if plan.serving is not None:
        serving = plan.serving
        if serving.policy_server == "vllm":
            lines.append(("policy", f"vLLM with {serving.vllm_python} {serving.vllm_args}".rstrip()))
        else:
            threads = f"{serving.decode_threads} threads" if serving.decode_threads else "every core"
            lines.append(("policy", f"the built-in transformers server, decoding on {threads}"))
    if plan.training is not None:
        training = plan.training
        backend = "torch in this process"
        if training.trainer == "deepspeed":
            backend = f"DeepSpeed, {training.trainer_processes} ranks, ZeRO stage {training.deepspeed_zero_stage}"
        lines.append(("trainer", backend))
    bound = f"{plan.steps}" if plan.steps is not None else "the algorithm's own bound"
    lines.append(("steps", f"{bound}{_resume_point(output) if trainer.resume else ', not resumed'}"))
    lines.append(("trackers", ", ".join(plan.trackers) or "none"))
    lines.append(("output", str(output)))
    return lines


def _resume_point(output: Path) -> str:
    from algorithms.trainer import newest_checkpoint

    newest = newest_checkpoint(output)  # the one a resumed run continues from (complete checkpoints only)
    return f", resuming from {newest.name}" if newest is not None else ""


def _model_check(model: Path) -> Finding:
    try:
        from transformers import AutoConfig, AutoTokenizer

        config: Any = AutoConfig.from_pretrained(model)
        tokenizer: Any = AutoTokenizer.from_pretrained(model)
    except Exception as error:  # whatever transformers raises for a directory it cannot read
        first = str(error).splitlines()[0] if str(error) else ""
        return Finding("model", "FAIL", f"{model} does not load: {type(error).__name__}: {first}")
    kind = ", ".join(getattr(config, "architectures", None) or [config.model_type])
    if not getattr(tokenizer, "chat_template", None):
        return Finding("model", "FAIL", f"{model} ({kind}) has no chat template: the policy server needs one")
    return Finding("model", "ok", f"{model}: {kind}, vocabulary {len(tokenizer)}, with a chat template")


def _doctor(arguments: list[str], token: str | None) -> list[Finding]:
    """``store doctor ARGUMENTS --json`` in a process of its own, its findings."""
    environment = os.environ | ({"LIGHTNING_STORE_TOKEN": token} if token else {})
    try:
        done = subprocess.run(
            [*store_command(), "doctor", *arguments, "--json"],
            capture_output=True,
            text=True,
            env=environment,
            timeout=DOCTOR_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return [Finding("doctor", "FAIL", f"store doctor did not answer within {DOCTOR_TIMEOUT:.0f} s")]
    findings = []
    for line in done.stdout.splitlines():
        try:
            found = json.loads(line)
            findings.append(Finding(found["check"], found["outcome"], found["detail"]))
        except (ValueError, KeyError, TypeError):
            continue
    if not findings:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [Finding("doctor", "FAIL", f"store doctor exited with {done.returncode}: {last}")]
    return findings


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The logger ``name`` says only warnings and errors meanwhile."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


async def _algorithm_check(trainer: Trainer, plan: Plan) -> list[Finding]:
    """The algorithm's own checks, on the store the run would use (an embedded one not made yet: the empty store
    it will be, in a temporary directory)."""
    from lightning_store.connect import connect

    output = Path(trainer.output)
    with tempfile.TemporaryDirectory(prefix="dry-run-") as scratch:
        if trainer.store is not None:
            target = trainer.store
        else:
            database = output / "store.db" if (output / "store.db").exists() else Path(scratch) / "store.db"
            target = f"sqlite+aiosqlite:///{database.resolve()}"
        try:
            with _quiet("alembic"):  # the scratch store's migrations are not the user's news
                store = await connect(target, token=trainer.token if trainer.store else None, timeout=10)
        except Exception as error:  # a store that cannot be opened is the store check's finding
            return [Finding("algorithm", "warn", f"not checked: the store cannot be opened ({error})")]
        session = trainer.session(plan, store, output)
        try:
            found = await trainer.algorithm.check(session)
        except ConfigurationError as error:
            return [Finding("algorithm", "FAIL", str(error))]
        except Exception as error:  # the store failing mid-check: reported, not raised
            return [Finding("algorithm", "FAIL", f"{type(error).__name__}: {error}")]
        finally:
            await store.close()
    name = trainer.algorithm.name
    return [Finding("algorithm", "ok", line) for line in found] or [Finding("algorithm", "ok", f"{name}: nothing more")]
