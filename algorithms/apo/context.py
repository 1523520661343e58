"""What both search strategies share: the pool of evaluated candidates, proposing a rewrite by reflection (critique,
then rewrite, then the template check), and writing each candidate and each round into the store.

A candidate's record is a span ``lightning_store.apo.candidate`` of the run's rollout, written once its fate is
known; a round's metrics are a ``lightning_store.train.step`` span as RL's steps are. Span ids derive from the
candidate's ordinal and the round, so a resumed run that replays its search writes nothing twice.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from algorithms.apo.budget import Budget
from algorithms.apo.candidates import Candidate, Status, best, pareto_weights, with_templates
from algorithms.apo.config import ApoConfig
from algorithms.apo.evaluation import Evaluator, Outcome, Task
from algorithms.apo.optimizer import Optimizer, OptimizerBudgetSpent
from algorithms.apo.reflection import (
    critique_messages,
    edit_messages,
    instructions,
    order_for_reflection,
    parse_rewrite,
    report,
)
from algorithms.apo.templates import check_rewrite
from algorithms.session import MetricsLog
from lightning_store.contract import LightningStore
from lightning_store.resources import NamedResources, PromptTemplate

CANDIDATE_SPAN = "lightning_store.apo.candidate"
RESULT_SPAN = "lightning_store.apo.result"
_CANDIDATE_SPAN_BASE = 0xC000000000000000
RESULT_SPAN_ID = "e000000000000000"


@dataclass
class Counters:
    proposed: int = 0
    invalid: int = 0
    rejected: int = 0
    accepted: int = 0


@dataclass
class TaskCycle:
    """Draws training minibatches without replacement, reshuffling (seeded) when the tasks are used up."""

    tasks: Sequence[Task]
    rng: random.Random
    _order: list[int] = field(default_factory=list)

    def draw(self, count: int) -> list[Task]:
        chosen: list[Task] = []
        wanted = min(count, len({t.key for t in self.tasks}))  # identical tasks are one task
        while len(chosen) < wanted:
            if not self._order:
                self._order = list(range(len(self.tasks)))
                self.rng.shuffle(self._order)
            index = self._order.pop()
            if all(t.key != self.tasks[index].key for t in chosen):
                chosen.append(self.tasks[index])
        return chosen


class ApoRun:
    """One APO run's state and its writes; the strategies (``pareto``, ``beam``) drive it."""

    def __init__(
        self,
        config: ApoConfig,
        store: LightningStore,
        log: MetricsLog,
        evaluator: Evaluator,
        optimizer: Optimizer,
        budget: Budget,
        base: NamedResources,
        seed_templates: dict[str, PromptTemplate],
        train: Sequence[Task],
        val: Sequence[Task],
    ) -> None:
        self.config = config
        self.store = store
        self.log = log
        self.evaluator = evaluator
        self.optimizer = optimizer
        self.budget = budget
        self.base = base
        self.names = list(seed_templates)
        self.train = list(train)
        self.val = list(val)
        self.rng = random.Random(config.seed)
        self.cycle = TaskCycle(self.train, random.Random(config.seed + 1))
        self.counters = Counters()
        self.pool: list[Candidate] = []
        """Candidates scored on the whole validation set."""
        self.lineage: dict[str, list[str]] = {}
        self.tried_merges: set[str] = set()
        self._ordinal = 0
        self._started = time.monotonic()
        self._critique_system = instructions(config.critique_prompt_file, "critique.md")
        self._edit_system = instructions(config.edit_prompt_file, "edit.md")
        self.seed = self.new_candidate(0, seed_templates, "seed")

    def new_candidate(
        self,
        round_: int,
        templates: dict[str, PromptTemplate],
        origin: Any,
        parents: Sequence[Candidate] = (),
        template_name: str = "",
        critique: str = "",
    ) -> Candidate:
        candidate = Candidate(
            ordinal=self._ordinal,
            round=round_,
            templates=dict(templates),
            resources=with_templates(self.base, templates),
            origin=origin,
            parents=[p.resources_id for p in parents],
            template_name=template_name,
            critique=critique,
        )
        self._ordinal += 1
        self.lineage.setdefault(candidate.resources_id, candidate.parents)
        return candidate

    # Evaluation -------------------------------------------------------------------------------------------

    async def validate(self, candidates: Sequence[Candidate]) -> None:
        """Score candidates on the whole validation set and add them to the pool (``OverBudget`` propagates)."""
        results = await self.evaluator.evaluate_many([(c, self.val) for c in candidates], "val")
        for candidate, outcomes in zip(candidates, results, strict=True):
            candidate.val_scores = {o.task.key: o.score for o in outcomes}
            if all(c.resources_id != candidate.resources_id for c in self.pool):
                self.pool.append(candidate)

    def best(self) -> Candidate:
        return best(self.pool) if self.pool else self.seed

    # Reflection -------------------------------------------------------------------------------------------

    async def propose(self, round_: int, parent: Candidate, name: str, outcomes: Sequence[Outcome]) -> Candidate | None:
        """Critique ``parent``'s template ``name`` on ``outcomes``, rewrite it, check the rewrite. An invalid
        rewrite is recorded (status ``invalid``) and None returned; no rollout runs for it.
        ``OptimizerBudgetSpent`` propagates when fewer than two calls are left."""
        if not self.budget.affords_calls(2):
            raise OptimizerBudgetSpent()
        template = parent.templates[name]
        others = [n for n in self.names if n != name]
        shown = order_for_reflection(outcomes, self.config.reflection_rollouts)
        rollouts = await report(self.store, shown, self.config.trace_chars)
        critique = await self.optimizer.complete(
            "critique",
            critique_messages(self._critique_system, name, template, others, rollouts),
            temperature=self.config.critique_temperature,
            model=self.config.gradient_model,
            max_tokens=self.config.optimizer_max_tokens,
        )
        rewrite = await self.optimizer.complete(
            "edit",
            edit_messages(self._edit_system, name, template, others, critique.text),
            temperature=self.config.diversity_temperature,
            model=self.config.apply_edit_model,
            max_tokens=self.config.optimizer_max_tokens,
        )
        self.counters.proposed += 1
        text = parse_rewrite(rewrite.text)
        verdict = check_rewrite(template, text)
        child_templates = {**parent.templates, name: PromptTemplate(template=text, engine=template.engine)}
        child = self.new_candidate(round_, child_templates, "reflection", [parent], name, critique.text)
        if not verdict.ok:
            self.counters.invalid += 1
            self.counters.rejected += 1
            await self.record(child, "invalid", verdict.reason)
            return None
        return child

    # Records ----------------------------------------------------------------------------------------------

    async def record(
        self,
        candidate: Candidate,
        status: Status,
        reason: str = "",
        minibatch: tuple[float, float] | None = None,
    ) -> None:
        """The candidate's span; ``minibatch`` is (its score, its parent's score) on the acceptance minibatch."""
        attributes: dict[str, Any] = {
            "apo.candidate": candidate.ordinal,
            "apo.round": candidate.round,
            "apo.resources_id": "" if status == "invalid" else candidate.resources_id,
            "apo.parent": candidate.parents[0] if candidate.parents else "",
            "apo.parents": json.dumps(candidate.parents),
            "apo.origin": candidate.origin,
            "apo.template": candidate.template_name,
            "apo.status": status,
            "apo.reason": reason,
            "apo.critique": candidate.critique,
            "apo.templates": json.dumps({n: t.template for n, t in candidate.templates.items()}),
            "apo.rollouts_spent": self.budget.rollouts,
            "apo.optimizer_calls_spent": self.budget.calls,
            "apo.optimizer_tokens_spent": self.budget.tokens,
        }
        if minibatch is not None:
            attributes["apo.minibatch_score"], attributes["apo.parent_minibatch_score"] = minibatch
        if candidate.val_scores:
            attributes["apo.val_score"] = candidate.val_score
            attributes["apo.val_tasks"] = len(candidate.val_scores)
        await self.span(CANDIDATE_SPAN, f"{_CANDIDATE_SPAN_BASE + candidate.ordinal:016x}", attributes)

    async def span(self, name: str, span_id: str, attributes: dict[str, Any]) -> None:
        await self.log.add_span(name, span_id, attributes)

    async def log_round(self, round_: int) -> dict[str, float]:
        leader = self.best()
        scores = [c.val_score for c in self.pool]
        metrics = {
            "val_reward": leader.val_score,
            "val_best": leader.val_score,
            "val_mean": sum(scores) / len(scores) if scores else 0.0,
            "candidates_proposed": float(self.counters.proposed),
            "candidates_invalid": float(self.counters.invalid),
            "candidates_rejected": float(self.counters.rejected),
            "candidates_accepted": float(self.counters.accepted),
            "rollouts_spent": float(self.budget.rollouts),
            "optimizer_calls": float(self.budget.calls),
            "optimizer_tokens": float(self.budget.tokens),
            "pool_size": float(len(self.pool)),
            "frontier_size": float(len(pareto_weights(self.pool))),
            "round_seconds": time.monotonic() - self._started,
        }
        self._started = time.monotonic()
        await self.log.log(round_, metrics)
        return metrics


def mean(outcomes: Sequence[Outcome]) -> float:
    return sum(o.score for o in outcomes) / len(outcomes) if outcomes else 0.0
