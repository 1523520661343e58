"""The few SQL constructs that differ between Postgres and SQLite, each behind one helper."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement


def insert_ignoring_conflicts(
    dialect_name: str, table: sa.Table, conflict_columns: Sequence[str]
) -> sa.Insert:
    """``INSERT … ON CONFLICT (cols) DO NOTHING`` for either backend."""
    module: Any = postgresql if dialect_name == "postgresql" else sqlite
    stmt: sa.Insert = module.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
    return stmt


def json_matches(dialect_name: str, column: Any, key: str, value: Any) -> ColumnElement[bool]:
    """``column[key] == value`` for a JSON object column (scalars, lists and objects alike)."""
    if dialect_name == "postgresql":
        return sa.cast(column, postgresql.JSONB).contains({key: value})
    path = "$." + json.dumps(key)
    extracted = sa.func.json_extract(column, path)
    if isinstance(value, bool):
        return extracted == int(value)
    if isinstance(value, dict | list):
        return extracted == json.dumps(value, separators=(",", ":"))
    if value is None:
        return sa.func.json_type(column, path) == "null"
    return extracted == value


def contains_text(column: Any, needle: str) -> ColumnElement[bool]:
    """Substring match that treats ``%`` and ``_`` in ``needle`` literally."""
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.like(f"%{escaped}%", escape="\\")


def upsert(dialect_name: str, table: sa.Table, key_columns: Sequence[str], values: dict[str, Any]) -> sa.Insert:
    """``INSERT … ON CONFLICT (keys) DO UPDATE`` setting every non-key column given in ``values``."""
    module: Any = postgresql if dialect_name == "postgresql" else sqlite
    stmt = module.insert(table).values(values)
    update = {name: stmt.excluded[name] for name in values if name not in key_columns}
    result: sa.Insert = stmt.on_conflict_do_update(index_elements=list(key_columns), set_=update)
    return result
