"""The ``beam`` search, Agent Lightning 0.3's loop with its option names: each round every beam member runs on
``gradient_batch_size`` training tasks and gets ``branch_factor`` children, each from a critique of a random
sample of those rollouts and a rewrite; the beam and the children are scored on one shared random validation
minibatch of ``val_batch_size`` and the top ``beam_width`` survive; the round's leader is scored on the whole
validation set. Unlike 0.3, invalid rewrites cost no rollout, the best (not the last) candidate is published,
and unfinished rollouts score 0 instead of leaving the mean."""

from __future__ import annotations

import contextlib

from algorithms.apo.candidates import Candidate
from algorithms.apo.context import ApoRun, mean
from algorithms.apo.evaluation import OverBudget
from algorithms.apo.optimizer import OptimizerBudgetSpent


async def search(run: ApoRun, rounds: int | None) -> None:
    c = run.config
    if c.run_initial_validation:
        await run.validate([run.seed])
    await run.record(run.seed, "seed")
    await run.log_round(0)
    beam = [run.seed]
    for round_ in range(1, (rounds or c.beam_rounds) + 1):
        try:
            beam = await _round(run, round_, beam)
        except (OverBudget, OptimizerBudgetSpent):
            break
        await run.log_round(round_)
    if not run.pool:  # without an initial validation and no round finished: the seed is what there is
        with contextlib.suppress(OverBudget):
            await run.validate([run.seed])


async def _round(run: ApoRun, round_: int, beam: list[Candidate]) -> list[Candidate]:
    c = run.config
    children: list[Candidate] = []
    spent: OptimizerBudgetSpent | None = None  # the children proposed before the calls ran out are still scored
    for parent in beam:
        if spent is not None:
            break
        batch = run.rng.sample(run.train, min(c.gradient_batch_size, len(run.train)))
        outcomes = await run.evaluator.evaluate(parent, batch, "train")
        for branch in range(c.branch_factor):
            sample = run.rng.sample(outcomes, min(c.reflection_rollouts, len(outcomes)))
            name = run.names[(round_ - 1 + branch) % len(run.names)]
            try:
                child = await run.propose(round_, parent, name, sample)
            except OptimizerBudgetSpent as error:
                spent = error
                break
            if child is not None and all(x.resources_id != child.resources_id for x in [*beam, *children]):
                children.append(child)
    if not children and spent is not None:
        raise spent
    contenders = [*beam, *children]
    minibatch = run.rng.sample(run.val, min(c.val_batch_size, len(run.val)))
    try:
        results = await run.evaluator.evaluate_many([(x, minibatch) for x in contenders], "val")
    except OverBudget:
        for child in children:
            run.counters.rejected += 1
            await run.record(child, "unevaluated", "the rollout budget ran out before the beam's validation")
        raise
    scored = {x.ordinal: mean(r) for x, r in zip(contenders, results, strict=True)}
    kept = sorted(contenders, key=lambda x: (-scored[x.ordinal], x.ordinal))[: c.beam_width]
    leader = kept[0]
    over: OverBudget | None = None
    if all(p.resources_id != leader.resources_id for p in run.pool):
        try:
            await run.validate([leader])
        except OverBudget as error:
            over = error  # the children are recorded first
    for child in children:
        parent_score = scored[next(x.ordinal for x in beam if x.resources_id == child.parents[0])]
        scores = (scored[child.ordinal], parent_score)
        if child in kept:
            run.counters.accepted += 1
            await run.record(child, "accepted", "", scores)
        else:
            run.counters.rejected += 1
            reason = f"not in the top {c.beam_width} on the validation minibatch"
            await run.record(child, "rejected", reason, scores)
    if over is not None:
        raise over
    if spent is not None:
        await run.log_round(round_)  # the caller stops without logging this last, shortened round
        raise spent
    return kept
