"""Collecting rollouts for a training step: enqueue ``tasks × G`` rollouts and wait for them (push, not poll),
or, in asynchronous mode, keep the queue topped up and take whatever has finished.

Each rollout carries ``metadata.task_id`` (GRPO groups by it), the training step that enqueued it and the
training run's rollout (``training_run_id``). The policy's resources live under one id
(:data:`POLICY_RESOURCES_ID`) whose version the trainer bumps after each update; the proxy records the version
that was current for every LLM call, which is how staleness is measured.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_store.contract import LightningStore
from lightning_store.models import EnqueueRolloutRequest, RolloutConfig, RolloutMode
from lightning_store.resources import LLM, ResourcesUpdate

POLICY_RESOURCES_ID = "policy"
POLICY_LLM = "main_llm"
"""The name of the trained policy's llm resource within :data:`POLICY_RESOURCES_ID`."""
WAIT_SLICE_SECONDS = 30.0


def task_id(task: Any, index: int) -> str:
    """A task's group key: its own ``id``/``task_id`` field when it has one, else its position in the dataset."""
    if isinstance(task, dict):
        for key in ("task_id", "id"):
            if key in task:
                return str(task[key])
    return f"task-{index}"


@dataclass
class TaskSampler:
    """Draws ``per_step`` tasks per step without replacement until the dataset is used up, then reshuffles
    (seeded, so a run is reproducible)."""

    tasks: Sequence[Any]
    per_step: int
    seed: int = 0
    _order: list[int] = field(default_factory=list)
    _epoch: int = 0

    def draw(self) -> list[tuple[str, Any]]:
        if not self.tasks:
            raise ValueError("no training tasks")
        chosen = []
        for _ in range(min(self.per_step, len(self.tasks))):
            if not self._order:
                self._order = list(range(len(self.tasks)))
                random.Random(self.seed * 1_000_003 + self._epoch).shuffle(self._order)
                self._epoch += 1
            index = self._order.pop()
            chosen.append((task_id(self.tasks[index], index), self.tasks[index]))
        return chosen


async def publish_policy(store: LightningStore, llm: LLM) -> ResourcesUpdate:
    """Publish ``llm`` as the policy (:data:`POLICY_LLM` of :data:`POLICY_RESOURCES_ID`), keeping the other
    resources of that id: an LLM registered beside the policy (a judge the agents reach by its name) or a prompt
    template stays in every version the trainer publishes."""
    current = await store.get_resources_by_id(POLICY_RESOURCES_ID)
    kept = {name: r for name, r in (current.resources.items() if current else ()) if name != POLICY_LLM}
    return await store.update_resources(POLICY_RESOURCES_ID, {POLICY_LLM: llm, **kept})


async def enqueue_groups(
    store: LightningStore,
    tasks: Sequence[tuple[str, Any]],
    group_size: int,
    *,
    step: int,
    config: RolloutConfig,
    mode: RolloutMode = "train",
    run_id: str | None = None,
) -> list[str]:
    """Enqueue ``group_size`` rollouts per task in one transaction; their ids, in order. ``run_id``: the training
    run's rollout, recorded as ``metadata.training_run_id`` (``store export --run`` selects by it)."""
    run = {} if run_id is None else {"training_run_id": run_id}
    requests = [
        EnqueueRolloutRequest(
            input=task,
            mode=mode,
            resources_id=POLICY_RESOURCES_ID,
            config=config,
            metadata={"task_id": tid, "step": step, **run},
        )
        for tid, task in tasks
        for _ in range(group_size)
    ]
    return [r.rollout_id for r in await store.enqueue_many_rollouts(requests)]


async def wait_all(store: LightningStore, rollout_ids: Sequence[str], *, timeout: float | None = None) -> None:
    """Wait until every rollout is terminal (woken by the store, in slices so a server restart is survived)."""
    pending = set(rollout_ids)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while pending:
        left = WAIT_SLICE_SECONDS if deadline is None else min(WAIT_SLICE_SECONDS, deadline - loop.time())
        if left <= 0:
            raise TimeoutError(f"{len(pending)} rollouts did not finish within {timeout} s")
        done = await store.wait_for_rollouts(rollout_ids=sorted(pending), timeout=left)
        pending -= {r.rollout_id for r in done}


async def take_finished(store: LightningStore, in_flight: list[str], wanted: int) -> list[str]:
    """Asynchronous mode: wait until the oldest ``wanted`` of ``in_flight`` (enqueue order) are terminal, woken
    by the store as :func:`wait_all` is, and return every one of ``in_flight`` that is terminal by then, in
    enqueue order; they are removed from ``in_flight``. The queue is first in, first out, so the oldest are the
    first to finish, and a batch's groups come back whole."""
    await wait_all(store, in_flight[:wanted])
    finished = {r.rollout_id for r in await store.wait_for_rollouts(rollout_ids=list(in_flight), timeout=0)}
    taken = [r for r in in_flight if r in finished]
    in_flight[:] = [r for r in in_flight if r not in finished]
    return taken


async def evaluate(
    store: LightningStore,
    tasks: Sequence[Any],
    repeats: int,
    *,
    step: int,
    config: RolloutConfig,
    run_id: str | None = None,
) -> dict[str, float]:
    """Run every task ``repeats`` times (mode ``val``) with the current policy; the mean reward (a rollout
    that failed or emitted no reward counts 0) and how many rollouts it is over."""
    from adapters import read_episodes

    chosen = [(task_id(task, i), task) for i, task in enumerate(tasks)]
    ids = await enqueue_groups(store, chosen, repeats, step=step, config=config, mode="val", run_id=run_id)
    await wait_all(store, ids)
    batch = await read_episodes(store, ids)
    rewards = [e.reward or 0.0 for e in batch.episodes]
    return {"val_reward": sum(rewards) / len(ids), "val_rollouts": float(len(ids))}
