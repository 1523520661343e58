"""``apo``: automatic prompt optimization of the prompt templates an agent reads from its resources.

``store train --algorithm apo`` runs it like the RL algorithms (same store, runners and agents), without a model
or torch: the agents call whatever LLM their resources name, and an optimizer LLM (``--optimizer-url``) critiques
and rewrites the templates. Everything is checked before the first rollout; the search runs (``pareto`` or
``beam``) within its budgets; the best candidate by full validation becomes the latest resources; seed and best
are scored on the held-out test tasks. ``OUTPUT/apo-run.json`` names the run, so running the same command again
resumes it: the search is replayed against the store (rollouts and optimizer answers read back) and goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from algorithms.apo import beam, pareto
from algorithms.apo.budget import Budget
from algorithms.apo.candidates import Candidate, resources_id_of
from algorithms.apo.config import ApoConfig
from algorithms.apo.context import RESULT_SPAN, RESULT_SPAN_ID, ApoRun, mean
from algorithms.apo.evaluation import Evaluator, repeated, tasks_of
from algorithms.apo.optimizer import Optimizer, OptimizerError, check_reachable
from algorithms.apo.templates import TemplateError, placeholders
from algorithms.base import Algorithm, AlgorithmConfig, ConfigurationError
from algorithms.session import MetricsLog, TrainingSession
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout, RolloutConfig
from lightning_store.resources import PromptTemplate, ResourcesUpdate

RUN_FILE = "apo-run.json"


class APO(Algorithm):
    name = "apo"
    summary = "Prompt optimization: Pareto (GEPA) or beam (0.3) search over prompt templates; no model training."
    Config: ClassVar[type[AlgorithmConfig]] = ApoConfig
    config: ApoConfig
    needs_policy = False

    async def train(self, session: TrainingSession) -> dict[str, Any]:
        c = self.config
        store = session.store
        resumed = _read_marker(session.output_dir) if session.resume else None
        # A resumed run starts from the seed it started from, not from the store's latest resources, which the
        # interrupted run's candidates (or its published best) have become since.
        pinned = resumed.get("seed_resources_id") if resumed else None
        snapshot, seed_templates = await self._preflight(session, pinned)
        publish_id = (resumed or {}).get("publish_resources_id") or c.publish_resources_id or snapshot.resources_id
        settings = session.optimizer
        budget = Budget(c.max_rollouts, c.max_optimizer_calls, c.max_optimizer_tokens)
        log = await _run_log(store, session, c, resumed, snapshot, publish_id)
        session.attach(log)
        optimizer = Optimizer(settings, store, log.run.rollout_id, log.run.attempt.attempt_id, budget)
        try:
            await optimizer.load_replay()
            rollout_config = RolloutConfig(
                timeout_seconds=c.rollout_timeout,
                unresponsive_seconds=c.unresponsive_seconds,
                max_attempts=c.max_attempts,
                retry_condition=["unresponsive"],  # a runner that died (or a resumed run's killed one), not the agent
            )
            evaluator = Evaluator(store, log.run.rollout_id, budget, rollout_config, c.rollout_batch_timeout)
            base = dict(snapshot.resources)
            run = ApoRun(
                c,
                store,
                log,
                evaluator,
                optimizer,
                budget,
                base,
                seed_templates,
                tasks_of(session.train_tasks),
                tasks_of(session.val_tasks),
            )
            session.on_phase("searching")
            strategy = pareto if c.search == "pareto" else beam
            await strategy.search(run, session.max_steps or c.rounds())  # --steps, when given, caps the rounds
            session.on_phase("publishing")
            result = await _finish(run, session, publish_id)
        except BaseException:
            await log.finish(succeeded=False)
            raise
        finally:
            await optimizer.close()
        await log.finish(succeeded=True)
        return {"history": log.history, **result}

    async def check(self, session: TrainingSession) -> list[str]:
        """The seed snapshot and its templates, the validation tasks against the budget, and the optimizer LLM
        (configured and reachable): what ``train`` checks first, read-only."""
        snapshot, templates = await self._preflight(session, None)
        settings = session.optimizer
        return [
            f"seed: resources {snapshot.resources_id}, templates {', '.join(sorted(templates))}",
            f"optimizer: {settings.optimizer_model} at {settings.optimizer_url} answers",
        ]

    async def _preflight(
        self, session: TrainingSession, pinned: str | None
    ) -> tuple[ResourcesUpdate, dict[str, PromptTemplate]]:
        """What must hold before a run: a ConfigurationError naming the option otherwise."""
        c = self.config
        snapshot, seed_templates = await seed_of(session.store, c, pinned)
        if not session.val_tasks:
            raise ConfigurationError("--val: APO scores candidates on validation tasks; give a --val file")
        check_budget(c, len(session.val_tasks))
        settings = session.optimizer
        if not settings.optimizer_url or not settings.optimizer_model:
            raise ConfigurationError(
                "--optimizer-url/--optimizer-model: APO needs an optimizer LLM (or LIGHTNING_STORE_OPTIMIZER_URL "
                "and LIGHTNING_STORE_OPTIMIZER_MODEL)"
            )
        try:
            await check_reachable(settings)
        except OptimizerError as error:
            raise ConfigurationError(f"--optimizer-url: {error}") from None
        return snapshot, seed_templates


async def seed_of(
    store: LightningStore, c: ApoConfig, pinned: str | None = None
) -> tuple[ResourcesUpdate, dict[str, PromptTemplate]]:
    """The snapshot to start from (``pinned``, else ``resources_id``, else the latest) and its templates to
    optimize, checked (:class:`ConfigurationError` names the option at fault)."""
    chosen = pinned or c.resources_id
    snapshot = await (store.get_resources_by_id(chosen) if chosen else store.get_latest_resources())
    if snapshot is None and pinned:
        raise ConfigurationError(
            f"resources_id: the resumed run's seed snapshot {pinned!r} is not in this store (another --store?); "
            "run with --no-resume or another --output to start a new run"
        )
    if snapshot is None:
        where = f"no resources with id {c.resources_id!r}" if c.resources_id else "the store holds no resources"
        raise ConfigurationError(
            f"resources_id: {where}; write the prompt template with `store resources set-prompt NAME TEXT` "
            "(and the agents' LLM with `store resources set-llm`)"
        )
    found = {n: r for n, r in snapshot.resources.items() if isinstance(r, PromptTemplate)}
    if not found:
        raise ConfigurationError(f"templates: resources {snapshot.resources_id!r} hold no prompt template")
    names = c.templates if c.templates is not None else sorted(found)
    unknown = [n for n in names if n not in found]
    if unknown or not names:
        raise ConfigurationError(
            f"templates: no prompt template named {', '.join(map(repr, unknown)) or '(none given)'} in resources "
            f"{snapshot.resources_id!r}; it has {', '.join(sorted(found))}"
        )
    for name in names:
        template = found[name]
        try:
            names_read = placeholders(template)
        except TemplateError as error:
            raise ConfigurationError(f"templates: {name!r}: {error}") from None
        if not names_read and c.require_placeholders:
            raise ConfigurationError(
                f"templates: {name!r} has no placeholder, so no task data reaches it and its rewrites cannot be "
                "checked; add the fields the agent fills in, or set require_placeholders: false"
            )
    return snapshot, {n: found[n] for n in names}


def check_budget(c: ApoConfig, val_tasks: int) -> None:
    """Refuse budgets too small for one round of the chosen search."""
    if c.search == "pareto":
        rollouts, calls = 2 * val_tasks + 2 * c.minibatch_size, 2
        what = "2 x validation tasks + 2 x minibatch_size"
    else:
        shown = min(c.val_batch_size, val_tasks)
        rollouts = (val_tasks if c.run_initial_validation else 0) + c.gradient_batch_size
        rollouts += (1 + c.branch_factor) * shown + val_tasks
        calls = 2 * c.branch_factor
        what = "initial validation + gradient_batch_size + (1 + branch_factor) x val_batch_size + validation tasks"
    if c.max_rollouts < rollouts:
        raise ConfigurationError(
            f"max_rollouts: {c.max_rollouts} is too small for one {c.search} round ({what} = {rollouts})"
        )
    if c.max_optimizer_calls < calls:
        raise ConfigurationError(
            f"max_optimizer_calls: {c.max_optimizer_calls} is too small for one {c.search} round ({calls})"
        )


def _check_same_options(started: object, c: ApoConfig, max_steps: int | None, output: Path) -> None:
    """A resumed run replays its search, which is only the same search with the same options."""
    before = started.get("config") if isinstance(started, dict) else None
    now = json.loads(json.dumps(c.model_dump(mode="json") | {"max_steps": max_steps}))
    if isinstance(before, dict) and before != now:
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        raise ConfigurationError(
            f"--config: the run in {output} started with other options ({', '.join(changed)} changed); run it with "
            "the same options to resume, or start a new run with --no-resume (what it evaluated is reused)"
        )


def _read_marker(output: Path) -> dict[str, str] | None:
    marker = output / RUN_FILE
    if not marker.exists():
        return None
    found: dict[str, str] = json.loads(marker.read_text())
    return found


async def _run_log(
    store: LightningStore,
    session: TrainingSession,
    c: ApoConfig,
    resumed: dict[str, str] | None,
    seed: ResourcesUpdate,
    publish_id: str,
) -> MetricsLog:
    """The run's rollout: the one the output directory names when resuming, else a new one, whose id, seed and
    publishing target are written there (the seed as a content-addressed snapshot, so that it stays what it was)."""
    output, max_steps = session.output_dir, session.max_steps
    if resumed is not None:
        rollout = await store.get_rollout_by_id(resumed["run_id"])
        if isinstance(rollout, AttemptedRollout):
            _check_same_options(rollout.input, c, max_steps, output)
            return MetricsLog(store, rollout)
    seed_id = resources_id_of(seed.resources)
    if await store.get_resources_by_id(seed_id) is None:
        await store.update_resources(seed_id, seed.resources)
    config = c.model_dump(mode="json") | {"max_steps": max_steps}
    log = await MetricsLog.start(store, APO.name, config, run=session.run_info)
    output.mkdir(parents=True, exist_ok=True)  # a few bytes, once per run: not worth a thread
    marker = {"run_id": log.run.rollout_id, "seed_resources_id": seed_id, "publish_resources_id": publish_id}
    written = output / f"{RUN_FILE}.new"
    written.write_text(json.dumps(marker) + "\n")
    written.replace(output / RUN_FILE)  # atomic: a kill leaves the old file or the new one, never half of one
    return log


async def _finish(run: ApoRun, session: TrainingSession, publish_id: str) -> dict[str, Any]:
    """Publish the best candidate as the latest resources, score seed and best on the test tasks, write the
    result span."""
    store = run.store
    leader = run.best()
    latest = await store.get_latest_resources()
    if latest is None or latest.resources_id != publish_id or latest.resources != leader.resources:
        published = await store.update_resources(publish_id, leader.resources)
    else:
        published = latest
    result: dict[str, Any] = {
        "apo.search": run.config.search,
        "apo.seed": run.config.seed,
        "apo.best_candidate": leader.ordinal,
        "apo.best_resources_id": leader.resources_id,
        "apo.published_resources_id": published.resources_id,
        "apo.published_version": published.version,
        "apo.seed_val_score": run.seed.val_score,
        "apo.best_val_score": leader.val_score,
        "apo.test_tasks": len(session.test_tasks),
        "apo.test_repeats": run.config.test_repeats,
        "apo.max_rollouts": run.config.max_rollouts,
        "apo.max_optimizer_calls": run.config.max_optimizer_calls,
    }
    if session.test_tasks:
        session.on_phase("testing")
        test = repeated(tasks_of(session.test_tasks), run.config.test_repeats)
        seed_out, best_out = await run.evaluator.evaluate_many([(run.seed, test), (leader, test)], "test")
        result["apo.seed_test_score"], result["apo.best_test_score"] = mean(seed_out), mean(best_out)
    if run.config.max_optimizer_tokens is not None:
        result["apo.max_optimizer_tokens"] = run.config.max_optimizer_tokens
    result |= {
        "apo.rollouts_spent": run.budget.rollouts,
        "apo.test_rollouts_spent": run.budget.test_rollouts,
        "apo.optimizer_calls_spent": run.budget.calls,
        "apo.optimizer_tokens_spent": run.budget.tokens,
    }
    await run.span(RESULT_SPAN, RESULT_SPAN_ID, result)
    return {key.removeprefix("apo."): value for key, value in result.items()} | {"best": _shown(leader)}


def _shown(candidate: Candidate) -> dict[str, str]:
    return {name: template.template for name, template in candidate.templates.items()}
