"""The rollouts page's query string: parsed, checked, and turned back into links.

Every parameter is optional; an empty one (a form field left blank) counts as absent. A bad value is collected
as an error naming its field, never raised: the page shows all of them at once, with HTTP 422. Values only ever
reach SQL as bound parameters (see :mod:`lightning_store.dashboard.rollouts_query`); the one piece of user text
that shapes a statement, ``meta_key``, is checked against :data:`META_KEY` and bound as a parameter too.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlencode

from lightning_store.limits import MAX_ID_LENGTH, MAX_INT32
from lightning_store.models import ROLLOUT_MODES, ROLLOUT_STATUSES

PAGE_SIZE = 50
MAX_PAGE = 1_000_000
NO_MODE = "none"
"""The ``mode`` value that selects rollouts without a mode (NULL)."""
MODES = (*ROLLOUT_MODES, NO_MODE)
SORTS = ("start_time", "end_time", "duration", "reward", "status")
META_KEY = re.compile(r"[A-Za-z0-9_.-]{1,100}")
MAX_TEXT = 1000
"""Longest ``meta_value`` and ``q`` accepted."""

Order = Literal["asc", "desc"]


@dataclass
class RolloutFilters:
    """The rollouts page's filters, sort and page, as checked values (``None``/empty: not filtered on)."""

    status: list[str] = field(default_factory=list)
    mode: list[str] = field(default_factory=list)
    since: float | None = None
    until: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    resources_id: str | None = None
    resources_version: int | None = None
    meta_key: str | None = None
    meta_value: str | None = None
    q: str | None = None
    sort: str = "start_time"
    order: Order = "desc"
    page: int = 1
    raw: dict[str, list[str]] = field(default_factory=dict)
    """The parameters as given (for the form, which shows what was typed even when it was refused)."""

    @property
    def offset(self) -> int:
        return (self.page - 1) * PAGE_SIZE

    @property
    def filtered(self) -> bool:
        """Whether any filter (not sort or page) is set."""
        return bool(
            self.status
            or self.mode
            or self.q
            or self.resources_id
            or self.meta_key
            or any(
                v is not None
                for v in (self.since, self.until, self.reward_min, self.reward_max, self.resources_version)
            )
        )

    def given(self, name: str) -> str:
        """The first value given for ``name``, as typed ('' when none)."""
        values = self.raw.get(name) or [""]
        return values[0]

    def chosen(self, name: str) -> list[str]:
        return self.raw.get(name) or []

    def link(self, **changes: object) -> str:
        """The page's URL with these parameters changed (``None`` removes one); parameters as given."""
        params: dict[str, list[str]] = {k: list(v) for k, v in self.raw.items() if k != "page"}
        params["page"] = [str(self.page)]
        for name, value in changes.items():
            if value is None:
                params.pop(name, None)
            else:
                params[name] = [str(value)]
        pairs = [(k, v) for k, values in params.items() for v in values if v != "" and not (k == "page" and v == "1")]
        return "/dashboard/rollouts" + (f"?{urlencode(pairs)}" if pairs else "")


def parse_filters(query: Sequence[tuple[str, str]]) -> tuple[RolloutFilters, dict[str, str]]:
    """The filters in a query string (its ``(name, value)`` pairs, in order), and what is wrong with them:
    field name → message (empty when all is well)."""
    raw: dict[str, list[str]] = {}
    for name, value in query:
        raw.setdefault(name, []).append(value)
    errors: dict[str, str] = {}
    f = RolloutFilters(raw=raw)
    # Surrounding blanks are dropped (a pasted id, a number), except in meta_value: a value may have them.
    first = {name: next((v.strip() for v in values if v.strip() != ""), None) for name, values in raw.items()}

    f.status = _choices([v.strip() for v in raw.get("status", [])], ROLLOUT_STATUSES, "status", errors)
    f.mode = _choices([v.strip() for v in raw.get("mode", [])], MODES, "mode", errors)
    f.since = _time(first.get("since"), "since", errors)
    f.until = _time(first.get("until"), "until", errors)
    if f.since is not None and f.until is not None and f.since > f.until:
        errors["until"] = "until is earlier than since"
    f.reward_min = _number(first.get("reward_min"), "reward_min", errors)
    f.reward_max = _number(first.get("reward_max"), "reward_max", errors)
    if f.reward_min is not None and f.reward_max is not None and f.reward_min > f.reward_max:
        errors["reward_max"] = "reward_max is smaller than reward_min"
    f.resources_id = _text(first.get("resources_id"), "resources_id", MAX_ID_LENGTH, errors)
    f.resources_version = _integer(first.get("resources_version"), "resources_version", 0, MAX_INT32, errors)
    f.meta_key = first.get("meta_key")
    meta_value = next((v for v in raw.get("meta_value", []) if v != ""), None)
    f.meta_value = _text(meta_value, "meta_value", MAX_TEXT, errors)
    if f.meta_key is not None and not META_KEY.fullmatch(f.meta_key):
        errors["meta_key"] = "meta_key must be 1 to 100 letters, digits, '_', '.' or '-'"
    if f.meta_key is not None and f.meta_value is None and "meta_value" not in errors:
        errors["meta_value"] = "meta_value is needed with meta_key"
    if f.meta_value is not None and f.meta_key is None:
        errors["meta_key"] = "meta_key is needed with meta_value"
    f.q = _text(first.get("q"), "q", MAX_ID_LENGTH, errors)
    sort = first.get("sort") or "start_time"
    if sort not in SORTS:
        errors["sort"] = f"sort must be one of {', '.join(SORTS)}"
    else:
        f.sort = sort
    order = first.get("order") or "desc"
    if order not in ("asc", "desc"):
        errors["order"] = "order must be asc or desc"
    else:
        f.order = "asc" if order == "asc" else "desc"
    page = _integer(first.get("page"), "page", 1, MAX_PAGE, errors)
    f.page = page or 1
    return f, errors


def _choices(values: list[str], allowed: Sequence[str], name: str, errors: dict[str, str]) -> list[str]:
    chosen = [v for v in values if v != ""]
    bad = [v for v in chosen if v not in allowed]
    if bad:
        errors[name] = f"unknown {name} {_shown(bad[0])}: choose from {', '.join(allowed)}"
        return []
    return sorted(set(chosen), key=chosen.index)


def _time(value: str | None, name: str, errors: dict[str, str]) -> float | None:
    """Seconds since the epoch from ``1795541615.6``, ``2026-11-24T17:25`` (UTC when no offset is given, as
    the page shows times) or any ISO 8601 date and time Python reads."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            errors[name] = f"{name} must be a date and time (2026-11-24T17:25, ISO 8601) or seconds since the epoch"
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        try:
            seconds = moment.timestamp()
        except (OverflowError, ValueError, OSError):
            seconds = math.inf
    if not math.isfinite(seconds) or not 0 <= seconds < 1e11:
        errors[name] = f"{name} is out of range"
        return None
    return seconds


def _number(value: str | None, name: str, errors: dict[str, str]) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        errors[name] = f"{name} must be a number"
        return None
    if not math.isfinite(number):
        errors[name] = f"{name} must be a finite number"
        return None
    return number


def _integer(value: str | None, name: str, low: int, high: int, errors: dict[str, str]) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]{1,10}", value) or not low <= int(value) <= high:
        errors[name] = f"{name} must be a whole number from {low} to {high}"
        return None
    return int(value)


def _text(value: str | None, name: str, limit: int, errors: dict[str, str]) -> str | None:
    if value is None:
        return None
    if len(value) > limit:
        errors[name] = f"{name} is longer than {limit} characters"
        return None
    if re.search("[\x00\ud800-\udfff]", value):
        errors[name] = f"{name} contains a character that cannot be stored"
        return None
    return value


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:39] + "…")
