"""Span methods of the SQL store: batched ingest (a span is a heartbeat), sequence ids and queries."""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store import lifecycle
from lightning_store.errors import ConflictError, NotFoundError
from lightning_store.limits import MAX_SEQUENCE_ID
from lightning_store.models import FilterLogic, PaginatedResult, SortOrder
from lightning_store.spans import Span
from lightning_store.sql import validate
from lightning_store.sql.attempts import AttemptOps
from lightning_store.sql.coalesce import Coalescer
from lightning_store.sql.dialect import (
    among_param,
    among_value,
    contains_text,
    inlined,
    insert_from_json_array,
    jsonb_text,
)
from lightning_store.sql.paging import combine, fetch_page
from lightning_store.sql.schema import attempts, rollouts, spans
from lightning_store.sql.span_rows import span_columns, span_document

SPAN_SORTABLE = ("sequence_id", "start_time", "end_time", "name", "trace_id", "span_id", "parent_id")
SPAN_KEY = ("rollout_id", "attempt_id", "span_id")
SPAN_FIELDS = tuple(Span.model_fields)
_span_list: TypeAdapter[list[Span]] = TypeAdapter(list[Span])


# The statements of the ingest path are built once (building one costs more than running it).
_later = attempts.alias("later")


@functools.cache
def _lock_attempts_statement(dialect: str) -> sa.Select[Any]:
    """The named attempts (``attempt_ids``, an :func:`among_value`) with their rollouts, locked in rollout order;
    whether each is its rollout's latest; each rollout's span counter."""
    return (
        sa.select(
            attempts.c.attempt_id,
            attempts.c.rollout_id,
            ~sa.exists().where(
                _later.c.rollout_id == attempts.c.rollout_id, _later.c.sequence_id > attempts.c.sequence_id
            ),
            rollouts.c.last_span_seq,
        )
        .join(rollouts, rollouts.c.rollout_id == attempts.c.rollout_id)
        .where(among_param(dialect, attempts.c.attempt_id, "attempt_ids"))
        .order_by(rollouts.c.rollout_id)
        .with_for_update(of=rollouts)
    )


@functools.cache
def _heartbeat_attempts_statement(dialect: str) -> sa.Update:
    """Spans are heartbeats: the named attempts (``attempt_ids``) beat at ``now``, and revive."""
    return (
        sa.update(attempts)
        .where(among_param(dialect, attempts.c.attempt_id, "attempt_ids"))
        .values(
            last_heartbeat_time=sa.bindparam("now", type_=sa.Double()),
            status=sa.case(
                (attempts.c.status.in_(inlined(lifecycle.REVIVED_ATTEMPT_STATUSES)), sa.literal("running")),
                else_=attempts.c.status,
            ),
        )
    )


_highest_seq = sa.bindparam("m", type_=sa.BigInteger())
_HEARTBEAT_ROLLOUTS = (
    sa.update(rollouts)
    .where(rollouts.c.rollout_id == sa.bindparam("r"))
    .values(
        last_span_seq=sa.case((rollouts.c.last_span_seq < _highest_seq, _highest_seq), else_=rollouts.c.last_span_seq),
        status=sa.case(
            (
                sa.and_(
                    sa.bindparam("beat", type_=sa.Boolean()),
                    rollouts.c.status.in_(inlined(lifecycle.REVIVED_ROLLOUT_STATUSES)),
                ),
                sa.literal("running"),
            ),
            else_=rollouts.c.status,
        ),
    )
)


def _unsequenced(span: Any, allocating: bool) -> Any:
    """A span given as JSON may leave out (or null) the sequence id the store allocates for it."""
    if allocating and isinstance(span, dict) and span.get("sequence_id") is None:
        return {**span, "sequence_id": 0}
    return span


async def _take_sequence_ids(conn: AsyncConnection, rollout_ids: Sequence[str]) -> list[int]:
    """The next value of each named rollout's span counter, in order (a rollout named twice gets two), taken in
    one statement. The caller has locked the rollouts, in rollout order, so the update's row order cannot
    deadlock on Postgres."""
    wanted = Counter(rollout_ids)
    # An atomic increment: concurrent callers each get their own range, never the same number.
    taken = await conn.execute(
        sa.update(rollouts)
        .where(rollouts.c.rollout_id.in_(sorted(wanted)))
        .values(last_span_seq=rollouts.c.last_span_seq + sa.case(wanted, value=rollouts.c.rollout_id))
        .returning(rollouts.c.rollout_id, rollouts.c.last_span_seq)
    )
    next_free = {rollout_id: int(top) - wanted[rollout_id] + 1 for rollout_id, top in taken.all()}
    numbers = []
    for rollout_id in rollout_ids:
        numbers.append(_within_limit(rollout_id, next_free[rollout_id]))
        next_free[rollout_id] += 1
    return numbers


def _within_limit(rollout_id: str, number: int) -> int:
    """``number`` when it is a sequence id the API can hand out; else a :class:`ConflictError` (raised inside the
    caller's transaction, so the counters it advanced are rolled back)."""
    if number > MAX_SEQUENCE_ID:
        raise ConflictError(
            f"rollout {rollout_id!r} has no sequence ids left: a span already took {number - 1} and the largest is "
            f"{MAX_SEQUENCE_ID} (2^53 - 1)",
            field="rollout_id",
        )
    return number


def numbered(batch: Sequence[Span], counters: dict[str, int]) -> list[Span]:
    """``batch`` with sequence ids that follow each rollout's span counter (``counters``: its last one given),
    in order. The caller holds the rollouts locked and advances their counters to the highest number given, in
    an update it makes anyway: numbering from the counters read under the lock saves a statement per write."""
    next_free = {rollout_id: last + 1 for rollout_id, last in counters.items()}
    spans_ = []
    for span in batch:
        number = _within_limit(span.rollout_id, next_free[span.rollout_id])
        spans_.append(span.model_copy(update={"sequence_id": number}))
        next_free[span.rollout_id] += 1
    return spans_


def spans_json(batch: list[Span], dialect: str) -> str:
    """``batch`` as the one JSON array its insert statement takes (serialized by pydantic's Rust core)."""
    doc = _span_list.dump_json(batch).decode()
    return doc if dialect == "sqlite" else jsonb_text(doc)


class SpanOps(AttemptOps):
    async def add_span(self, span: Span) -> Span | None:
        added = await self.add_many_spans([span])
        return added[0] if added else None

    async def add_many_spans(self, spans_: Sequence[Span], *, allocate_sequence_ids: bool = False) -> Sequence[Span]:
        batch = [
            span
            if type(span) is Span
            else validate.model(Span, _unsequenced(span, allocate_sequence_ids), f"spans.{i}")
            for i, span in enumerate(spans_)
        ]
        if not batch:
            return []
        coalesced = self._numbered_spans if allocate_sequence_ids else self._spans_as_given
        return [span for span in await coalesced(batch) if span is not None]

    @functools.cached_property
    def _spans_as_given(self) -> Coalescer[Span, Span | None]:
        """Concurrent span writes in one transaction (:mod:`~lightning_store.sql.coalesce`): Agent Lightning's
        client sends every span in a request of its own."""
        return Coalescer(functools.partial(self._write_spans, allocate_sequence_ids=False))

    @functools.cached_property
    def _numbered_spans(self) -> Coalescer[Span, Span | None]:
        """:attr:`_spans_as_given` for writes that have the store number their spans."""
        return Coalescer(functools.partial(self._write_spans, allocate_sequence_ids=True))

    async def _write_spans(self, batch: list[Span], *, allocate_sequence_ids: bool) -> list[Span | None]:
        async with self._write() as (conn, _):
            return await self._add_each_span(conn, batch, allocate_sequence_ids=allocate_sequence_ids)

    async def _add_spans(self, conn: AsyncConnection, batch: list[Span], *, allocate_sequence_ids: bool) -> list[Span]:
        """:meth:`add_many_spans` of validated spans, in the caller's write transaction."""
        added = await self._add_each_span(conn, batch, allocate_sequence_ids=allocate_sequence_ids)
        return [span for span in added if span is not None]

    async def _add_each_span(
        self, conn: AsyncConnection, batch: list[Span], *, allocate_sequence_ids: bool
    ) -> list[Span | None]:
        """For each span of ``batch``, the span as stored, or None where it was already stored (a duplicate, also of
        a span before it in ``batch``)."""
        now = time.time()
        latest, counters = await self._lock_attempts(conn, batch)
        if allocate_sequence_ids:
            batch = numbered(batch, counters)  # the heartbeat update below advances the counters
        new_keys = await self._insert(conn, batch)
        await self._record_heartbeats(conn, batch, latest, now)
        seen: set[tuple[str, ...]] = set()
        added: list[Span | None] = []
        for span in batch:
            key = (span.rollout_id, span.attempt_id, span.span_id)
            added.append(span if key in new_keys and key not in seen else None)
            seen.add(key)
        return added

    async def _insert(self, conn: AsyncConnection, batch: list[Span]) -> set[tuple[str, ...]]:
        """Insert ``batch`` (duplicates ignored) in one statement; the keys of the spans that were new."""
        inserted = await conn.execute(self._insert_spans, {"doc": spans_json(batch, self.dialect)})
        return {tuple(row) for row in inserted.all()}

    @functools.cached_property
    def _insert_spans(self) -> sa.TextClause:
        return insert_from_json_array(
            self.dialect, spans, SPAN_FIELDS, extra_column="extra", conflict_columns=SPAN_KEY, returning=SPAN_KEY
        )

    async def _lock_attempts(self, conn: AsyncConnection, batch: list[Span]) -> tuple[dict[str, bool], dict[str, int]]:
        """Check that every span names an attempt of its rollout, lock those rollouts (in a fixed order, so that
        span ingest and attempt updates cannot deadlock on Postgres), and say which attempts are the latest and
        where each rollout's span counter stands."""
        named = among_value(self.dialect, sorted({span.attempt_id for span in batch}))
        rows = (await conn.execute(_lock_attempts_statement(self.dialect), {"attempt_ids": named})).all()
        owner = {attempt_id: rollout_id for attempt_id, rollout_id, _, _ in rows}
        for i, span in enumerate(batch):
            if owner.get(span.attempt_id) != span.rollout_id:
                await self._raise_missing(conn, span, i)
        latest = {attempt_id: bool(is_latest) for attempt_id, _, is_latest, _ in rows}
        return latest, {rollout_id: int(counter) for _, rollout_id, _, counter in rows}

    async def _raise_missing(self, conn: AsyncConnection, span: Span, index: int) -> None:
        found = await conn.execute(sa.select(rollouts.c.pk).where(rollouts.c.rollout_id == span.rollout_id))
        if found.first() is None:
            raise NotFoundError(f"rollout {span.rollout_id!r} not found", field=f"spans.{index}.rollout_id")
        raise NotFoundError(
            f"attempt {span.attempt_id!r} of rollout {span.rollout_id!r} not found", field=f"spans.{index}.attempt_id"
        )

    async def _record_heartbeats(
        self, conn: AsyncConnection, batch: list[Span], latest: dict[str, bool], now: float
    ) -> None:
        """Spans are heartbeats: revive their attempts, mark rollouts running, advance span counters."""
        named = among_value(self.dialect, sorted(latest))
        await conn.execute(_heartbeat_attempts_statement(self.dialect), {"attempt_ids": named, "now": now})
        per_rollout: dict[str, tuple[int, bool]] = {}
        for span in batch:
            highest, heartbeat = per_rollout.get(span.rollout_id, (0, False))
            per_rollout[span.rollout_id] = (max(highest, span.sequence_id), heartbeat or latest[span.attempt_id])
        await conn.execute(
            _HEARTBEAT_ROLLOUTS, [{"r": r, "m": m, "beat": beat} for r, (m, beat) in sorted(per_rollout.items())]
        )

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Span | None:
        if sequence_id is None:
            sequence_id = await self.get_next_span_sequence_id(rollout_id, attempt_id)
        return await self.add_span(Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        try:
            return (await self.get_many_span_sequence_ids([(rollout_id, attempt_id)]))[0]
        except NotFoundError as exc:
            exc.field = "attempt_id"
            raise

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        if not rollout_attempt_ids:
            return []
        async with self._write() as (conn, _):
            rollout_attempt_ids = await self._latest_resolved(conn, rollout_attempt_ids)
            # The same lock as a span write takes: the attempts' rollouts, in rollout order.
            named = among_value(self.dialect, sorted({a for _, a in rollout_attempt_ids}))
            rows = await conn.execute(_lock_attempts_statement(self.dialect), {"attempt_ids": named})
            owner = {attempt_id: rollout_id for attempt_id, rollout_id, _, _ in rows.all()}
            for i, (rollout_id, attempt_id) in enumerate(rollout_attempt_ids):
                if owner.get(attempt_id) != rollout_id:
                    raise NotFoundError(
                        f"attempt {attempt_id!r} of rollout {rollout_id!r} not found", field=f"{i}.attempt_id"
                    )
            return await _take_sequence_ids(conn, [rollout_id for rollout_id, _ in rollout_attempt_ids])

    async def _latest_resolved(
        self, conn: AsyncConnection, pairs: Sequence[tuple[str, str]]
    ) -> Sequence[tuple[str, str]]:
        """``pairs`` with each ``"latest"`` attempt id replaced by its rollout's latest attempt (Agent Lightning's
        client asks for ``"latest"``); a rollout without attempts keeps ``"latest"``, which names none."""
        wanted = [rollout_id for rollout_id, attempt_id in pairs if attempt_id == "latest"]
        if not wanted:
            return pairs
        latest = await self._latest_attempts(conn, wanted)
        resolved = {rollout_id: attempt.attempt_id for rollout_id, attempt in latest.items()}
        return [
            (rollout_id, resolved.get(rollout_id, attempt_id) if attempt_id == "latest" else attempt_id)
            for rollout_id, attempt_id in pairs
        ]

    async def query_spans(
        self, rollout_id: str, attempt_id: str | None = None, **filters: Any
    ) -> PaginatedResult[Span]:
        """The contract's ``query_spans`` (the arguments of :meth:`query_span_documents`): its documents, validated."""
        page = await self.query_span_documents(rollout_id, attempt_id, **filters)
        items = [Span.model_validate_json(document) for document in page.items]
        return PaginatedResult(items=items, limit=page.limit, offset=page.offset, total=page.total)

    async def query_span_documents(
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
    ) -> PaginatedResult[str]:
        """:meth:`query_spans` with each span as its JSON document (:func:`span_document`), not validated: what the
        server answers ``/spans/search`` with. The documents are what the spans' models would dump, up to key order."""
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
        query = sa.select(*span_columns(self.dialect)).where(spans.c.rollout_id == rollout_id)
        combined = combine(conditions, filter_logic)
        if combined is not None:
            query = query.where(combined)
        async with self._read() as conn:
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
        return PaginatedResult(items=[span_document(r) for r in rows], limit=limit, offset=offset, total=total)

    async def _resolve_attempt(self, conn: AsyncConnection, rollout_id: str, attempt_id: str | None) -> Any:
        """``None`` for all attempts; the latest attempt's id for ``"latest"`` (``""``, matching nothing, when
        there is none); the given id otherwise. Reads of unknown ids find nothing, as in Agent Lightning."""
        if attempt_id != "latest":
            return attempt_id
        latest = (await self._latest_attempts(conn, [rollout_id])).get(rollout_id)
        return latest.attempt_id if latest else ""
