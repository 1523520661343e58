"""The few SQL constructs that differ between Postgres and SQLite, each behind one helper."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

_STRING_OR_BIG_FLOAT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?\d+(?:\.\d+)?[eE]\+?\d+)')
_EXPONENT_TOKENS = (re.compile(r"e\+?\d+(?:[,}\]\s]|$)"), re.compile(r"E\+?\d+(?:[,}\]\s]|$)"))
_NUMBER_CHARS = frozenset("0123456789.-")
_BEFORE_A_NUMBER = frozenset(":,[ \t\r\n")


def jsonb_text(text: str) -> str:
    """JSON text as Postgres's ``jsonb`` keeps it: a float written with a positive exponent (``1e+16``, or
    ``1e16`` as pydantic writes it) is written out in full with a decimal point.

    Why: ``jsonb`` stores numbers as ``numeric`` and prints them without an exponent, so ``1e+16`` would come
    back as the integer ``10000000000000000`` (SQLite keeps it a float)."""
    if not _has_positive_exponent(text):
        return text
    return _STRING_OR_BIG_FLOAT.sub(_written_out, text)


def _has_positive_exponent(text: str) -> bool:
    """Whether ``text`` may hold a number written with a positive exponent: ``e`` (or ``E``), an optional ``+``
    and digits that end a token (a ``,``, ``}``, ``]``, whitespace or the end follows), after a digit, in a
    token that starts after ``:``, ``,``, ``[`` or whitespace (or the document). A string can pass
    (``"a:1e5 "``), which only costs the full pass; a number cannot slip through.

    Why this shape: the search starts from a literal ``e``, which the regex engine finds at C speed, where a
    search that starts from a digit (or a class) tries every position: 10 µs per span of 1.25 KB, a tenth of the
    server's CPU on Postgres span ingest. Hex ids (trace and span ids) hold digit-e-digit in most spans but
    never end a token with it (a quote follows), so the matches left to check are few.
    """
    for pattern in _EXPONENT_TOKENS:
        for found in pattern.finditer(text):
            start = found.start()
            if start == 0 or not text[start - 1].isdigit():
                continue
            while start > 0 and text[start - 1] in _NUMBER_CHARS:
                start -= 1
            if start == 0 or text[start - 1] in _BEFORE_A_NUMBER:
                return True
    return False


def _written_out(found: re.Match[str]) -> str:
    number = found.group(1)
    return found.group(0) if number is None else format(Decimal(number), "f") + ".0"


def postgres_json(value: Any) -> str:
    """The JSON serializer of Postgres engines (see :func:`jsonb_text`)."""
    return jsonb_text(json.dumps(value))


def insert_ignoring_conflicts(dialect_name: str, table: sa.Table, conflict_columns: Sequence[str]) -> sa.Insert:
    """``INSERT … ON CONFLICT (cols) DO NOTHING`` for either backend."""
    module: Any = postgresql if dialect_name == "postgresql" else sqlite
    stmt: sa.Insert = module.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
    return stmt


def json_matches(dialect_name: str, column: Any, key: str, value: Any) -> ColumnElement[bool]:
    """``column[key] == value`` for a JSON object column (scalars, lists and objects alike): equality, not
    containment. On SQLite an object value equals the stored one when its keys come in the same order."""
    if dialect_name == "postgresql":
        matches: ColumnElement[bool] = sa.cast(column, postgresql.JSONB)[key] == sa.bindparam(
            None, value, type_=postgresql.JSONB
        )
        return matches
    if '"' in key or "\\" in key:
        # SQLite's JSON paths cannot quote these characters; json_each names the key as a plain value.
        entry = sa.func.json_each(column).table_valued("key", "value", "type").alias()
        found = sa.select(entry.c.value).where(entry.c.key == key).scalar_subquery()
        kind = sa.select(entry.c.type).where(entry.c.key == key).scalar_subquery()
        return _sqlite_equals(found, kind, value)
    path = "$." + json.dumps(key)
    return _sqlite_equals(sa.func.json_extract(column, path), sa.func.json_type(column, path), value)


def _sqlite_equals(extracted: Any, kind: Any, value: Any) -> ColumnElement[bool]:
    """``extracted`` (an SQL value, or minified JSON text for arrays and objects) of JSON type ``kind`` equals
    the JSON ``value``; the type is compared too, since SQLite gives ``true`` and ``1`` the same SQL value."""
    if isinstance(value, bool):
        return kind == ("true" if value else "false")  # type: ignore[no-any-return]
    if value is None:
        return kind == "null"  # type: ignore[no-any-return]
    kinds: tuple[str, ...]
    if isinstance(value, dict | list):
        expected, kinds = json.dumps(value, separators=(",", ":")), ("object", "array")
    else:
        expected, kinds = value, ("text",) if isinstance(value, str) else ("integer", "real")
    return sa.and_(extracted == expected, kind.in_(kinds))


def among(dialect_name: str, column: Any, values: Iterable[str]) -> ColumnElement[bool]:
    """``column IN (values)`` for a string column, with the whole list bound as one parameter: a Postgres array
    (``= ANY``), a JSON array on SQLite (``IN (SELECT value FROM json_each(…))``).

    Why not ``column.in_(values)``: SQLAlchemy renders an expanding ``IN`` anew on every execution, in Python, one
    placeholder per value. The hot reads that take a batch's ids (a wait over a few hundred rollouts re-reads its
    pending ids at every attempt end) spent more CPU there than in the database. One parameter keeps the
    statement's compiled form cached whatever the list's length, and the database unpacks the list."""
    return _among(dialect_name, column, None, among_value(dialect_name, values))


def among_param(dialect_name: str, column: Any, name: str) -> ColumnElement[bool]:
    """:func:`among` with the list bound at execution, as parameter ``name`` (its value from
    :func:`among_value`): for statements built once and executed many times."""
    return _among(dialect_name, column, name, None)


def among_value(dialect_name: str, values: Iterable[str]) -> Any:
    """The value of an :func:`among_param` parameter: the list itself on Postgres, its JSON text on SQLite."""
    listed = list(values)
    return listed if dialect_name == "postgresql" else json.dumps(listed)


def _among(dialect_name: str, column: Any, name: str | None, value: Any) -> ColumnElement[bool]:
    """``column`` among the list bound as parameter ``name`` (``None``: an anonymous one holding ``value``)."""
    bound: dict[str, Any] = {} if value is None else {"value": value}
    if dialect_name == "postgresql":
        listed = sa.bindparam(name, type_=postgresql.ARRAY(sa.String()), **bound)
        found: ColumnElement[bool] = column == sa.any_(listed)
        return found
    unpacked = sa.func.json_each(sa.bindparam(name, type_=sa.String(), **bound)).table_valued("value")
    return column.in_(sa.select(unpacked.c.value))  # type: ignore[no-any-return]


def inlined(values: Iterable[str]) -> list[ColumnElement[str]]:
    """Values written into the SQL as literals: an ``IN`` over them stays one compiled statement (an expanding
    ``IN`` is rendered anew at every execution) and usable in executemany."""
    return [sa.literal_column(f"'{value}'") for value in values]


def contains_text(dialect_name: str, column: Any, needle: str) -> ColumnElement[bool]:
    """Case-sensitive substring match (SQLite's LIKE ignores ASCII case, so no LIKE; no wildcards to escape)."""
    position = sa.func.strpos if dialect_name == "postgresql" else sa.func.instr
    found: ColumnElement[bool] = position(column, needle) > 0
    return found


@functools.lru_cache(maxsize=64)
def upsert_by_name(
    dialect_name: str, table: sa.Table, key_columns: tuple[str, ...], columns: tuple[str, ...]
) -> sa.Insert:
    """A cached ``upsert`` whose values are bound by column name at execution: ``conn.execute(stmt, values)``."""
    return upsert(dialect_name, table, key_columns, {name: sa.bindparam(name) for name in columns})


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


def insert_from_json_array(
    dialect_name: str,
    table: sa.Table,
    fields: Sequence[str],
    *,
    extra_column: str | None,
    conflict_columns: Sequence[str],
    returning: Sequence[str] = (),
) -> sa.TextClause:
    """``INSERT … SELECT`` of the objects in the JSON array bound as ``:doc``, one row per object.

    The database splits the array (``jsonb_array_elements`` / ``json_each``), so a batch costs one JSON
    encoding in Python and one statement, instead of one encoding per JSON column per row. Each of ``fields``
    fills the column of the same name (cast to its type); the object's other keys go to ``extra_column`` (NULL
    when none; dropped without one). Rows that conflict on ``conflict_columns`` are skipped; ``returning`` names
    what the statement returns for the rows it inserted.
    """
    known = ", ".join(f"'{name}'" for name in fields)
    if dialect_name == "postgresql":
        values = [_pg_field(table.c[name]) for name in fields]
        if extra_column is not None:
            values.append(f"NULLIF(d - ARRAY[{known}]::text[], '{{}}'::jsonb)")
        source = "FROM jsonb_array_elements(CAST(:doc AS jsonb)) AS d"
    else:
        values = [_sqlite_field(table.c[name]) for name in fields]
        if extra_column is not None:
            paths = ", ".join(f"'$.{name}'" for name in fields)
            values.append(f"NULLIF(json_remove(value, {paths}), '{{}}')")
        # "WHERE true" keeps SQLite from reading ON CONFLICT as a join constraint of the SELECT.
        source = "FROM json_each(:doc) WHERE true"
    columns = ", ".join([*fields, *([extra_column] if extra_column is not None else [])])
    returns = f" RETURNING {', '.join(returning)}" if returning else ""
    return sa.text(
        f"INSERT INTO {table.name} ({columns}) SELECT {', '.join(values)} {source} "
        f"ON CONFLICT ({', '.join(conflict_columns)}) DO NOTHING{returns}"
    )


def _pg_field(column: sa.Column[Any]) -> str:
    name = column.name
    if isinstance(column.type, sa.JSON):
        # A nullable column gets SQL NULL for a JSON null, as SQLite's json_extract gives it.
        return f"NULLIF(d -> '{name}', 'null'::jsonb)" if column.nullable else f"d -> '{name}'"
    if isinstance(column.type, sa.Double):
        return f"(d ->> '{name}')::double precision"
    if isinstance(column.type, sa.Integer):
        return f"(d ->> '{name}')::bigint"
    return f"d ->> '{name}'"


def _sqlite_field(column: sa.Column[Any]) -> str:
    # json_extract yields SQL values for scalars and minified JSON text for objects and arrays, which is how
    # the JSON columns are stored on SQLite.
    return f"json_extract(value, '$.{column.name}')"
