"""Candidates (a set of prompt templates, published as a resources snapshot) and the pool they are chosen from:
the best by validation mean, a beam's top, and GEPA's per-task Pareto frontier."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Literal

from lightning_store.resources import NamedResources, PromptTemplate

Origin = Literal["seed", "reflection", "merge"]
Status = Literal["seed", "accepted", "rejected", "invalid", "unevaluated"]


@dataclass
class Candidate:
    """``templates`` are the optimized templates by name; ``resources`` the whole snapshot the agents get (the
    seed's other resources, e.g. its LLM, with these templates); ``resources_id`` is derived from its content,
    so the same prompts are the same candidate in every run of a store (the evaluation cache's key)."""

    ordinal: int
    round: int
    templates: dict[str, PromptTemplate]
    resources: NamedResources
    origin: Origin
    parents: list[str] = field(default_factory=list)
    template_name: str = ""
    critique: str = ""
    val_scores: dict[str, float] = field(default_factory=dict)
    """Score per validation task key, once evaluated on the full validation set."""

    @property
    def resources_id(self) -> str:
        return resources_id_of(self.resources)

    @property
    def val_score(self) -> float:
        return sum(self.val_scores.values()) / len(self.val_scores) if self.val_scores else 0.0


def resources_id_of(resources: NamedResources) -> str:
    """``apo-`` and 16 hex digits of the snapshot's canonical JSON."""
    canonical = json.dumps({k: v.model_dump(mode="json") for k, v in resources.items()}, sort_keys=True)
    return "apo-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_templates(base: NamedResources, templates: dict[str, PromptTemplate]) -> NamedResources:
    return {**base, **templates}


def best(pool: list[Candidate]) -> Candidate:
    """The highest validation mean; the earliest on a tie (the seed wins ties, so no change without evidence)."""
    return max(pool, key=lambda c: (c.val_score, -c.ordinal))


def pareto_weights(pool: list[Candidate]) -> dict[int, int]:
    """GEPA's selection weights: for each validation task, the candidates with the best score on it (tasks that
    every candidate fails are left out); candidates whose every such task is also won by another remaining
    candidate are dropped, weakest first; each remaining candidate weighs the number of tasks it wins."""
    by_ordinal = {c.ordinal: c for c in pool}
    tasks = sorted({t for c in pool for t in c.val_scores})
    fronts: list[set[int]] = []
    for task in tasks:
        top = max(c.val_scores.get(task, 0.0) for c in pool)
        if top > 0:
            fronts.append({c.ordinal for c in pool if c.val_scores.get(task, 0.0) == top})
    remaining = {o for front in fronts for o in front}
    for ordinal in sorted(remaining, key=lambda o: (by_ordinal[o].val_score, -o)):
        mine = [front for front in fronts if ordinal in front]
        if all(len((front & remaining) - {ordinal}) > 0 for front in mine):
            remaining.discard(ordinal)
    return {o: sum(o in front for front in fronts) for o in sorted(remaining)}


def select_pareto(pool: list[Candidate], rng: random.Random) -> Candidate:
    """A parent drawn from the Pareto frontier in proportion to its weight; the best when no task is won."""
    weights = pareto_weights(pool)
    if not weights:
        return best(pool)
    ordinals = list(weights)
    chosen = rng.choices(ordinals, weights=[weights[o] for o in ordinals])[0]
    return next(c for c in pool if c.ordinal == chosen)


def merge_pair(
    pool: list[Candidate], lineage: dict[str, list[str]], rng: random.Random
) -> tuple[Candidate, Candidate, Candidate] | None:
    """Two frontier candidates that descend from a common ancestor and changed different templates since it,
    with that ancestor: ``(first, second, ancestor)``; None when there is no such pair."""
    frontier = [c for c in pool if c.ordinal in pareto_weights(pool)]
    by_id = {c.resources_id: c for c in pool}
    pairs = []
    for i, a in enumerate(frontier):
        for b in frontier[i + 1 :]:
            common = _ancestors(a.resources_id, lineage) & _ancestors(b.resources_id, lineage)
            for ancestor_id in sorted(common, key=lambda r: -by_id[r].ordinal if r in by_id else 0):
                ancestor = by_id.get(ancestor_id)
                if ancestor is None:
                    continue
                changed_a = {n for n, t in a.templates.items() if t != ancestor.templates[n]}
                changed_b = {n for n, t in b.templates.items() if t != ancestor.templates[n]}
                if changed_a and changed_b and not (changed_a & changed_b):
                    pairs.append((a, b, ancestor))
                break  # the nearest common ancestor only
    return rng.choice(pairs) if pairs else None


def _ancestors(resources_id: str, lineage: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = list(lineage.get(resources_id, []))
    while stack:
        parent = stack.pop()
        if parent not in seen:
            seen.add(parent)
            stack.extend(lineage.get(parent, []))
    return seen
