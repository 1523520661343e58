"""The views of revision 0002 compute what docs/reference/sql.md says, on SQLite and on Postgres:
``training_steps_v`` (one row per run and step, a resumed run folded into the run it continues, each metric from
its newest write) and the resources version, training step, task and error message that ``rollouts_v``,
``rewards_v`` and ``spans_v`` gained. The metrics are written by the trainer's own :class:`MetricsLog`."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import sqlalchemy as sa

from algorithms.session import MetricsLog
from lightning_store.spans import Span, TraceStatus
from lightning_store.sql import SqlStore, open_store
from lightning_store.sql.schema import llm_calls, rollouts
from tests.migrations.test_migrations import BACKENDS, rows, span

STEP_COLUMNS = "run_id, training_rollout_id, algorithm, step, resources_version, reward_mean, val_reward, loss"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog=False)
    yield opened
    await opened.close()


class Runs:
    """Training-run rollouts written as ``store train`` writes them, each started one second after the last (the
    view orders runs by start time; equal times would fall back to the random rollout ids)."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.clock = 1000.0

    async def start(self, algorithm: str = "grpo") -> MetricsLog:
        log = await MetricsLog.start(self.store, algorithm, {"group_size": 2})
        self.clock += 1
        async with self.store.engine.begin() as conn:
            await conn.execute(
                sa.update(rollouts).where(rollouts.c.rollout_id == log.run.rollout_id).values(start_time=self.clock)
            )
        return log


def trained(step: int, reward: float, **more: float) -> dict[str, float]:
    """A training step's metrics (as LightningRL logs them: the published version among them)."""
    return {"reward_mean": reward, "loss": 0.1 * step, "version": float(step + 1), **more}


async def steps(store: SqlStore, where: str = "") -> list[dict[str, Any]]:
    return await rows(store, f"SELECT {STEP_COLUMNS} FROM training_steps_v {where} ORDER BY run_id, step")


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_resumed_run_is_one_row_per_step_with_the_newest_value_of_each_metric(store: SqlStore) -> None:
    runs = Runs(store)
    first = await runs.start()
    await first.log(0, {"val_reward": 0.25, "val_rollouts": 4.0})
    await first.log(1, trained(1, 0.5))
    await first.log(2, trained(2, 0.75) | {"val_reward": 0.5, "val_rollouts": 4.0})
    await first.finish(succeeded=True)
    # `store train --steps 3` on the same output: resumes from the step-2 checkpoint, evaluates it again (the
    # second write of step 2), then trains step 3.
    resumed = await runs.start()
    await resumed.log(2, {"val_reward": 0.75, "val_rollouts": 4.0})
    await resumed.log(3, trained(3, 1.0) | {"val_reward": 1.0, "val_rollouts": 4.0})
    await resumed.finish(succeeded=True)

    run, later = first.run.rollout_id, resumed.run.rollout_id
    common = {"run_id": run, "algorithm": "grpo"}
    assert await steps(store) == [
        common
        | {"training_rollout_id": run, "step": 0, "resources_version": None}
        | {"reward_mean": None, "val_reward": 0.25, "loss": None},
        common
        | {"training_rollout_id": run, "step": 1, "resources_version": 2}
        | {"reward_mean": 0.5, "val_reward": None, "loss": 0.1},
        # The step both runs wrote: its training metrics stay, the new evaluation replaces the old one.
        common
        | {"training_rollout_id": later, "step": 2, "resources_version": 3}
        | {"reward_mean": 0.75, "val_reward": 0.75, "loss": pytest.approx(0.2)},
        common
        | {"training_rollout_id": later, "step": 3, "resources_version": 4}
        | {"reward_mean": 1.0, "val_reward": 1.0, "loss": pytest.approx(0.3)},
    ]
    # The full metrics, prefix dropped, each the newest write's: the same numbers as written, on both backends.
    (folded,) = await rows(store, "SELECT metrics FROM training_steps_v WHERE step = 2")
    metrics = folded["metrics"]
    assert (json.loads(metrics) if isinstance(metrics, str) else metrics) == {
        "reward_mean": 0.75,
        "loss": 0.1 * 2,
        "version": 3.0,
        "val_reward": 0.75,
        "val_rollouts": 4.0,
    }


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_run_started_afresh_is_a_run_of_its_own(store: SqlStore) -> None:
    runs = Runs(store)
    old = await runs.start()
    for step in (1, 2, 3):  # no validation tasks: the first write is step 1
        await old.log(step, trained(step, 0.5))
    # `--no-resume` on the same store: a new run from step 0 (with validation tasks this time).
    fresh = await runs.start()
    await fresh.log(0, {"val_reward": 0.0})
    await fresh.log(1, trained(1, 0.25))
    # Resumed from its step-1 checkpoint: the first write is the evaluation of step 1, so it continues `fresh`.
    resumed = await runs.start()
    await resumed.log(1, {"val_reward": 0.5})
    await resumed.log(2, trained(2, 0.75))
    # A run without validation tasks started afresh again: its first write is step 1 with training metrics.
    again = await runs.start("ppo")
    await again.log(1, trained(1, 1.0))

    found = [(r["run_id"], r["training_rollout_id"], r["step"], r["reward_mean"]) for r in await steps(store)]
    old_id, fresh_id, resumed_id, again_id = (log.run.rollout_id for log in (old, fresh, resumed, again))
    expected = [
        (old_id, old_id, 1, 0.5),
        (old_id, old_id, 2, 0.5),
        (old_id, old_id, 3, 0.5),
        (fresh_id, fresh_id, 0, None),
        (fresh_id, resumed_id, 1, 0.25),
        (fresh_id, resumed_id, 2, 0.75),
        (again_id, again_id, 1, 1.0),
    ]
    assert sorted(found, key=repr) == sorted(expected, key=repr)
    assert await rows(store, f"SELECT algorithm FROM training_steps_v WHERE run_id = '{again_id}'") == [
        {"algorithm": "ppo"}
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_resumed_run_continues_the_newest_run_of_its_own_algorithm(store: SqlStore) -> None:
    # Revision 0007: GRPO, then an APO run, then the GRPO run resumed. The resumed steps belong to the GRPO run,
    # not to the APO run that started in between; an APO run resumed in turn continues the APO run.
    runs = Runs(store)
    grpo = await runs.start("grpo")
    await grpo.log(0, {"val_reward": 0.25})
    await grpo.log(1, trained(1, 0.5))
    apo = await runs.start("apo")
    await apo.log(0, {"val_reward": 0.1})
    resumed = await runs.start("grpo")
    await resumed.log(1, {"val_reward": 0.5})
    await resumed.log(2, trained(2, 0.75))
    apo_resumed = await runs.start("apo")
    await apo_resumed.log(1, {"val_reward": 0.2})
    # A store whose first training-run rollout of an algorithm is a resumed one still starts a run with it.
    ppo = await runs.start("ppo")
    await ppo.log(4, trained(4, 1.0))

    found = {(r["run_id"], r["training_rollout_id"], r["step"], r["algorithm"]) for r in await steps(store)}
    g, a, r, ar, p = (log.run.rollout_id for log in (grpo, apo, resumed, apo_resumed, ppo))
    assert found == {
        (g, g, 0, "grpo"),
        (g, r, 1, "grpo"),
        (g, r, 2, "grpo"),
        (a, a, 0, "apo"),
        (a, ar, 1, "apo"),
        (p, p, 4, "ppo"),
    }


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_training_steps_ignore_what_is_not_a_step_metric(store: SqlStore) -> None:
    log = await Runs(store).start()
    await log.log(1, trained(1, 0.5))
    attempt = log.run.attempt.attempt_id

    def step_span(sequence_id: int, attributes: Mapping[str, Any]) -> Span:
        return span(log.run.rollout_id, attempt, sequence_id, "lightning_store.train.step", attributes=attributes)

    await store.add_many_spans(
        [
            step_span(10, {"step": 1, "metric.loss": "high", "metric.kl": [1], "note": 3}),  # newest, nothing usable
            step_span(11, {"step": "two", "metric.loss": 1.0}),  # no step: not a row
            step_span(12, {"step": 2.5, "metric.loss": 1.0}),  # not a whole step either
            step_span(13, {"step": 4}),  # a step without metrics
        ]
    )
    # The same span name on a rollout that is not a training run is not a training step.
    other = await store.start_rollout({"q": 1}, mode="train")
    await store.add_span(
        span(other.rollout_id, other.attempt.attempt_id, 1, "lightning_store.train.step", attributes={"step": 9})
    )

    found = await rows(store, "SELECT step, loss, kl, metrics FROM training_steps_v ORDER BY step")
    for row in found:
        row["metrics"] = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else row["metrics"]
    assert found == [
        {"step": 1, "loss": 0.1, "kl": None, "metrics": {"reward_mean": 0.5, "loss": 0.1, "version": 2.0}},
        {"step": 4, "loss": None, "kl": None, "metrics": {}},
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_rollouts_and_rewards_carry_version_step_and_task(store: SqlStore) -> None:
    metadata = {"task_id": "q7", "step": 3}
    rollout = await store.start_rollout({"q": 1}, mode="train", resources_id="policy", metadata=metadata)
    rollout_id, first = rollout.rollout_id, rollout.attempt.attempt_id
    await store.update_attempt(rollout_id, first, status="failed")
    second = await store.start_attempt(rollout_id)
    odd = await store.start_rollout({"q": 2}, mode="val", metadata={"task_id": 7, "step": 1.5})
    bare = await store.start_rollout({"q": 3})

    calls = [(first, 4), (second.attempt.attempt_id, 6), (second.attempt.attempt_id, 5)]
    async with store.engine.begin() as conn:
        for sequence_id, (attempt_id, version) in enumerate(calls, start=1):
            await conn.execute(
                sa.insert(llm_calls).values(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    span_id=f"call-{sequence_id}",
                    sequence_id=sequence_id,
                    resources_id="policy",
                    resources_version=version,
                    prompt_token_ids=[1],
                    response_token_ids=[2],
                    start_time=time.time(),
                )
            )
    reward = {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0}
    await store.add_many_spans(
        [
            span(rollout_id, first, 1, "agentlightning.annotation", attributes=reward),
            span(rollout_id, second.attempt.attempt_id, 2, "agentlightning.annotation", attributes=reward),
            span(odd.rollout_id, odd.attempt.attempt_id, 1, "agentlightning.annotation", attributes=reward),
        ]
    )

    # The version of an attempt is the lowest its LLM calls were served with; the rollout's, its latest attempt's.
    found = await rows(store, "SELECT rollout_id, attempt_id, resources_version, step, task_id FROM rewards_v")
    assert sorted(found, key=lambda r: (r["rollout_id"] != rollout_id, r["attempt_id"] != first)) == [
        {"rollout_id": rollout_id, "attempt_id": first, "resources_version": 4, "step": 3, "task_id": "q7"},
        {"rollout_id": rollout_id, "attempt_id": second.attempt.attempt_id}
        | {"resources_version": 5, "step": 3, "task_id": "q7"},
        # A step that is not a whole number and a task id that is not a string read as NULL on both backends.
        {"rollout_id": odd.rollout_id, "attempt_id": odd.attempt.attempt_id}
        | {"resources_version": None, "step": None, "task_id": None},
    ]
    by_id = {
        r["rollout_id"]: r
        for r in await rows(store, "SELECT rollout_id, resources_version, step, task_id FROM rollouts_v")
    }
    assert by_id[rollout_id] == {"rollout_id": rollout_id, "resources_version": 5, "step": 3, "task_id": "q7"}
    assert by_id[bare.rollout_id] == {
        "rollout_id": bare.rollout_id,
        "resources_version": None,
        "step": None,
        "task_id": None,
    }


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_spans_carry_their_status_message(store: SqlStore) -> None:
    rollout = await store.start_rollout({"q": 1})
    rollout_id, attempt_id = rollout.rollout_id, rollout.attempt.attempt_id
    failed = TraceStatus(status_code="ERROR", description="KeyError: 'question'")
    await store.add_many_spans(
        [
            span(rollout_id, attempt_id, 1, "agentlightning.exception", status=failed),
            span(rollout_id, attempt_id, 2, "llm"),
        ]
    )
    assert await rows(store, "SELECT sequence_id, status_code, status_message FROM spans_v ORDER BY sequence_id") == [
        {"sequence_id": 1, "status_code": "ERROR", "status_message": "KeyError: 'question'"},
        {"sequence_id": 2, "status_code": "UNSET", "status_message": None},
    ]
