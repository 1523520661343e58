"""Span methods of the SQL store: batched ingest (a span is a heartbeat), sequence ids and queries."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.errors import NotFoundError
from lightning_store.models import FilterLogic, PaginatedResult, SortOrder
from lightning_store.spans import Span
from lightning_store.sql import validate
from lightning_store.sql.attempts import AttemptOps
from lightning_store.sql.dialect import contains_text, insert_ignoring_conflicts
from lightning_store.sql.paging import combine, fetch_page
from lightning_store.sql.rows import span_from_row, span_to_row
from lightning_store.sql.schema import attempts, rollouts, spans

SPAN_SORTABLE = ("sequence_id", "start_time", "end_time", "name", "trace_id", "span_id", "parent_id")
SPAN_KEY = ("rollout_id", "attempt_id", "span_id")


class SpanOps(AttemptOps):
    async def add_span(self, span: Span) -> Span | None:
        added = await self.add_many_spans([span])
        return added[0] if added else None

    async def add_many_spans(self, spans_: Sequence[Span]) -> Sequence[Span]:
        batch = [validate.model(Span, span, f"spans.{i}") for i, span in enumerate(spans_)]
        if not batch:
            return []
        now = time.time()
        async with self._write() as (conn, _):
            await self._check_attempts(conn, batch)
            # One multi-row INSERT; RETURNING tells which rows were new (duplicates are skipped, not errors).
            inserted = await conn.execute(
                insert_ignoring_conflicts(self.dialect, spans, SPAN_KEY).returning(*(spans.c[k] for k in SPAN_KEY)),
                [span_to_row(span) for span in batch],
            )
            new_keys = {tuple(row) for row in inserted.all()}
            await self._record_heartbeats(conn, batch, now)
        seen: set[tuple[str, ...]] = set()
        added = []
        for span in batch:
            key = (span.rollout_id, span.attempt_id, span.span_id)
            if key in new_keys and key not in seen:
                seen.add(key)
                added.append(span)
        return added

    async def _check_attempts(self, conn: AsyncConnection, batch: list[Span]) -> None:
        """Every span must name an existing attempt of its rollout; lock the rollouts in a fixed order."""
        rollout_ids = sorted({span.rollout_id for span in batch})
        # Locking rollouts first (sorted) keeps span ingest and attempt updates from deadlocking on Postgres.
        locked = await conn.execute(
            sa.select(rollouts.c.rollout_id)
            .where(rollouts.c.rollout_id.in_(rollout_ids))
            .order_by(rollouts.c.rollout_id)
            .with_for_update()
        )
        found_rollouts = set(locked.scalars())
        known = dict(
            (
                await conn.execute(
                    sa.select(attempts.c.attempt_id, attempts.c.rollout_id).where(
                        attempts.c.attempt_id.in_({span.attempt_id for span in batch})
                    )
                )
            ).all()
        )
        for i, span in enumerate(batch):
            if span.rollout_id not in found_rollouts:
                raise NotFoundError(f"rollout {span.rollout_id!r} not found", field=f"spans.{i}.rollout_id")
            if known.get(span.attempt_id) != span.rollout_id:
                raise NotFoundError(
                    f"attempt {span.attempt_id!r} of rollout {span.rollout_id!r} not found",
                    field=f"spans.{i}.attempt_id",
                )

    async def _record_heartbeats(self, conn: AsyncConnection, batch: list[Span], now: float) -> None:
        """Spans are heartbeats: revive their attempts, mark rollouts running, advance span counters."""
        attempt_ids = sorted({span.attempt_id for span in batch})
        revived = sa.case(
            (attempts.c.status.in_(("preparing", "unresponsive")), sa.literal("running")), else_=attempts.c.status
        )
        await conn.execute(
            sa.update(attempts)
            .where(attempts.c.attempt_id.in_(attempt_ids))
            .values(last_heartbeat_time=now, status=revived)
        )
        latest = await self._latest_attempts(conn, sorted({span.rollout_id for span in batch}))
        running = sorted(r for r, attempt in latest.items() if attempt.attempt_id in attempt_ids)
        if running:
            await conn.execute(
                sa.update(rollouts)
                .where(rollouts.c.rollout_id.in_(running), rollouts.c.status.in_(("queuing", "preparing", "requeuing")))
                .values(status=lifecycle.heartbeat_rollout_status("preparing"))
            )
        highest: dict[str, int] = {}
        for span in batch:
            highest[span.rollout_id] = max(highest.get(span.rollout_id, 0), span.sequence_id)
        await conn.execute(
            sa.update(rollouts)
            .where(rollouts.c.rollout_id == sa.bindparam("r"), rollouts.c.last_span_seq < sa.bindparam("m"))
            .values(last_span_seq=sa.bindparam("m")),
            [{"r": r, "m": m} for r, m in sorted(highest.items())],
        )

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Span | None:
        if sequence_id is None:
            sequence_id = await self.get_next_span_sequence_id(rollout_id, attempt_id)
        return await self.add_span(Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        return (await self.get_many_span_sequence_ids([(rollout_id, attempt_id)]))[0]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        if not rollout_attempt_ids:
            return []
        wanted = Counter(rollout_id for rollout_id, _ in rollout_attempt_ids)
        async with self._write() as (conn, _):
            known = dict(
                (
                    await conn.execute(
                        sa.select(attempts.c.attempt_id, attempts.c.rollout_id).where(
                            attempts.c.attempt_id.in_({a for _, a in rollout_attempt_ids})
                        )
                    )
                ).all()
            )
            for i, (rollout_id, attempt_id) in enumerate(rollout_attempt_ids):
                if known.get(attempt_id) != rollout_id:
                    raise NotFoundError(
                        f"attempt {attempt_id!r} of rollout {rollout_id!r} not found", field=f"{i}.attempt_id"
                    )
            next_free: dict[str, int] = {}
            for rollout_id in sorted(wanted):
                # An atomic increment: concurrent callers each get their own range, never the same number.
                top = await conn.execute(
                    sa.update(rollouts)
                    .where(rollouts.c.rollout_id == rollout_id)
                    .values(last_span_seq=rollouts.c.last_span_seq + wanted[rollout_id])
                    .returning(rollouts.c.last_span_seq)
                )
                next_free[rollout_id] = int(top.scalar_one()) - wanted[rollout_id] + 1
        result = []
        for rollout_id, _ in rollout_attempt_ids:
            result.append(next_free[rollout_id])
            next_free[rollout_id] += 1
        return result

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        *,
        trace_id: str | None = None,
        trace_id_contains: str | None = None,
        span_id: str | None = None,
        span_id_contains: str | None = None,
        parent_id: str | None = None,
        parent_id_contains: str | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
    ) -> PaginatedResult[Span]:
        conditions: list[sa.ColumnElement[bool]] = []
        for column, exact, contains in (
            (spans.c.trace_id, trace_id, trace_id_contains),
            (spans.c.span_id, span_id, span_id_contains),
            (spans.c.parent_id, parent_id, parent_id_contains),
            (spans.c.name, name, name_contains),
        ):
            if exact is not None:
                conditions.append(column == exact)
            if contains is not None:
                conditions.append(contains_text(self.dialect, column, contains))
        query = sa.select(spans).where(spans.c.rollout_id == rollout_id)
        combined = combine(conditions, filter_logic)
        if combined is not None:
            query = query.where(combined)
        async with self._read() as conn:
            await self._require_rollout(conn, rollout_id)
            scope = await self._resolve_attempt(conn, rollout_id, attempt_id)
            if scope is not None:
                query = query.where(spans.c.attempt_id == scope)
            rows, total = await fetch_page(
                conn,
                query,
                table=spans,
                sort_by=sort_by,
                sort_order=sort_order,
                sortable=SPAN_SORTABLE,
                limit=limit,
                offset=offset,
                tiebreak=spans.c.pk,
            )
        return PaginatedResult(items=[span_from_row(r) for r in rows], limit=limit, offset=offset, total=total)

    async def _resolve_attempt(self, conn: AsyncConnection, rollout_id: str, attempt_id: str | None) -> Any:
        """``None`` for all attempts; the latest attempt's id for ``"latest"``; a checked id otherwise."""
        if attempt_id is None:
            return None
        if attempt_id == "latest":
            latest = (await self._latest_attempts(conn, [rollout_id])).get(rollout_id)
            # No attempt yet: match nothing rather than everything.
            return latest.attempt_id if latest else ""
        found = await conn.execute(
            sa.select(attempts.c.pk).where(attempts.c.rollout_id == rollout_id, attempts.c.attempt_id == attempt_id)
        )
        if found.first() is None:
            raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found", field="attempt_id")
        return attempt_id
