"""The limits on what the store accepts, stated once and enforced in one place.

Every value the store accepts it can store and return unchanged on SQLite and on Postgres; anything else is
refused with an :class:`~lightning_store.errors.InvalidRequestError` naming the field, before anything is
written. The server applies :func:`check_json` to every JSON body it receives (``server/json_body.py``); typed
fields (ids, counts, sequence ids) carry their own bounds through the annotated types below.

Why these limits:

- **Text without NUL or lone surrogates.** Postgres cannot store ``\\u0000`` in ``text`` or ``jsonb``, and a
  lone surrogate has no UTF-8 encoding; refusing both keeps the two backends identical.
- **Finite numbers.** ``NaN`` and ``Infinity`` are not JSON: SQLite would store invalid JSON and Postgres
  refuses them. A number too large for a double (``1e400``) would become ``Infinity``.
- **Integers within 64 bits.** SQLite's JSON functions turn larger ones into floats or ``null``.
- **Nesting at most :data:`MAX_DEPTH` levels.** Deeper values break serialization (pydantic's recursion
  limit), JSON parsers and database functions later, when they are read.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from lightning_store.errors import InvalidRequestError

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects in any JSON value (a body counts as one level)."""
MIN_INT = -(2**63)
MAX_INT = 2**63 - 1
"""Integers anywhere are signed 64-bit."""
MAX_INT32 = 2**31 - 1
"""Resources versions (a count of updates) are 32-bit columns."""
MAX_ID_LENGTH = 128
"""Rollout, attempt, resources and worker ids."""
MAX_OTEL_ID_LENGTH = 64
"""Trace, span and parent span ids (OpenTelemetry's are 32 and 16 hex digits)."""
MAX_SPAN_NAME_LENGTH = 512
"""Characters of a span's name: the name is indexed, and a Postgres b-tree entry holds at most about 2,700 bytes
(512 characters are at most 2,048 bytes of UTF-8); SQLite would store more, but the limit is one for both."""
MAX_MATCH_KEYS = 100
"""Keys of one ``metadata_match`` or ``attributes_match`` filter: each is a condition of the statement, and SQLite
refuses a statement of about 500 (its expression tree's depth limit). Lists of ids or names have no such limit:
each is bound as one parameter."""
MAX_SEQUENCE_ID = 2**53 - 1
"""A caller-chosen span sequence id: exact in a double (JavaScript), and far from the 64-bit counter's end."""

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _bad(text: str) -> bool:
    """Whether ``text`` holds a NUL or a lone surrogate: an ASCII string (a flag Python keeps) cannot hold a
    surrogate, and ``in`` finds a NUL faster than the regex engine starts."""
    return "\x00" in text or (not text.isascii() and _BAD_TEXT.search(text) is not None)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (a NUL or a lone surrogate), or None when it can."""
    if not _bad(text):  # the common case, without the regex (ids are checked by their models, several per span)
        return None
    found = _BAD_TEXT.search(text)
    if found is None:
        return None
    return "contains a NUL character" if found.group() == "\x00" else "contains a lone surrogate (not UTF-8)"


# A JSON escape that may decode to a NUL or a lone surrogate (or, harmlessly, the text "\\u0000").
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_SUSPECT_ESCAPE_BYTES = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def storable_text(text: str) -> str:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD: what both backends can store."""
    return _BAD_TEXT.sub("\ufffd", text)


def storable(value: Any, raw: str | bytes) -> Any:
    """``value``, parsed from the JSON text ``raw``, with every string (keys too) made :func:`storable_text`.

    For what the server records but did not receive from a client (an upstream LLM's answer): the door refuses
    such text in requests, but a model may emit a NUL, and Postgres cannot hold one in ``jsonb``, so the record
    would be lost there and kept on SQLite. Cheap when nothing needs replacing, the common case: one scan of
    ``raw`` for an escape that could decode to such a character, and ``value`` itself comes back."""
    found = _SUSPECT_ESCAPE_BYTES.search(raw) if isinstance(raw, bytes) else _SUSPECT_ESCAPE.search(raw)
    return value if found is None else _replace_bad_text(value)


def _replace_bad_text(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [_replace_bad_text(item) for item in value]
    if isinstance(value, dict):
        return {storable_text(key): _replace_bad_text(item) for key, item in value.items()}
    return value


def check_match(match: Any, field: str) -> dict[str, Any] | None:
    """A ``*_match`` filter (a JSON object of at most :data:`MAX_MATCH_KEYS` keys), or None."""
    if match is None:
        return None
    if not isinstance(match, dict):
        raise InvalidRequestError(f"{field} must be an object", field=field)
    if len(match) > MAX_MATCH_KEYS:
        raise InvalidRequestError(f"{field} has {len(match)} keys; at most {MAX_MATCH_KEYS} are allowed", field=field)
    return match


def check_text(text: str, field: str) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise InvalidRequestError(f"{field}: {problem}", field=field)
    return text


def check_json(value: Any, field: str | None = None, *, depth: int = 1, text: bool = True) -> None:
    """Refuse a JSON value (as ``json.loads`` returns it) that breaks a limit, naming the first bad path
    (``field.key.0``; a whole request body is ``field=None``, its keys named alone and itself ``body``).

    ``depth`` is the nesting level ``value`` itself sits at. ``text=False`` skips the checks of strings, for a
    caller that knows none can break them (JSON text without ``\\u`` escapes holds no NUL or lone surrogate).
    Iterative, so that a deep value cannot exhaust the stack; a fast pass over every value first, and only when
    it finds something a second pass that tracks paths to name it.
    """
    if not _within_limits(value, depth, text):
        _refuse_first_problem(value, field, depth)


def _within_limits(value: Any, depth: int, text: bool) -> bool:
    level: list[Any] = [value]
    if not _fine_scalar(value, text):
        return False
    while level:
        containers: list[Any] = []
        for container in level:
            kind = type(container)
            if kind is dict:
                if text and any(map(_bad, container)):
                    return False
                items = container.values()
            elif kind is list:
                items = container
            else:
                continue
            if depth > MAX_DEPTH:
                return False
            for item in items:
                item_kind = type(item)
                if item_kind is dict or item_kind is list:
                    containers.append(item)
                elif item_kind is float:
                    if not math.isfinite(item):
                        return False
                elif item_kind is int:
                    if not MIN_INT <= item <= MAX_INT:
                        return False
                elif text and item_kind is str and _bad(item):
                    return False
        level = containers
        depth += 1
    return True


def _fine_scalar(value: Any, text: bool) -> bool:
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is int:
        return bool(MIN_INT <= value <= MAX_INT)
    if text and kind is str:
        return not _bad(value)
    return True


def _refuse_first_problem(value: Any, field: str | None, depth: int) -> None:
    stack: list[tuple[Any, str | None, int]] = [(value, field, depth)]
    while stack:
        item, path, level = stack.pop()
        kind = type(item)
        if kind is dict:
            if level > MAX_DEPTH:
                _refuse(path, f"nested deeper than {MAX_DEPTH} levels")
            for key, child in item.items():
                child_path = key if path is None else f"{path}.{key}"
                if _BAD_TEXT.search(key) is not None:
                    check_text(key, child_path)
                _check_scalar_or_push(child, child_path, level + 1, stack)
        elif kind is list:
            if level > MAX_DEPTH:
                _refuse(path, f"nested deeper than {MAX_DEPTH} levels")
            for index, child in enumerate(item):
                _check_scalar_or_push(child, str(index) if path is None else f"{path}.{index}", level + 1, stack)
        else:
            _check_scalar_or_push(item, path, level, stack)


def _check_scalar_or_push(item: Any, path: str | None, level: int, stack: list[tuple[Any, str | None, int]]) -> None:
    kind = type(item)
    if kind is str:
        if _BAD_TEXT.search(item) is not None:
            check_text(item, path or "body")
    elif kind is float:
        if not math.isfinite(item):
            _refuse(path, "numbers must be finite (no NaN, Infinity or overflow)")
    elif kind is int:
        if not MIN_INT <= item <= MAX_INT:
            _refuse(path, "integers must fit in 64 bits")
    elif kind is dict or kind is list:
        stack.append((item, path, level))


def _refuse(path: str | None, problem: str) -> None:
    field = path or "body"
    raise InvalidRequestError(f"{field}: {problem}", field=field)


def _path_segment(text: str) -> str:
    if "/" in text or text in (".", ".."):
        raise ValueError("an id must not contain '/' nor be '.' or '..' (ids appear in URL paths)")
    return _plain_text(text)


def _plain_text(text: str) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


Text = Annotated[str, AfterValidator(_plain_text)]
"""A string without NUL characters or lone surrogates."""
Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_path_segment)]
"""A rollout, attempt, resources or worker id: 1 to 128 characters, no ``/``, not ``.`` or ``..`` (ids appear in
URL paths, where clients rewrite those)."""
OtelId = Annotated[str, StringConstraints(max_length=MAX_OTEL_ID_LENGTH), AfterValidator(_plain_text)]
"""A trace, span or parent span id."""
Int64 = Annotated[int, Field(ge=MIN_INT, le=MAX_INT)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
"""An offset, or a number of items."""
Limit = Annotated[int, Field(ge=-1, le=MAX_INT)]
"""A page size; -1 means no limit."""
SequenceId = Annotated[int, Field(ge=0, le=MAX_SEQUENCE_ID)]
