"""The few SQL constructs that differ between Postgres and SQLite, each behind one helper."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement


def insert_ignoring_conflicts(dialect_name: str, table: sa.Table, conflict_columns: Sequence[str]) -> sa.Insert:
    """``INSERT … ON CONFLICT (cols) DO NOTHING`` for either backend."""
    module: Any = postgresql if dialect_name == "postgresql" else sqlite
    stmt: sa.Insert = module.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
    return stmt


def json_matches(dialect_name: str, column: Any, key: str, value: Any) -> ColumnElement[bool]:
    """``column[key] == value`` for a JSON object column (scalars, lists and objects alike)."""
    if dialect_name == "postgresql":
        matches: ColumnElement[bool] = sa.cast(column, postgresql.JSONB).contains({key: value})
        return matches
    path = "$." + json.dumps(key)
    extracted: ColumnElement[Any] = sa.func.json_extract(column, path)
    if isinstance(value, bool):
        return extracted == int(value)
    if isinstance(value, dict | list):
        return extracted == json.dumps(value, separators=(",", ":"))
    if value is None:
        kind: ColumnElement[Any] = sa.func.json_type(column, path)
        return kind == "null"
    equal: ColumnElement[bool] = extracted == value
    return equal


def contains_text(dialect_name: str, column: Any, needle: str) -> ColumnElement[bool]:
    """Case-sensitive substring match (SQLite's LIKE ignores ASCII case, so no LIKE; no wildcards to escape)."""
    position = sa.func.strpos if dialect_name == "postgresql" else sa.func.instr
    found: ColumnElement[bool] = position(column, needle) > 0
    return found


def upsert(
    dialect_name: str,
    table: sa.Table,
    key_columns: Sequence[str],
    values: dict[str, Any],
    *,
    on_conflict: dict[str, Any] | None = None,
) -> sa.Insert:
    """``INSERT … ON CONFLICT (keys) DO UPDATE`` setting every non-key column given in ``values``, or the
    expressions in ``on_conflict`` when given. Atomic even when the row does not exist yet."""
    module: Any = postgresql if dialect_name == "postgresql" else sqlite
    stmt = module.insert(table).values(values)
    update = on_conflict or {name: stmt.excluded[name] for name in values if name not in key_columns}
    result: sa.Insert = stmt.on_conflict_do_update(index_elements=list(key_columns), set_=update)
    return result
