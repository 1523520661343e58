"""Training runs written into a store the way the trainers write them, for the dashboard's runs and resources tests.

No model is needed: the RL run's steps are written by ``algorithms.session.MetricsLog`` (what
``algorithms/rl/lightning_rl.py`` logs through, with the metric names it logs), and the APO run is driven through
``algorithms.apo.context.ApoRun`` (its ``propose``, ``record`` and ``log_round``), a real ``Optimizer`` against the
scripted stand-in (``tests.scripted_optimizer``), and ``algorithms.apo.algorithm._finish`` (publish + result span).
Only the agents' rollouts are left out of the APO run: candidate scores are set by hand, as the evaluator would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

from algorithms.apo.algorithm import _finish
from algorithms.apo.budget import Budget
from algorithms.apo.candidates import Candidate, resources_id_of
from algorithms.apo.config import ApoConfig
from algorithms.apo.context import ApoRun
from algorithms.apo.optimizer import Optimizer
from algorithms.session import MetricsLog, TrainingSession
from lightning_store.contract import LightningStore
from lightning_store.llm_calls import LlmCall
from lightning_store.resources import LLM, NamedResources, PromptTemplate
from lightning_store.settings import OptimizerSettings
from tests.conftest import serve_app
from tests.scripted_optimizer import OPTIMIZER_MODEL, ReportCounts, create_app

POLICY = "policy"
PUBLISH_ID = "prompts"
HOSTILE = "<script>alert('x')</script></script><b>bold</b> & \"q\" </pre></details>"
"""Text a model or a user may write: it must show as text, never as markup."""
SEED_CLASSIFY = "You classify items.\nClassify the item {text}.\nAnswer with one word."
SEED_CHECKER = "Check the proposal {plan}.\nSay yes or no."
REWRITE_CLASSIFY = (
    "You classify items.\nClassify the item {text}. Use hint-A. <b>bold</b> </script>\nAnswer with one word.\n"
    "Think first & answer."
)
"""The seed's ``classify`` with its 2nd line changed and a line added (exact diff: -1 line, +2 lines)."""
REWRITE_CHECKER = "Check the proposal {plan} with hint-check.\nSay yes or no."
REJECTED_CHECKER = "Check {plan}. Explain at length."
INVALID_CLASSIFY = "Classify the item. It dropped its placeholder."
RL_CONFIG = {"learning_rate": 1e-5, "group_size": 2, "optimizer": {"betas": [0.9, 0.99]}}
RL_RUN = {
    "agent": "examples.flight.agent:flight_agent",
    "model": "/models/flight-model",
    "runners": 2,
    "concurrency": 1,
    "tasks": {"train": 8, "val": 4, "test": 0},
    "policy_server": "transformers",
    "trainer": "torch",
}
"""What ``Trainer`` writes into a run's record beside the options (``TrainingSession.run_info``)."""
UNTRAINED_STEP = 1
"""The step of the RL run that trained nothing (metric ``untrained``)."""


def rl_metrics(step: int, version: int) -> dict[str, float]:
    """A training step's metrics, with the names ``LightningRL._train`` logs."""
    return {
        "reward_mean": 0.1 * step + 0.05,
        "reward_std": 0.2 + 0.01 * step,
        "loss": 1.0 / (step + 1),
        "pg_loss": 0.9 / (step + 1),
        "kl": 0.001 * step,
        "entropy": 2.5 - 0.1 * step,
        "grad_norm": 0.3 + step / 7,
        "trained_transitions": 8.0,
        "rollouts": 4.0,
        "transitions": 8.0,
        "stale_dropped": float(step % 2),
        "staleness_max": float(step % 3),
        "collect_seconds": 0.5 + step / 3,
        "train_seconds": 0.25,
        "step_seconds": 1.0 + step / 3,
        "version": float(version),
        "untrained": float(step == UNTRAINED_STEP),
    }


def val_metrics(value: float) -> dict[str, float]:
    return {"val_reward": value, "val_rollouts": 4.0}


@dataclass
class Filled:
    rl_run_id: str = ""
    rl_resumed_id: str = ""
    apo_run_id: str = ""
    candidates: dict[str, str] = field(default_factory=dict)
    """Role (``accepted``, ``rejected``, ``merge``) → the candidate's resources id."""


async def fill_rl_run(store: LightningStore, filled: Filled) -> None:
    """A GRPO run of 3 steps that fails, then resumes from step 2 and runs to step 4 (a second training-run
    rollout, which evaluates step 2 again and writes step 3 again), with agent rollouts and LLM calls on the
    ``policy`` versions it published."""
    llm: NamedResources = {"main_llm": LLM(endpoint="http://127.0.0.1:9/v1", model="policy")}
    published = await store.update_resources(POLICY, llm)
    log = await MetricsLog.start(store, "grpo", RL_CONFIG, run=RL_RUN)
    filled.rl_run_id = log.run.rollout_id
    await log.log(0, val_metrics(0.25))
    for step in (1, 2, 3):
        await _agent_rollouts(store, step - 1, published.version)
        published = await store.update_resources(POLICY, llm)
        await log.log(step, rl_metrics(step, published.version) | (val_metrics(0.4) if step == 2 else {}))
    await log.finish(succeeded=False)
    resumed = await MetricsLog.start(store, "grpo", RL_CONFIG)
    filled.rl_resumed_id = resumed.run.rollout_id
    published = await store.update_resources(POLICY, llm)
    await resumed.log(2, val_metrics(0.45))
    for step in (3, 4):
        await _agent_rollouts(store, step - 1, published.version)
        published = await store.update_resources(POLICY, llm)
        await resumed.log(step, rl_metrics(step, published.version) | ({} if step == 3 else val_metrics(0.6)))
    await resumed.finish(succeeded=True)


async def _agent_rollouts(store: LightningStore, step: int, version: int) -> None:
    """Two train rollouts of ``step`` that ran on ``policy`` ``version`` (one LLM call each)."""
    for task in ("t1", "t2"):
        rollout = await store.start_rollout(
            {"task": task}, mode="train", resources_id=POLICY, metadata={"step": step, "task_id": task}
        )
        call = LlmCall(
            rollout_id=rollout.rollout_id,
            attempt_id=rollout.attempt.attempt_id,
            span_id=f"{step:04x}{task}".ljust(16, "0"),
            agent_name="agent",
            model="policy",
            resources_id=POLICY,
            resources_version=version,
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4, 5],
            start_time=time.time(),
            end_time=time.time() + 0.5,
            latency_seconds=0.5,
        )
        await store.add_llm_calls([call])
        await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")


def _critique(name: str, counts: ReportCounts) -> str:
    return f"CRITIQUE of template {name}: {HOSTILE}\nSecond line."


async def fill_apo_run(store: LightningStore, filled: Filled) -> None:
    """An APO run over two templates: the seed; round 1 an accepted rewrite of its ``classify``; round 2 an
    accepted rewrite of its ``checker``; round 3 an invalid rewrite; round 4 a rejected rewrite; round 5 an
    accepted merge of rounds 1 and 2, the best, which is published as version 2 of ``prompts``."""
    seed_resources: dict[str, Any] = {
        "llm": LLM(endpoint="http://127.0.0.1:9/v1", model="rule-model"),
        "classify": PromptTemplate(template=SEED_CLASSIFY, engine="f-string"),
        "checker": PromptTemplate(template=SEED_CHECKER, engine="f-string"),
    }
    snapshot = await store.update_resources(PUBLISH_ID, seed_resources)
    await store.update_resources(resources_id_of(snapshot.resources), snapshot.resources)  # as _run_log does
    config = ApoConfig(seed=3, max_rollouts=200, max_optimizer_calls=20)
    log = await MetricsLog.start(store, "apo", config.model_dump(mode="json"))
    filled.apo_run_id = log.run.rollout_id
    script = {"classify": [REWRITE_CLASSIFY, INVALID_CLASSIFY], "checker": [REWRITE_CHECKER, REJECTED_CHECKER]}
    async with serve_app(create_app(script, critique=_critique)) as url:
        budget = Budget(config.max_rollouts, config.max_optimizer_calls)
        settings = OptimizerSettings(optimizer_url=f"{url}/v1", optimizer_model=OPTIMIZER_MODEL)
        optimizer = Optimizer(settings, store, log.run.rollout_id, log.run.attempt.attempt_id, budget)
        templates = {n: r for n, r in snapshot.resources.items() if isinstance(r, PromptTemplate)}
        base = dict(snapshot.resources)
        run = ApoRun(config, store, log, cast(Any, None), optimizer, budget, base, templates, [], [])
        await _validated(store, run, run.seed, [0.0, 1.0, 0.0, 0.5])
        await run.record(run.seed, "seed")
        await run.log_round(0)
        accepted = await run.propose(1, run.seed, "classify", [])
        assert accepted is not None
        await _validated(store, run, accepted, [1.0, 1.0, 0.0, 0.5])
        run.counters.accepted += 1
        await run.record(accepted, "accepted", "", (0.75, 0.25))
        await run.log_round(1)
        checker = await run.propose(2, run.seed, "checker", [])
        assert checker is not None
        await _validated(store, run, checker, [0.0, 1.0, 1.0, 0.5])
        run.counters.accepted += 1
        await run.record(checker, "accepted", "", (0.5, 0.25))
        await run.log_round(2)
        assert await run.propose(3, accepted, "classify", []) is None  # recorded invalid: drops {text}
        await run.log_round(3)
        rejected = await run.propose(4, accepted, "checker", [])
        assert rejected is not None
        await store.update_resources(rejected.resources_id, rejected.resources)
        run.counters.rejected += 1
        await run.record(rejected, "rejected", "no better than its parent on the minibatch", (0.5, 0.5))
        await run.log_round(4)
        templates = {"classify": accepted.templates["classify"], "checker": checker.templates["checker"]}
        merged = run.new_candidate(5, templates, "merge", [accepted, checker])
        run.counters.proposed += 1
        await _validated(store, run, merged, [1.0, 1.0, 1.0, 1.0])
        run.counters.accepted += 1
        await run.record(merged, "accepted", "", (1.0, 0.75))
        await run.log_round(5)
        session = SimpleNamespace(test_tasks=[], on_phase=lambda text: None)
        await _finish(run, cast(TrainingSession, session), PUBLISH_ID)
        await optimizer.close()
    await log.finish(succeeded=True)
    filled.candidates = {
        "accepted": accepted.resources_id,
        "checker": checker.resources_id,
        "rejected": rejected.resources_id,
        "merge": merged.resources_id,
    }


async def _validated(store: LightningStore, run: ApoRun, candidate: Candidate, scores: list[float]) -> None:
    """What ``ApoRun.validate`` leaves behind, without agents: the snapshot stored, the scores, the pool."""
    await store.update_resources(candidate.resources_id, candidate.resources)
    candidate.val_scores = {f"v{i}": s for i, s in enumerate(scores)}
    run.pool.append(candidate)


async def fill(store: LightningStore) -> Filled:
    """Both runs, RL first."""
    filled = Filled()
    await fill_rl_run(store, filled)
    await fill_apo_run(store, filled)
    return filled
