"""Line diffs of prompt templates for the dashboard (stdlib ``difflib``), and the small helpers the runs and
resources pages share: id checks, bound ``IN`` lists, JSON columns as Python values."""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from lightning_store.limits import Id

_ID: TypeAdapter[str] = TypeAdapter(Id)


MAX_EXACT_LINES = 2000
"""Up to this many lines in both texts together, the diff is exact (no line treated as junk)."""


@dataclass(frozen=True)
class DiffLine:
    """One line of a diff: ``add`` (only in the new text), ``del`` (only in the old one) or ``ctx`` (in both)."""

    kind: Literal["add", "del", "ctx"]
    text: str


def line_diff(old: str, new: str) -> list[DiffLine]:
    """Every line of ``old`` and ``new`` in order, each marked as kept, removed or added (a full-context diff:
    templates are short, and a reader wants to see the whole prompt). Equal texts give only ``ctx`` lines."""
    a, b = old.splitlines(), new.splitlines()
    lines: list[DiffLine] = []
    # SequenceMatcher without autojunk is quadratic in the worst case: a template of thousands of lines (anything
    # can be stored) is matched with autojunk on, which may mark more lines changed but answers at once.
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=len(a) + len(b) > MAX_EXACT_LINES)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            lines += [DiffLine("ctx", text) for text in a[i1:i2]]
            continue
        lines += [DiffLine("del", text) for text in a[i1:i2]]
        lines += [DiffLine("add", text) for text in b[j1:j2]]
    return lines


def is_possible_id(text: str) -> bool:
    """Whether ``text`` could be a stored rollout or resources id (1 to 128 characters, no ``/``, NUL or lone
    surrogate): anything else is answered 404 at once, without asking the database (where a NUL would fail)."""
    try:
        _ID.validate_python(text)
    except ValidationError:
        return False
    return True


def in_list(prefix: str, values: Iterable[Any]) -> tuple[str, dict[str, Any]]:
    """``(:prefix0, :prefix1, …)`` and its parameters, for ``column IN …`` with bound values; ``(NULL)`` (which
    matches nothing) when there are none."""
    params = {f"{prefix}{i}": value for i, value in enumerate(values)}
    names = ", ".join(f":{name}" for name in params)
    return f"({names or 'NULL'})", params


def json_value(value: Any) -> Any:
    """A JSON column as Python: Postgres' driver hands back parsed values, SQLite hands back text."""
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def finite(value: Any) -> float | None:
    """A number for a chart (JSON has no NaN or infinity: those are gaps), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def template_texts(value: Any) -> dict[str, str]:
    """``prompt_candidates_v.templates`` (a JSON object name → template text, in text) as a dict; {} when it is
    not one."""
    parsed = json_value(value)
    if not isinstance(parsed, dict):
        return {}
    return {str(k): v for k, v in parsed.items() if isinstance(v, str)}


def string_list(value: Any) -> Sequence[str]:
    """``prompt_candidates_v.parents`` (a JSON list in text) as a list of strings."""
    parsed = json_value(value)
    return [p for p in parsed if isinstance(p, str)] if isinstance(parsed, list) else []
