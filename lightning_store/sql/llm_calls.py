"""LLM-call records in the SQL store: batched insert (duplicates ignored) and reads in rollout order."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlalchemy as sa
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.errors import NotFoundError
from lightning_store.llm_calls import LlmCall, numbered_calls
from lightning_store.spans import Span
from lightning_store.sql import validate
from lightning_store.sql.dialect import insert_from_json_array, insert_ignoring_conflicts, jsonb_text
from lightning_store.sql.schema import attempts, llm_calls
from lightning_store.sql.spans import SpanOps

LLM_CALL_FIELDS = tuple(LlmCall.model_fields)
CALL_KEY = ("rollout_id", "attempt_id", "span_id")
_call_list: TypeAdapter[list[LlmCall]] = TypeAdapter(list[LlmCall])


class LlmCallOps(SpanOps):
    @functools.cached_property
    def _insert_llm_call_rows(self) -> sa.Insert:
        return insert_ignoring_conflicts(self.dialect, llm_calls, CALL_KEY)

    @functools.cached_property
    def _insert_llm_call_document(self) -> sa.TextClause:
        return insert_from_json_array(
            self.dialect, llm_calls, LLM_CALL_FIELDS, extra_column=None, conflict_columns=CALL_KEY
        )

    async def _insert_calls(self, conn: AsyncConnection, calls: Sequence[LlmCall]) -> None:
        """Insert ``calls`` (duplicates ignored) in one statement.

        On Postgres from one JSON document: pydantic's encoder writes the batch, where each of a call's six JSON
        columns went through ``json.dumps`` and :func:`jsonb_text` of its own. SQLite keeps its rows: its JSON
        functions would store the columns minified, and ``store sql`` shows them as ``json.dumps`` writes them
        (``[1, 2, 3]``), which is also how Postgres prints ``jsonb``."""
        if self.is_sqlite:
            await conn.execute(self._insert_llm_call_rows, [call.model_dump(mode="json") for call in calls])
            return
        doc = jsonb_text(_call_list.dump_json(list(calls)).decode())
        await conn.execute(self._insert_llm_call_document, {"doc": doc})

    async def add_llm_calls(self, calls: Sequence[LlmCall]) -> None:
        records = [c if type(c) is LlmCall else validate.model(LlmCall, c, f"calls.{i}") for i, c in enumerate(calls)]
        if not records:
            return
        async with self._write() as (conn, _):
            owners = dict(
                (
                    await conn.execute(
                        sa.select(attempts.c.attempt_id, attempts.c.rollout_id).where(
                            attempts.c.attempt_id.in_({r.attempt_id for r in records})
                        )
                    )
                ).all()
            )
            for i, record in enumerate(records):
                if owners.get(record.attempt_id) != record.rollout_id:
                    raise NotFoundError(
                        f"attempt {record.attempt_id!r} of rollout {record.rollout_id!r} not found",
                        field=f"calls.{i}.attempt_id",
                    )
            await self._insert_calls(conn, records)

    async def record_llm_calls(self, records: Sequence[tuple[Span, LlmCall | None]]) -> list[Span]:
        """What the LLM proxy records of a batch of calls, in one transaction (not part of the contract: the
        server's :class:`~lightning_store.server.recorder.CallRecorder` uses it where its store has it): each
        call's span, as ``add_many_spans(…, allocate_sequence_ids=True)`` stores it, and the call's
        :class:`LlmCall` with the sequence id its span got, unless the span was a duplicate (the call was
        recorded with it). Returns the new spans. An unknown attempt raises ``NotFoundError`` (nothing written).

        Why one transaction: a batch used to be two writes (its spans, then its calls, which checked the
        attempts again); every proxied call pays for the recorder's writes."""
        if not records:
            return []
        async with self._write() as (conn, _):
            added = await self._add_spans(conn, [span for span, _ in records], allocate_sequence_ids=True)
            if calls := numbered_calls(records, added):
                await self._insert_calls(conn, calls)
        return added

    async def query_llm_calls(self, rollout_ids: Sequence[str], *, attempt_id: str | None = None) -> list[LlmCall]:
        query = sa.select(*(llm_calls.c[name] for name in LLM_CALL_FIELDS)).where(
            llm_calls.c.rollout_id.in_(list(rollout_ids))
        )
        if attempt_id is not None:
            query = query.where(llm_calls.c.attempt_id == attempt_id)
        query = query.order_by(llm_calls.c.rollout_id, llm_calls.c.sequence_id, llm_calls.c.pk)
        async with self._read() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [LlmCall.model_validate(dict(row)) for row in rows]
