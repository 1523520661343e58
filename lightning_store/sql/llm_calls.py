"""LLM-call records in the SQL store: batched insert (duplicates ignored) and reads in rollout order."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sqlalchemy as sa

from lightning_store.errors import NotFoundError
from lightning_store.llm_calls import LlmCall
from lightning_store.sql import validate
from lightning_store.sql.base import SqlBase
from lightning_store.sql.dialect import insert_ignoring_conflicts
from lightning_store.sql.schema import attempts, llm_calls

LLM_CALL_FIELDS = tuple(LlmCall.model_fields)


class LlmCallOps(SqlBase):
    @functools.cached_property
    def _insert_llm_calls(self) -> sa.Insert:
        return insert_ignoring_conflicts(self.dialect, llm_calls, ["rollout_id", "attempt_id", "span_id"])

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
            await conn.execute(self._insert_llm_calls, [r.model_dump(mode="json") for r in records])

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
