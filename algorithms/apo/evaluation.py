"""Evaluating a candidate on tasks: rollouts pinned to its resources, their scores and traces read back.

Every (candidate, task) pair has one rollout id, derived from the candidate's content and the task's, so the
store is the cache: a pair that any run of this store already evaluated is read back, not run again, and a
resumed run finds the rollouts it had enqueued. A rollout scores its last reward when it succeeded and 0 when it
failed, timed out or emitted no reward; one still unfinished at ``rollout_batch_timeout`` is cancelled and
scores 0, with that said in its error, so nothing leaves the mean unseen.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from algorithms.apo.budget import Budget
from algorithms.apo.candidates import Candidate
from algorithms.collect import task_id
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout, AttemptEnd, EnqueueRolloutRequest, Rollout, RolloutConfig
from lightning_store.transcript import attempt_error, last_reward

Split = Literal["train", "val", "test"]
TERMINAL = ("succeeded", "failed", "cancelled")
WAIT_SLICE_SECONDS = 30.0


@dataclass(frozen=True)
class Task:
    """A task with its content key (the cache's) and its group id (``metadata.task_id``)."""

    key: str
    task_id: str
    input: Any


def tasks_of(inputs: Sequence[Any]) -> list[Task]:
    return [Task(_content_key(value), task_id(value, i), value) for i, value in enumerate(inputs)]


def repeated(tasks: list[Task], repeats: int) -> list[Task]:
    """``tasks`` ``repeats`` times over, each repeat a pair of its own (its own rollout id, so the cache does not
    read the first rollout back as the second); the first repeat is the task itself, so a run with one repeat
    and a run with several share its rollouts."""
    return [
        Task(f"{task.key}#{n}" if n else task.key, task.task_id, task.input) for n in range(repeats) for task in tasks
    ]


def _content_key(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rollout_id_for(resources_id: str, task: Task) -> str:
    return "apo-" + hashlib.sha256(f"{resources_id}:{task.key}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Outcome:
    """One rollout's result: ``score`` (0 unless it succeeded with a reward) and, when it did not succeed, why."""

    task: Task
    rollout_id: str
    status: str
    score: float
    error: str | None = None


class OverBudget(Exception):
    """The evaluation would run more rollouts than the budget has left; nothing was enqueued."""


class Evaluator:
    """Evaluates candidates through ``store`` for the run ``run_id``, charging ``budget``."""

    def __init__(
        self, store: LightningStore, run_id: str, budget: Budget, config: RolloutConfig, batch_timeout: float
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.budget = budget
        self.config = config
        self.batch_timeout = batch_timeout
        self._published: set[str] = set()

    async def publish(self, candidate: Candidate) -> None:
        """Write the candidate's resources under its id unless they are there already (content-addressed:
        an existing snapshot of that id holds the same resources)."""
        rid = candidate.resources_id
        if rid in self._published:
            return
        if await self.store.get_resources_by_id(rid) is None:
            await self.store.update_resources(rid, candidate.resources)
        self._published.add(rid)

    async def evaluate(self, candidate: Candidate, tasks: Sequence[Task], split: Split) -> list[Outcome]:
        """One outcome per task, in order (see :meth:`evaluate_many`)."""
        return (await self.evaluate_many([(candidate, tasks)], split))[0]

    async def evaluate_many(
        self, work: Sequence[tuple[Candidate, Sequence[Task]]], split: Split
    ) -> list[list[Outcome]]:
        """Each candidate on its tasks, all rollouts enqueued at once and run side by side; one list of outcomes
        per entry, in order. Raises :class:`OverBudget`, before writing anything, when the rollouts this would
        newly charge do not fit the budget (test-split rollouts are outside the search budget)."""
        pairs = [(c, t, rollout_id_for(c.resources_id, t)) for c, tasks in work for t in tasks]
        if not pairs:
            return [[] for _ in work]
        for candidate, _ in work:
            await self.publish(candidate)
        ids = [i for _, _, i in pairs]
        found = {r.rollout_id: r for r in (await self.store.query_rollouts(rollout_id_in=sorted(set(ids)))).items}
        ours = [i for i in ids if i not in found or (found[i].metadata or {}).get("apo_run") == self.run_id]
        test = split == "test"
        needed = len(self.budget.new_charges(ours))
        if not test and not self.budget.affords_rollouts(needed):
            raise OverBudget(f"{needed} more rollouts needed, {self.budget.max_rollouts - self.budget.rollouts} left")
        missing = {i: (c, t) for c, t, i in pairs if i not in found}
        if missing:
            await self.store.enqueue_many_rollouts([self._request(i, c, t, split) for i, (c, t) in missing.items()])
        self.budget.charge_rollouts(ours, test=test)
        finished = await self._wait(ids)
        outcomes = await self._outcomes([t for _, t, _ in pairs], ids, finished)
        grouped, at = [], 0
        for _, tasks in work:
            grouped.append(outcomes[at : at + len(tasks)])
            at += len(tasks)
        return grouped

    def _request(self, rollout_id: str, candidate: Candidate, task: Task, split: Split) -> EnqueueRolloutRequest:
        return EnqueueRolloutRequest(
            rollout_id=rollout_id,
            input=task.input,
            mode=split,
            resources_id=candidate.resources_id,
            config=self.config,
            metadata={
                "task_id": task.task_id,
                "apo_run": self.run_id,
                "apo_candidate": candidate.resources_id,
                "apo_task": task.key,
                "apo_split": split,
            },
        )

    async def _wait(self, ids: list[str]) -> dict[str, Rollout]:
        """Wait for the rollouts (woken by the store); cancel what is unfinished at the batch timeout. The
        rollouts as they end, each with its latest attempt."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_timeout
        pending = sorted(set(ids))
        while pending:
            left = min(WAIT_SLICE_SECONDS, deadline - loop.time())
            if left <= 0:
                await self._stop(pending)
                break
            done = {r.rollout_id for r in await self.store.wait_for_rollouts(rollout_ids=pending, timeout=left)}
            pending = [i for i in pending if i not in done]
        return {r.rollout_id: r for r in (await self.store.query_rollouts(rollout_id_in=sorted(set(ids)))).items}

    async def _stop(self, rollout_ids: list[str]) -> None:
        """End this run's unfinished rollouts at the batch timeout, for good: a running attempt ends ``timeout``
        (not retried; its runner's own end is then refused), a queued rollout is cancelled. Another run's
        rollouts are left alone (they score 0 here, unfinished)."""
        found = (await self.store.query_rollouts(rollout_id_in=rollout_ids)).items
        for rollout in found:
            if (rollout.metadata or {}).get("apo_run") != self.run_id or rollout.status in TERMINAL:
                continue
            if isinstance(rollout, AttemptedRollout) and rollout.status in ("preparing", "running"):
                ending = AttemptEnd(
                    rollout_id=rollout.rollout_id, attempt_id=rollout.attempt.attempt_id, status="timeout"
                )
                await self.store.end_attempts([ending])
            else:
                await self.store.update_rollout(rollout.rollout_id, status="cancelled")

    async def _outcomes(self, tasks: Sequence[Task], ids: list[str], rollouts: dict[str, Rollout]) -> list[Outcome]:
        attempted = {i: r for i, r in rollouts.items() if isinstance(r, AttemptedRollout)}
        spans_by: dict[str, list[Any]] = {i: [] for i in attempted}
        if attempted:
            page = await self.store.search_spans(
                rollout_ids=sorted(attempted),
                attempt_ids=sorted({r.attempt.attempt_id for r in attempted.values()}),
                limit=-1,
            )
            for span in page.items:
                spans_by[span.rollout_id].append(span)
        outcomes = []
        for task, rollout_id in zip(tasks, ids, strict=True):
            rollout = rollouts.get(rollout_id)
            status = rollout.status if rollout is not None else "missing"
            spans = spans_by.get(rollout_id, [])
            reward = last_reward(spans) if status == "succeeded" else None
            error = None
            if status != "succeeded":
                error = _why(rollout, spans, self.batch_timeout)
            elif reward is None:
                error = "the rollout succeeded but emitted no reward"
            outcomes.append(Outcome(task, rollout_id, status, float(reward or 0.0), error))
        return outcomes


def _why(rollout: Rollout | None, spans: list[Any], timeout: float) -> str:
    if rollout is None:
        return "the rollout is missing from the store"
    if rollout.status == "cancelled" or (isinstance(rollout, AttemptedRollout) and rollout.attempt.status == "timeout"):
        return f"stopped: not finished within rollout_batch_timeout ({timeout:g} s) or the rollout's timeout"
    if isinstance(rollout, AttemptedRollout):
        return attempt_error(rollout.attempt, spans) or f"rollout {rollout.status}"
    return f"rollout {rollout.status}"
