"""Reading enqueue requests for ``store enqueue``: every line (or row) checked before anything is written.

A line is a task (the JSON value the agent receives as its input) or, with ``whole_requests``, a full
``EnqueueRolloutRequest`` object. :class:`Defaults` holds what the command's options set for every line; a
request line's own fields win over them, ``config`` and ``metadata`` merged key by key. A line that breaks a rule
(not UTF-8, not JSON, a field the models refuse, a value over the store's limits, a rollout id that repeats an
earlier line's) is reported as ``NAME:LINE: reason`` naming the field; blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import Id, check_json
from lightning_store.models import EnqueueRolloutRequest
from lightning_store.task_sources import UnreadableRow

MAX_PROBLEMS = 20
"""Reading stops after this many bad lines: they are enough to see what is wrong with a file."""

_id_adapter: TypeAdapter[str] = TypeAdapter(Id)
_MERGED = ("config", "metadata")


class BadLine(ValueError):
    """Why one line cannot be enqueued (without the file name and line number)."""


@dataclass(frozen=True)
class Defaults:
    """The fields every line gets unless a request line sets them itself (``fields``: only those given), and
    where rollout ids come from: ``id_prefix`` + the task's ``id_field`` (None: the store makes ids)."""

    fields: dict[str, Any] = field(default_factory=dict)
    id_field: str | None = None
    id_prefix: str = ""


@dataclass
class ReadResult:
    """The requests of every good line, in order, and one ``NAME:LINE: reason`` per bad line (at most
    :data:`MAX_PROBLEMS`; ``stopped`` when reading stopped there)."""

    requests: list[EnqueueRolloutRequest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stopped: bool = False


def read_requests(
    lines: Iterable[bytes | UnreadableRow], name: str, defaults: Defaults, *, whole_requests: bool
) -> ReadResult:
    """Parse and validate every line of ``lines`` (raw bytes, as read from a file opened in binary mode, or the
    rows of another source as :func:`lightning_store.task_sources.task_lines` gives them)."""
    result = ReadResult()
    first_line_of: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        if not isinstance(raw, UnreadableRow) and not raw.strip():
            continue
        try:
            if isinstance(raw, UnreadableRow):
                raise BadLine(str(raw))
            request = parse_line(raw, defaults, whole_requests=whole_requests)
            if request.rollout_id is not None:
                first = first_line_of.setdefault(request.rollout_id, number)
                if first != number:
                    raise BadLine(f"rollout id {request.rollout_id!r} repeats line {first}")
        except BadLine as exc:
            result.problems.append(f"{name}:{number}: {exc}")
            if len(result.problems) >= MAX_PROBLEMS:
                result.stopped = True
                break
            continue
        result.requests.append(request)
    return result


def parse_line(raw: bytes, defaults: Defaults, *, whole_requests: bool) -> EnqueueRolloutRequest:
    """One line as a validated request; raises :class:`BadLine` saying why it is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON ({exc.msg})") from None
    except RecursionError:
        raise BadLine("not JSON the store accepts (nested too deeply)") from None
    if whole_requests:
        if not isinstance(value, dict):
            raise BadLine(f"a request must be a JSON object with an input, not {_kind(value)}")
        own: dict[str, Any] = value
    else:
        own = {"input": value}
    body = merged(defaults.fields, own)
    if body.get("rollout_id") is None and defaults.id_field is not None:
        body["rollout_id"] = task_id(body.get("input"), defaults.id_field, defaults.id_prefix)
    try:
        request = EnqueueRolloutRequest.model_validate(body)
        check_json(request.input, "input")
        check_json(request.metadata, "metadata")
    except ValidationError as exc:
        raise BadLine(first_error(exc)) from None
    except InvalidRequestError as exc:
        raise BadLine(exc.message) from None
    return request


def merged(defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``own`` over ``defaults``; ``config`` and ``metadata`` objects merged key by key (``own``'s keys win)."""
    body = {**defaults, **own}
    for key in _MERGED:
        base, mine = defaults.get(key), own.get(key)
        if isinstance(base, dict) and isinstance(mine, dict):
            body[key] = {**base, **mine}
    return body


def task_id(task: Any, id_field: str, prefix: str) -> str:
    """The rollout id ``prefix`` + ``task[id_field]`` (a string or an integer), checked against the id limits."""
    if not isinstance(task, dict) or id_field not in task:
        raise BadLine(f"{id_field}: missing (--id-field {id_field} takes each rollout's id from it)")
    value = task[id_field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadLine(f"{id_field}: a rollout id must be a string or an integer, not {_kind(value)}")
    rollout_id = f"{prefix}{value}"
    try:
        return _id_adapter.validate_python(rollout_id)
    except ValidationError as exc:
        shown = rollout_id if len(rollout_id) <= 40 else rollout_id[:40] + "…"
        raise BadLine(f"{id_field}: rollout id {shown!r}: {_message(exc.errors()[0]['msg'])}") from None


def first_error(exc: ValidationError) -> str:
    """The first error of ``exc`` as ``path.to.field: message``."""
    error = exc.errors()[0]
    path = ".".join(str(part) for part in error["loc"])
    return f"{path}: {_message(error['msg'])}" if path else _message(error["msg"])


def _message(text: str) -> str:
    return text.removeprefix("Value error, ")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )
