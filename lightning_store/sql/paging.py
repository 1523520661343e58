"""Sorting and pagination shared by every query method, with the argument checks the contract promises."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from lightning_store.errors import BadRequestError, InvalidRequestError
from lightning_store.limits import MAX_INT


def check_page(limit: int, offset: int) -> None:
    # 0 is refused, as Agent Lightning's server refuses it: a page of nothing is a caller's mistake.
    if not (limit == -1 or 1 <= limit <= MAX_INT):
        raise BadRequestError("limit must be -1 (no limit) or a positive 64-bit integer", field="limit")
    if not 0 <= offset <= MAX_INT:
        raise BadRequestError("offset must be a non-negative 64-bit integer", field="offset")


def sort_column(table: sa.Table, sort_by: str | None, sortable: Sequence[str]) -> sa.Column[Any] | None:
    if sort_by is None:
        return None
    if sort_by not in sortable:
        raise BadRequestError(f"cannot sort by {sort_by!r}; choose one of: {', '.join(sortable)}", field="sort_by")
    return table.c[sort_by]


def check_sort_order(sort_order: str) -> None:
    if sort_order not in ("asc", "desc"):
        raise InvalidRequestError("sort_order must be 'asc' or 'desc'", field="sort_order")


async def fetch_page(
    conn: AsyncConnection,
    query: sa.Select[Any],
    *,
    table: sa.Table,
    sort_by: str | None,
    sort_order: str,
    sortable: Sequence[str],
    limit: int,
    offset: int,
    tiebreak: sa.Column[Any],
) -> tuple[list[sa.RowMapping], int]:
    """Rows of one page and the total number of matches. Ordering is deterministic (``tiebreak`` last).

    The matches are counted only when the page cannot tell: a page with room to spare ends the result, so the total
    is its offset plus its rows (unless it is empty past the first page). Why: counting scans every match, a whole
    table for an unfiltered listing."""
    check_page(limit, offset)
    check_sort_order(sort_order)
    column = sort_column(table, sort_by, sortable)
    counted = sa.select(sa.func.count()).select_from(query.subquery())
    order = [] if column is None else [_ordered(column, sort_order)]
    # Ties in insertion order whichever the direction, as Agent Lightning's stable sort leaves them.
    query = query.order_by(*order, tiebreak)
    if limit >= 0:
        query = query.limit(limit)
    if offset:
        query = query.offset(offset)
    rows = list((await conn.execute(query)).mappings())
    if (limit < 0 or len(rows) < limit) and (rows or offset == 0):
        return rows, offset + len(rows)
    return rows, (await conn.execute(counted)).scalar_one()


def _ordered(column: sa.Column[Any], sort_order: str) -> sa.UnaryExpression[Any]:
    """``column`` in ``sort_order``, NULL placed as Agent Lightning places it, the same on both backends (whose
    defaults differ): a missing time (``*_time``: not ended yet, never beat) sorts as the largest value, any other
    missing value as the smallest. A column that cannot be NULL is ordered plainly, so that its index serves."""
    if not column.nullable:
        return column.desc() if sort_order == "desc" else column.asc()
    null_is_largest = column.name.endswith("_time")
    if sort_order == "desc":
        return column.desc().nulls_first() if null_is_largest else column.desc().nulls_last()
    return column.asc().nulls_last() if null_is_largest else column.asc().nulls_first()


def combine(conditions: list[sa.ColumnElement[bool]], logic: str) -> sa.ColumnElement[bool] | None:
    if logic not in ("and", "or"):
        raise InvalidRequestError("filter_logic must be 'and' or 'or'", field="filter_logic")
    if not conditions:
        return None
    return sa.and_(*conditions) if logic == "and" else sa.or_(*conditions)
