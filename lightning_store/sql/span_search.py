"""Read-only span search across rollouts (an addition to the Agent Lightning contract).

``query_spans`` answers "the spans of this rollout"; ``search_spans`` answers questions over the whole store:
"every ``openai.chat.completion`` span of training rollouts since noon that ended in an error".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import check_match
from lightning_store.models import ROLLOUT_MODES, PaginatedResult, RolloutMode, SortOrder
from lightning_store.spans import Span
from lightning_store.sql import validate
from lightning_store.sql.base import SqlBase
from lightning_store.sql.dialect import among, json_matches
from lightning_store.sql.paging import fetch_page
from lightning_store.sql.schema import rollouts, spans
from lightning_store.sql.span_rows import span_columns, span_from_text_row

SEARCH_SORTABLE = ("start_time", "end_time", "name", "rollout_id")
STATUS_CODES = ("UNSET", "OK", "ERROR")
DEFAULT_SEARCH_LIMIT = 1000


class SpanSearchOps(SqlBase):
    async def search_spans(
        self,
        *,
        rollout_ids: Sequence[str] | None = None,
        attempt_ids: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        name_prefix: str | None = None,
        mode_in: Sequence[RolloutMode] | None = None,
        status_code: str | None = None,
        attributes_match: dict[str, Any] | None = None,
        start_time_from: float | None = None,
        start_time_to: float | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = DEFAULT_SEARCH_LIMIT,
        offset: int = 0,
    ) -> PaginatedResult[Span]:
        conditions = _id_filters(self.dialect, rollout_ids=rollout_ids, attempt_ids=attempt_ids, names=names)
        if name_prefix is not None:
            if not isinstance(name_prefix, str):
                raise InvalidRequestError("name_prefix must be a string", field="name_prefix")
            # substr, not LIKE: no wildcards to escape, and case-sensitive on SQLite too.
            conditions.append(sa.func.substr(spans.c.name, 1, len(name_prefix)) == name_prefix)
        if status_code is not None:
            validate.one_of(status_code, STATUS_CODES, "status_code")
            conditions.append(json_matches(self.dialect, spans.c.status, "status_code", status_code))
        if (match := check_match(attributes_match, "attributes_match")) is not None:
            for key, value in match.items():
                conditions.append(json_matches(self.dialect, spans.c.attributes, key, value))
        if start_time_from is not None:
            conditions.append(spans.c.start_time >= start_time_from)
        if start_time_to is not None:
            conditions.append(spans.c.start_time <= start_time_to)
        query = sa.select(*span_columns(self.dialect))
        if mode_in is not None:
            validate.all_of(mode_in, ROLLOUT_MODES, "mode_in")
            query = query.join(rollouts, rollouts.c.rollout_id == spans.c.rollout_id)
            conditions.append(rollouts.c.mode.in_(list(mode_in)))
        if conditions:
            query = query.where(*conditions)
        async with self._read() as conn:
            rows, total = await fetch_page(
                conn,
                query,
                table=spans,
                sort_by=sort_by,
                sort_order=sort_order,
                sortable=SEARCH_SORTABLE,
                limit=limit,
                offset=offset,
                tiebreak=spans.c.pk,
            )
        return PaginatedResult(items=[span_from_text_row(r) for r in rows], limit=limit, offset=offset, total=total)


def _id_filters(dialect: str, **lists: Sequence[str] | None) -> list[sa.ColumnElement[bool]]:
    """``column IN (…)`` for each given list of strings (``rollout_ids`` filters ``rollout_id``, and so on), each
    list bound as one parameter (:func:`among`): Postgres takes at most 32,767 parameters a statement."""
    conditions: list[sa.ColumnElement[bool]] = []
    for field, values in lists.items():
        if values is None:
            continue
        if isinstance(values, str) or not all(isinstance(v, str) for v in values):
            raise InvalidRequestError(f"{field} must be a list of strings", field=field)
        column = spans.c[field.removesuffix("s")]
        conditions.append(among(dialect, column, values))
    return conditions
