"""One policy update from a batch of transitions: the step every LightningRL algorithm shares.

Old log-probabilities are recomputed with the policy before the update rather than taken from the policy
server (whose behaviour log-probs differ by padding, batching and kernels; their distance to the recomputed ones
is reported as ``logprob_mismatch``). When a step makes a single optimizer step (one epoch, one mini-batch) the
old policy *is* the policy being differentiated, so the old log-probs are the training pass's own, detached, and
the separate pass is skipped (a third of the step's compute; TRL does the same with ``num_iterations=1``).
Each optimizer step accumulates gradients over micro-batches of transitions, normalized by the token count
of the whole mini-batch, so the micro-batch size changes memory use and not the result.

Every pass runs over *rows* (:mod:`algorithms.training.packing`): the calls of one conversation whose prompts
extend each other share one sequence, and each call's outputs are read at its own positions, so the loss is the
one of separate sequences. A row counts as one in a micro-batch (its length is its longest call's), and
mini-batches are drawn over rows; with packing off every call is a row, as before.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from adapters import Transition
from algorithms.training.optimization import LocalOptimization, Optimization
from algorithms.training.packing import pack
from algorithms.training.pg_core import policy_loss, token_entropy_sum, value_loss
from algorithms.training.policy import Forward, TrainablePolicy, packed_token_batch

NO_GRAD_BATCHES = 4
"""Micro-batches per forward pass when measuring (no gradients, so no stored activations)."""

Item = TypeVar("Item")


@dataclass
class Rollouts:
    """Per transition, tensors aligned to its response tokens: ``[N, T]`` (padded, with ``mask``).
    ``old_logprobs`` is None when they are taken from the training pass itself (a single optimizer step)."""

    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    mask: torch.Tensor

    def select(self, indices: list[int]) -> Rollouts:
        def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[indices]

        return Rollouts(pick(self.old_logprobs), pick(self.ref_logprobs), pick(self.values), self.mask[indices])


@dataclass
class Anchors:
    """Calls of agents that are not being trained but share the model (selective optimization): a KL term to
    the reference policy on their tokens, of weight ``beta`` (token mean over the anchors, added to each
    optimizer step's loss), holds their behaviour in place while the trained agents' updates move the shared
    weights. ``ref_logprobs`` and ``mask`` are ``[M, T]``."""

    transitions: Sequence[Transition]
    ref_logprobs: torch.Tensor
    mask: torch.Tensor
    beta: float


@dataclass(frozen=True)
class UpdateSettings:
    clip_eps: float
    kl_beta: float
    micro_batch_size: int
    mini_batches: int
    epochs: int
    max_grad_norm: float | None
    value_clip: float = 0.2
    value_coef: float = 0.5
    seed: int = 0


def _chunks(items: Sequence[Item], size: int) -> list[list[Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def _forward(
    policy: TrainablePolicy, transitions: Sequence[Transition], rows: Sequence[list[int]], *, reference: bool = False
) -> tuple[Forward, list[int]]:
    """One pass over ``rows`` (lists of transition indices, see :mod:`algorithms.training.packing`): its outputs,
    one row per call, and the calls' transition indices in that order."""
    batch = packed_token_batch(
        [[(transitions[i].prompt_ids, transitions[i].response_ids) for i in row] for row in rows], policy.pad_id
    )
    return policy.forward(batch, reference=reference), [i for row in rows for i in row]


@torch.no_grad()
def measure(
    policy: TrainablePolicy,
    transitions: Sequence[Transition],
    micro_batch_size: int,
    *,
    old_logprobs: bool = True,
    with_values: bool = True,
    packing: bool = True,
) -> Rollouts:
    """Old (pre-update) log-probs, reference log-probs and values of every transition. With ``old_logprobs``
    False the policy's own pass is skipped unless its value head needs it (``with_values``)
    (``Rollouts.old_logprobs`` is None). ``packing`` packs conversations (:mod:`algorithms.training.packing`):
    the same values, fewer sequences."""
    policy.model.eval()
    count = len(transitions)
    width = max(len(t.response_ids) for t in transitions)
    own_pass = old_logprobs or (with_values and policy.value_head is not None)
    mask = _pad_rows([torch.ones(len(t.response_ids)) for t in transitions], width)
    olds, refs, values = torch.zeros(count, width), torch.zeros(count, width), torch.zeros(count, width)
    rows = pack(transitions, enabled=packing).rows
    # Passes without gradients keep no activations: they take several micro-batches at once (on a small model
    # each forward pass costs mostly its fixed overhead).
    for chunk in _chunks(rows, micro_batch_size * NO_GRAD_BATCHES):
        if own_pass:
            out, calls = _forward(policy, transitions, chunk)
            _place(olds, calls, out.logprobs)
            if out.values is not None:
                _place(values, calls, out.values)
        if policy.uses_reference:
            out, calls = _forward(policy, transitions, chunk, reference=True)
            _place(refs, calls, out.logprobs)
    return Rollouts(
        old_logprobs=olds * mask if own_pass else None,
        ref_logprobs=refs * mask if policy.uses_reference else None,
        values=values * mask if own_pass and policy.value_head is not None else None,
        mask=mask,
    )


def _place(target: torch.Tensor, calls: list[int], rows: torch.Tensor) -> None:
    """Writes each call's row of ``rows`` ``[C, T]`` into its transition's row of ``target``."""
    target[calls, : rows.shape[1]] = rows.float()


@torch.no_grad()
def anchor(
    policy: TrainablePolicy,
    transitions: Sequence[Transition],
    micro_batch_size: int,
    beta: float,
    *,
    packing: bool = True,
) -> Anchors:
    """:class:`Anchors` of ``transitions``: their reference log-probs, measured now (the reference pass only;
    ``packing`` as in :func:`measure`)."""
    measured = measure(policy, transitions, micro_batch_size, old_logprobs=False, with_values=False, packing=packing)
    if measured.ref_logprobs is None:
        raise ValueError("anchors need the policy's reference (TrainablePolicy(reference=True))")
    return Anchors(transitions, measured.ref_logprobs, measured.mask, beta)


def _anchor_step(
    policy: TrainablePolicy,
    anchors: Anchors,
    rows: list[list[int]],
    settings: UpdateSettings,
    optimization: Optimization,
    totals: dict[str, float],
) -> None:
    """Accumulates the gradient of ``beta`` × the token-mean k3 KL of the anchor calls in ``rows`` (the
    policy-gradient core with zero advantages: only its KL term is left); this rank's share of them."""
    norm = float(anchors.mask[[i for row in rows for i in row]].sum()) / optimization.world
    for micro in _shard(rows, settings.micro_batch_size, optimization):
        out, calls = _forward(policy, anchors.transitions, micro or rows[:1])
        if micro is None:
            optimization.backward(_nothing(out))
            continue
        width = out.logprobs.shape[1]
        mask = anchors.mask[calls, :width]
        terms = policy_loss(
            out.logprobs,
            out.logprobs.detach(),
            torch.zeros_like(mask),
            mask,
            clip_eps=settings.clip_eps,
            ref_logprobs=anchors.ref_logprobs[calls, :width],
            kl_beta=anchors.beta,
            total_tokens=norm,
        )
        optimization.backward(terms.loss)
        totals["anchor_kl"] += terms.kl_sum
        totals["anchor_tokens"] += terms.tokens


def _shard(rows: list[Item], micro_batch_size: int, optimization: Optimization) -> list[list[Item] | None]:
    """This rank's micro-batches of ``rows`` (every ``world``-th row), padded with ``None`` to the count that
    every rank makes: each backward pass is a collective under ZeRO-2, so all ranks must make as many."""
    mine = _chunks(rows[optimization.rank :: optimization.world], micro_batch_size)
    count = math.ceil(math.ceil(len(rows) / optimization.world) / micro_batch_size)
    return [*mine, *([None] * (count - len(mine)))]


def _nothing(out: Forward) -> torch.Tensor:
    """A zero loss over the whole forward graph: the backward pass of a padding micro-batch, which reaches
    every parameter (with zero gradients) as the real ones do."""
    zero = out.logprobs.sum() * 0.0
    return zero if out.values is None else zero + out.values.sum() * 0.0


def update(
    policy: TrainablePolicy,
    transitions: Sequence[Transition],
    advantages: torch.Tensor,
    rollouts: Rollouts,
    settings: UpdateSettings,
    returns: torch.Tensor | None = None,
    anchors: Anchors | None = None,
    optimization: Optimization | None = None,
    *,
    packing: bool = True,
) -> dict[str, float]:
    """Optimize the policy on ``transitions`` with per-token ``advantages`` ``[N, T]`` (and, for PPO, value
    ``returns``), holding the ``anchors`` near the reference; the step's metrics. The anchors are spread over
    the optimizer steps of each epoch, a share of them in each.

    ``optimization`` turns gradients into steps (default: the policy's own optimizer in this process). Under
    data parallelism every rank calls this with the same arguments and trains its share of each mini-batch;
    the metrics are the whole batch's on every rank.

    ``packing`` trains the calls of a conversation whose prompts extend each other in one sequence
    (:mod:`algorithms.training.packing`; the anchors' too); the metrics then count them (``packed_calls``,
    ``pack_fallback_calls``, ``train_sequences``)."""
    optimization = optimization or LocalOptimization(policy, settings.max_grad_norm)
    started = time.perf_counter()
    policy.model.train()
    if rollouts.old_logprobs is None and settings.epochs * settings.mini_batches != 1:
        raise ValueError("old log-probs may come from the training pass only in a single step")
    names = ("pg", "kl", "clipped", "tokens", "entropy", "loss", "value_loss", "anchor_kl", "anchor_tokens")
    totals = dict.fromkeys((*names, "mismatch", "mismatch_tokens"), 0.0)
    grad_norms: list[float] = []
    packed = pack(transitions, enabled=packing)
    rows = list(packed.rows)  # each a list of transition indices; shuffled, mini- and micro-batched as units
    anchor_units = pack(anchors.transitions, enabled=packing).rows if anchors is not None else []
    rng = random.Random(settings.seed)
    for epoch in range(settings.epochs):
        rng.shuffle(rows)
        mini_size = math.ceil(len(rows) / settings.mini_batches)
        minis = _chunks(rows, mini_size)
        # the anchors' share of each mini-batch
        anchor_rows = _chunks(anchor_units, math.ceil(len(anchor_units) / len(minis))) if anchor_units else []
        for index, mini in enumerate(minis):
            # gradients are averaged over ranks
            norm = float(rollouts.mask[[i for row in mini for i in row]].sum()) / optimization.world
            for micro in _shard(mini, settings.micro_batch_size, optimization):
                out, calls = _forward(policy, transitions, micro or mini[:1])
                if micro is None:
                    optimization.backward(_nothing(out))
                    continue
                width = out.logprobs.shape[1]
                mask = rollouts.mask[calls, :width]
                ref = rollouts.ref_logprobs[calls, :width] if rollouts.ref_logprobs is not None else None
                olds = rollouts.old_logprobs
                old = out.logprobs.detach() if olds is None else olds[calls, :width]
                if epoch == 0:
                    _add_mismatch(totals, [transitions[i].logprobs for i in calls], old)
                terms = policy_loss(
                    out.logprobs,
                    old,
                    advantages[calls, :width],
                    mask,
                    clip_eps=settings.clip_eps,
                    ref_logprobs=ref,
                    kl_beta=settings.kl_beta,
                    total_tokens=norm,
                )
                loss = terms.loss
                if out.values is not None and returns is not None and rollouts.values is not None:
                    v_loss = value_loss(
                        out.values,
                        rollouts.values[calls, :width],
                        returns[calls, :width],
                        mask,
                        clip=settings.value_clip,
                        total_tokens=norm,
                    )
                    loss = loss + settings.value_coef * v_loss
                    totals["value_loss"] += v_loss.item() * norm
                optimization.backward(loss)
                totals["loss"] += loss.item() * norm
                totals["pg"] += terms.pg_sum
                totals["kl"] += terms.kl_sum
                totals["clipped"] += terms.clipped_tokens
                totals["tokens"] += terms.tokens
                totals["entropy"] += token_entropy_sum(out.logits, mask)
            if anchors is not None and index < len(anchor_rows):
                _anchor_step(policy, anchors, anchor_rows[index], settings, optimization, totals)
            grad_norms.append(optimization.step())
    policy.model.eval()
    totals = optimization.reduce(totals)
    tokens = max(totals["tokens"], 1.0)
    seconds = time.perf_counter() - started
    metrics = {
        "loss": totals["loss"] / tokens,
        "pg_loss": totals["pg"] / tokens,
        "kl": totals["kl"] / tokens,
        "entropy": totals["entropy"] / tokens,
        "grad_norm": sum(grad_norms) / len(grad_norms),
        "update_seconds": seconds,
        "train_tokens_per_second": totals["tokens"] / seconds,
        **packed.metrics(),  # the same on every rank: each packs the whole batch
    }
    if settings.epochs * settings.mini_batches > 1:
        # With one optimizer step the ratio is 1 on every token (the old policy is the one being differentiated),
        # so nothing can clip: the share is reported only where later optimizer steps can move the ratio.
        metrics["clip_fraction"] = totals["clipped"] / tokens
    if returns is not None:
        metrics["value_loss"] = totals["value_loss"] / tokens
    if totals["anchor_tokens"]:
        metrics["anchor_kl"] = totals["anchor_kl"] / totals["anchor_tokens"]
    if totals["mismatch_tokens"]:
        metrics["logprob_mismatch"] = totals["mismatch"] / totals["mismatch_tokens"]
    return metrics


@dataclass
class UpdateJob:
    """One policy update's inputs, as a trainer receives them (and a data-parallel one broadcasts them)."""

    transitions: Sequence[Transition]
    advantages: torch.Tensor
    rollouts: Rollouts
    settings: UpdateSettings
    returns: torch.Tensor | None = None
    anchors: Anchors | None = None
    packing: bool = True
    """Pack conversations (:func:`update`): part of the job, so that a data-parallel trainer's ranks all do as the
    rank that built it says."""

    def run(self, policy: TrainablePolicy, optimization: Optimization | None = None) -> dict[str, float]:
        """:func:`update` with these inputs; the batch's metrics."""
        return update(
            policy,
            self.transitions,
            self.advantages,
            self.rollouts,
            self.settings,
            self.returns,
            self.anchors,
            optimization,
            packing=self.packing,
        )


def _add_mismatch(totals: dict[str, float], behaviour: Sequence[list[float] | None], old: torch.Tensor) -> None:
    """Adds to ``totals`` the summed ``|behaviour - old|`` log-prob (``mismatch``) and the token count
    (``mismatch_tokens``) of the rows that carry behaviour log-probs (the policy server's, as the proxy recorded
    them)."""
    for row, logprobs in enumerate(behaviour):
        if not logprobs:
            continue
        n = min(len(logprobs), old.shape[1])
        totals["mismatch"] += float((torch.tensor(logprobs[:n]) - old[row, :n].float()).abs().sum())
        totals["mismatch_tokens"] += n
