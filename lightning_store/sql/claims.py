"""The queue's claim: pop the oldest queued rollouts and start their attempts, in one transaction, shared by
concurrent claims (:mod:`~lightning_store.sql.coalesce`)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.limits import MAX_INT
from lightning_store.models import Attempt, AttemptedRollout, Claim
from lightning_store.resources import ResourcesUpdate
from lightning_store.sql import postgres_claim, transitions
from lightning_store.sql.attempts import AttemptOps
from lightning_store.sql.coalesce import Coalescer
from lightning_store.sql.resources import resources_for_ids
from lightning_store.sql.rows import attempted_from_row
from lightning_store.sql.schema import QUEUED, rollouts
from lightning_store.sql.workers import WorkerOps

# The claim. The partial index ix_rollouts_queue covers exactly this predicate (a literal, so the planner can match
# it). SKIP LOCKED lets concurrent claimers take the next rows instead of waiting for ours; a row we lock is never
# handed to anyone else, and its attempt is created in the same transaction.
_QUEUE_HEAD = (
    sa.select(rollouts.c.pk)
    .where(sa.text(QUEUED))
    .order_by(rollouts.c.enqueue_time, rollouts.c.pk)
    .limit(sa.bindparam("limit"))
    .with_for_update(skip_locked=True)
    .scalar_subquery()
)
# SQLite's planner, which has no statistics, took ix_rollouts_status for the status term and sorted every queued
# row on each claim (245 µs with 2,000 queued, against 2.3 µs through the queue's index): it is told the index.
_SQLITE_QUEUE_HEAD = sa.text(
    f"SELECT pk FROM rollouts INDEXED BY ix_rollouts_queue WHERE {QUEUED} ORDER BY enqueue_time, pk LIMIT :limit"
).columns(pk=sa.Integer)


@functools.cache
def _claim_statement(dialect: str) -> sa.Update:
    head = _SQLITE_QUEUE_HEAD if dialect == "sqlite" else _QUEUE_HEAD
    return sa.update(rollouts).where(rollouts.c.pk.in_(head)).values(status="preparing").returning(*rollouts.c)


@dataclass(frozen=True)
class ClaimCall:
    """One claim, as :meth:`ClaimOps._claim` takes it (claims are coalesced as values of this)."""

    limit: int
    worker_id: str | None
    mark_idle: bool
    with_resources: bool


class ClaimOps(AttemptOps, WorkerOps):
    async def dequeue_rollout(
        self, worker_id: str | None = None, *, timeout: float | None = None
    ) -> AttemptedRollout | None:
        claimed = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id, timeout=timeout)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> Sequence[AttemptedRollout]:
        return [claim.rollout for claim in await self._dequeue(limit, worker_id, timeout, with_resources=False)]

    async def claim_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> list[Claim]:
        return await self._dequeue(limit, worker_id, timeout, with_resources=True)

    async def _dequeue(
        self, limit: int, worker_id: str | None, timeout: float | None, *, with_resources: bool
    ) -> list[Claim]:
        if limit <= 0:
            return []
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        claimed = await self._claim(limit, worker_id, mark_idle=True, with_resources=with_resources)
        # Blocking: sleep until an enqueue wakes us (or the poll interval passes), then claim only when a cheap
        # read sees work, so that idle waiters take no write lock.
        while not claimed and deadline is not None and await self._wait_for_change("queue", deadline):
            if await self._queue_has_work():
                claimed = await self._claim(limit, worker_id, mark_idle=False, with_resources=with_resources)
        return claimed

    async def _queue_has_work(self) -> bool:
        return (await self._queue_checks_coalesced([None]))[0]

    @functools.cached_property
    def _queue_checks_coalesced(self) -> Coalescer[None, bool]:
        """Waiting claimers' re-checks of the queue, concurrent ones answered by one read: they wake together
        (on a wake-up, or at the same tick of the poll interval: ``_wait_for_change``)."""
        return Coalescer(self._queue_has_work_for)

    async def _queue_has_work_for(self, checks: list[None]) -> list[bool]:
        async with self._read(snapshot=False) as conn:
            found = await conn.execute(sa.select(rollouts.c.pk).where(sa.text(QUEUED)).limit(1))
            has_work = found.first() is not None
        return [has_work] * len(checks)

    async def _claim(self, limit: int, worker_id: str | None, *, mark_idle: bool, with_resources: bool) -> list[Claim]:
        """Pop up to ``limit`` rollouts and create their attempts in one transaction, shared with concurrent
        claims (:meth:`_claims_coalesced`); ``with_resources``: read the resources each attempt runs with in it
        too (one transaction where a claim took two). ``mark_idle``: a claim that finds nothing marks the worker
        idle."""
        call = ClaimCall(limit=limit, worker_id=worker_id, mark_idle=mark_idle, with_resources=with_resources)
        return (await self._claims_coalesced([call]))[0]

    @functools.cached_property
    def _claims_coalesced(self) -> Coalescer[ClaimCall, list[Claim]]:
        """Concurrent claims in one transaction (:mod:`~lightning_store.sql.coalesce`): runners claim at once."""
        return Coalescer(self._claim_many)

    async def _claim_many(self, calls: list[ClaimCall]) -> list[list[Claim]]:
        """The claims of ``calls`` together: the oldest queued rollouts, first come first served (the first call
        takes the first ``limit`` of them, and so on). On Postgres one statement in autocommit
        (:mod:`~lightning_store.sql.postgres_claim`), else one transaction."""
        now = time.time()
        wanted = min(sum(call.limit for call in calls), MAX_INT)
        with_resources = any(call.with_resources for call in calls)
        taken: list[tuple[sa.RowMapping, Attempt]] | None = None
        found: dict[str | None, ResourcesUpdate | None] = {}
        if self.dialect == "postgresql":
            async with self._autocommit() as conn:
                with contextlib.suppress(sa.exc.IntegrityError):  # the race in postgres_claim's docstring
                    taken = await postgres_claim.claim(conn, calls, wanted, now)
                if taken and with_resources:
                    found = await resources_for_ids(conn, self.dialect, [row["resources_id"] for row, _ in taken])
        if taken is None:
            async with self._write() as (conn, _):
                taken = await self._claim_in_transaction(conn, calls, wanted, now)
                if taken and with_resources:
                    found = await resources_for_ids(conn, self.dialect, [row["resources_id"] for row, _ in taken])
        answers: list[list[Claim]] = []
        for call in calls:
            mine, taken = taken[: call.limit], taken[call.limit :]
            resources = found if call.with_resources else {}
            answers.append(
                [
                    Claim(rollout=attempted_from_row(row, attempt), resources=resources.get(row["resources_id"]))
                    for row, attempt in mine
                ]
            )
        return answers

    async def _claim_in_transaction(
        self, conn: AsyncConnection, calls: list[ClaimCall], wanted: int, now: float
    ) -> list[tuple[sa.RowMapping, Attempt]]:
        """The claim statement by statement, in the caller's write transaction: the claimed rows in queue order,
        each with its new attempt."""
        claimed_rows = (await conn.execute(_claim_statement(self.dialect), {"limit": wanted})).mappings().all()
        rows = sorted(claimed_rows, key=lambda r: (r["enqueue_time"], r["pk"]))
        owners: list[str | None] = []
        for call in calls:
            share = len(rows[len(owners) : len(owners) + call.limit])
            if not share and call.worker_id and call.mark_idle:
                await self._mark_worker_idle(conn, call.worker_id, now)
            owners += [call.worker_id] * share
        if not rows:
            return []
        attempts_ = await transitions.create_attempts(conn, [row["rollout_id"] for row in rows], owners, now)
        await transitions.sync_workers(conn, self.dialect, attempts_, now, dequeued=True)
        return list(zip(rows, attempts_, strict=True))
