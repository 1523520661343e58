"""The ``pareto`` search (after GEPA): keep every candidate that is best on some validation task, draw a parent
from that frontier in proportion to the tasks it wins, reflect on its rollouts on a training minibatch to
rewrite one template (round robin over the templates), and spend a full validation only on a child that beats
its parent on that same minibatch. With ``merge``, every ``merge_every`` rounds it also tries to combine two
frontier candidates that improved different templates of a common ancestor (no optimizer call)."""

from __future__ import annotations

from algorithms.apo.candidates import Candidate, merge_pair, select_pareto
from algorithms.apo.context import ApoRun, mean
from algorithms.apo.evaluation import OverBudget, Task
from algorithms.apo.optimizer import OptimizerBudgetSpent


async def search(run: ApoRun, rounds: int | None) -> None:
    """Rounds until ``rounds`` are done, the rollout or optimizer budget is spent, or every training task is
    solved; the seed is validated first."""
    await run.validate([run.seed])
    await run.record(run.seed, "seed")
    await run.log_round(0)
    solved_streak = 0
    round_ = 0
    while rounds is None or round_ < rounds:
        round_ += 1
        proposed_before = run.counters.proposed
        try:
            if run.config.merge and round_ % run.config.merge_every == 0 and await _merge(run, round_):
                await run.log_round(round_)
                continue
            outcome = await _reflect(run, round_)
        except (OverBudget, OptimizerBudgetSpent):
            if run.counters.proposed > proposed_before:  # the round proposed before the budget ended it
                await run.log_round(round_)
            break
        if outcome == "solved":
            solved_streak += 1
            if solved_streak * run.config.minibatch_size >= len(run.train):
                break  # the parent solves every training task it is shown: nothing left to learn from
            round_ -= 1
            continue
        solved_streak = 0
        await run.log_round(round_)


async def _reflect(run: ApoRun, round_: int) -> str:
    parent = select_pareto(run.pool, run.rng)
    name = run.names[(round_ - 1) % len(run.names)]
    minibatch = run.cycle.draw(run.config.minibatch_size)
    parent_outcomes = await run.evaluator.evaluate(parent, minibatch, "train")
    if all(o.score >= 1 for o in parent_outcomes):
        return "solved"
    child = await run.propose(round_, parent, name, parent_outcomes)
    if child is None:
        return "invalid"
    await _accept_or_reject(run, child, minibatch, mean(parent_outcomes))
    return "proposed"


async def _accept_or_reject(run: ApoRun, child: Candidate, minibatch: list[Task], parent_score: float) -> None:
    try:
        child_score = mean(await run.evaluator.evaluate(child, minibatch, "train"))
    except OverBudget:
        run.counters.rejected += 1
        await run.record(child, "unevaluated", "the rollout budget ran out before its minibatch test")
        raise
    scores = (child_score, parent_score)
    if child_score <= parent_score:
        run.counters.rejected += 1
        await run.record(child, "rejected", "no better than its parent on the minibatch", scores)
        return
    try:
        await run.validate([child])
    except OverBudget:
        run.counters.rejected += 1  # not accepted: it never reached the pool
        await run.record(child, "unevaluated", "the rollout budget ran out before its full validation", scores)
        raise
    run.counters.accepted += 1
    await run.record(child, "accepted", "", scores)


async def _merge(run: ApoRun, round_: int) -> bool:
    """Try one merge; False when no pair qualifies (the round then reflects instead)."""
    pair = merge_pair(run.pool, run.lineage, run.rng)
    if pair is None:
        return False
    first, second, ancestor = pair
    templates = {
        name: (first.templates[name] if first.templates[name] != ancestor.templates[name] else second.templates[name])
        for name in run.names
    }
    child = run.new_candidate(round_, templates, "merge", [first, second])
    if child.resources_id in run.tried_merges or any(c.resources_id == child.resources_id for c in run.pool):
        return False  # each merge is tried once (GEPA keeps the same record), so merge rounds cannot loop
    run.tried_merges.add(child.resources_id)
    run.counters.proposed += 1
    minibatch = run.cycle.draw(run.config.minibatch_size)
    first_out, second_out = await run.evaluator.evaluate_many([(first, minibatch), (second, minibatch)], "train")
    await _accept_or_reject(run, child, minibatch, max(mean(first_out), mean(second_out)))
    return True
