"""The SQL of ``store prune`` (:mod:`lightning_store.sql.prune_rules`): which rollouts may go, and one batch's delete.

Every statement here names rollouts by their own columns and values bound at the call, so a batch's delete can
check again, in its own transaction, the condition that selected it (docs/reference/prune.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.models import ROLLOUT_STATUSES, TERMINAL_ROLLOUT_STATUSES
from lightning_store.sql.prune_rules import MODE_NONE, Rules, Run, Runs
from lightning_store.sql.schema import attempts, llm_calls, rollouts, spans

UNFINISHED = tuple(status for status in ROLLOUT_STATUSES if status not in TERMINAL_ROLLOUT_STATUSES)
KEPT_SPAN_NAMES = (
    "agentlightning.reward",
    "lightning_store.train.step",
    "lightning_store.apo.candidate",
    "lightning_store.apo.result",
)
"""Spans that ``--what spans`` keeps by name: what ``rewards_v`` (legacy rewards), ``training_steps_v``,
``prompt_candidates_v`` and ``apo_runs_v`` read."""
REWARD_ATTRIBUTE = "agentlightning.reward.0.value"
"""A span with this attribute is a reward span (``rewards_v``), whatever its name: kept by ``--what spans``."""


def _metadata(key: str) -> sa.ColumnElement[str]:
    """``rollouts.metadata[key]`` as text (NULL when missing or JSON null), on both backends."""
    text: sa.ColumnElement[str] = rollouts.c["metadata"][key].as_string()
    return text


_RUNS = (
    sa.select(rollouts.c.rollout_id, _metadata("training_run"), rollouts.c.start_time)
    .where(rollouts.c.status.in_(UNFINISHED), _metadata("training_run").is_not(None))
    .order_by(rollouts.c.start_time, rollouts.c.rollout_id)
)


async def runs_in_progress(conn: AsyncConnection) -> Runs:
    rows = (await conn.execute(_RUNS)).all()
    return Runs(tuple(Run(str(rid), str(algorithm), float(start)) for rid, algorithm, start in rows))


@dataclass(frozen=True)
class Selection:
    """What a prune selects: terminal rollouts that ended before ``cutoff`` and whose mode is not kept."""

    cutoff: float
    keep_modes: frozenset[str] | None
    include_runs: bool
    whole_rollouts: bool

    @classmethod
    def of(cls, rules: Rules, now: float) -> Selection:
        return cls(rules.cutoff(now), rules.keep_modes, rules.include_runs, rules.what == "rollouts")

    def matches(self, runs: Runs, *, protect: bool = True) -> sa.ColumnElement[bool]:
        """The condition on a ``rollouts`` row; ``protect=False`` leaves out what runs in progress keep."""
        r = rollouts.c
        conditions: list[sa.ColumnElement[bool]] = [
            r.status.in_(TERMINAL_ROLLOUT_STATUSES),
            r.end_time.is_not(None),
            r.end_time < self.cutoff,
        ]
        if self.keep_modes is not None:
            named = sorted(self.keep_modes - {MODE_NONE})
            if MODE_NONE in self.keep_modes:
                conditions.append(sa.and_(r.mode.is_not(None), r.mode.not_in(named)))
            else:
                conditions.append(sa.or_(r.mode.is_(None), r.mode.not_in(named)))
        if not self.include_runs:
            conditions.append(_metadata("training_run").is_(None))
        if protect and runs.runs:
            conditions.append(r.start_time < runs.protect_from)
            if self.include_runs:
                # A resumed run in progress still reads its earlier, finished run rollouts (training_steps_v's
                # run_id is the first of them): while any run is in progress, no run rollout goes.
                conditions.append(_metadata("training_run").is_(None))
            if runs.apo:
                conditions.append(_metadata("apo_run").is_(None))
            run_id = _metadata("training_run_id")
            conditions.append(sa.or_(run_id.is_(None), run_id.not_in(runs.ids)))
        return sa.and_(*conditions)

    def doomed_spans(self) -> sa.ColumnElement[bool]:
        """The spans of a selected rollout that go: all of them, or (``--what spans``) all but those kept."""
        if self.whole_rollouts:
            return sa.true()
        reward = spans.c.attributes[REWARD_ATTRIBUTE].as_string()
        return sa.and_(spans.c.name.not_in(KEPT_SPAN_NAMES), reward.is_(None))


@dataclass(frozen=True)
class Candidate:
    """A selected rollout and what a prune would delete of it (``--what spans``: its spans but those kept)."""

    pk: int
    rollout_id: str
    mode: str
    """Its mode, ``none`` for none."""
    end_time: float
    whole: bool
    attempts: int
    spans: int
    llm_calls: int

    @property
    def rows(self) -> int:
        """Rows deleted with it, what a batch is bounded by: its spans, or (whole) every row of it."""
        return 1 + self.attempts + self.spans + self.llm_calls if self.whole else self.spans


def _count(table: sa.Table, *where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    return (
        sa.select(sa.func.count())
        .select_from(table)
        .where(table.c.rollout_id == rollouts.c.rollout_id, *where)
        .scalar_subquery()
    )


async def candidates(
    conn: AsyncConnection, selection: Selection, runs: Runs, after_pk: int, limit: int
) -> list[Candidate]:
    """Up to ``limit`` selected rollouts past ``after_pk``, in ``pk`` (enqueue) order."""
    whole = selection.whole_rollouts
    zero = sa.literal(0)
    query = (
        sa.select(
            rollouts.c.pk,
            rollouts.c.rollout_id,
            rollouts.c.mode,
            rollouts.c.end_time,
            _count(attempts) if whole else zero,
            _count(spans, selection.doomed_spans()),
            _count(llm_calls) if whole else zero,
        )
        .where(rollouts.c.pk > after_pk, selection.matches(runs))
        .order_by(rollouts.c.pk)
        .limit(limit)
    )
    return [
        Candidate(int(pk), str(rid), mode or MODE_NONE, float(end), whole, int(a), int(s), int(c))
        for pk, rid, mode, end, a, s, c in (await conn.execute(query)).all()
    ]


async def count_protected(conn: AsyncConnection, selection: Selection, runs: Runs) -> int:
    """Rollouts that match the rules but are kept for a run in progress."""
    if not runs.runs:
        return 0
    kept = sa.and_(selection.matches(runs, protect=False), sa.not_(selection.matches(runs)))
    return int((await conn.execute(sa.select(sa.func.count()).select_from(rollouts).where(kept))).scalar_one())


@dataclass
class Deleted:
    """What one batch deleted, per rollout: attempts, spans, LLM calls (and the rollout, when whole)."""

    rollout_ids: list[str]
    attempts: Counter[str]
    spans: Counter[str]
    llm_calls: Counter[str]


async def delete_batch(conn: AsyncConnection, selection: Selection, runs: Runs, rollout_ids: Sequence[str]) -> Deleted:
    """Delete what the prune takes of ``rollout_ids``, in the caller's transaction: the rollouts are locked (in
    id order, as the store's writers lock them) and checked against the selection again first, so a rollout
    that changed since it was selected, or that a run now protects, is left whole."""
    ids = sorted(set(rollout_ids))
    locked = (
        sa.select(rollouts.c.rollout_id)
        .where(rollouts.c.rollout_id.in_(ids), selection.matches(runs))
        .order_by(rollouts.c.rollout_id)
        .with_for_update()
    )
    still = [str(rid) for rid in (await conn.execute(locked)).scalars()]
    deleted = Deleted(still, Counter(), Counter(), Counter())
    if not still:
        return deleted
    deleted.spans = await _delete(conn, spans, still, selection.doomed_spans())
    if selection.whole_rollouts:
        deleted.llm_calls = await _delete(conn, llm_calls, still)
        deleted.attempts = await _delete(conn, attempts, still)
        await conn.execute(sa.delete(rollouts).where(rollouts.c.rollout_id.in_(still)))
    return deleted


async def _delete(
    conn: AsyncConnection, table: sa.Table, rollout_ids: list[str], *where: sa.ColumnElement[bool]
) -> Counter[str]:
    statement = sa.delete(table).where(table.c.rollout_id.in_(rollout_ids), *where).returning(table.c.rollout_id)
    return Counter(str(rid) for rid in (await conn.execute(statement)).scalars())
