"""Emitters: rewards, messages, objects, exceptions and operations, written as spans of the current attempt.

Each emitter starts a span on the process's tracer (see :mod:`tracers.provider`); under a
:meth:`tracers.Tracer.attempt` block it lands on that attempt, elsewhere it goes only to the application's own
OpenTelemetry processors, if any. Names and attributes are listed in ``docs/reference/spans.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from lightning_store import semconv
from tracers.provider import get_tracer


def emit_reward(
    value: float | Mapping[str, float],
    *,
    primary: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> None:
    """Record a reward. A mapping is a multi-dimensional reward and needs ``primary``, the dimension that
    training uses (it is written first, as dimension 0). Booleans and integers count as floats; NaN and
    infinities are refused (``ValueError``)."""
    if isinstance(value, Mapping):
        if primary is None or primary not in value:
            raise ValueError(f"a reward with several dimensions needs primary= one of {sorted(value)}")
        dimensions = [(primary, value[primary])] + [(k, v) for k, v in value.items() if k != primary]
    else:
        if primary is not None:
            raise ValueError("primary= names a dimension of a reward mapping; this reward is a single number")
        dimensions = [("primary", value)]
    written: dict[str, AttributeValue] = dict(attributes or {})
    for index, (name, number) in enumerate(dimensions):
        written[semconv.reward_name(index)] = name
        written[semconv.reward_value(index)] = _finite(name, number)
    get_tracer().start_span(semconv.ANNOTATION, attributes=written).end()


def emit_message(text: str, *, attributes: Mapping[str, AttributeValue] | None = None) -> None:
    """Record a free-form message (a log line that belongs to the attempt)."""
    if not isinstance(text, str):
        raise TypeError(f"a message is a string, not {type(text).__name__}")
    get_tracer().start_span(semconv.MESSAGE, attributes={**(attributes or {}), semconv.MESSAGE_BODY: text}).end()


def emit_object(value: Any, *, attributes: Mapping[str, AttributeValue] | None = None) -> None:
    """Record a value: strings, numbers and booleans as themselves, anything else as JSON."""
    written: dict[str, AttributeValue] = {**(attributes or {}), semconv.OBJECT_TYPE: type(value).__name__}
    if isinstance(value, str | bool | int | float):
        written[semconv.OBJECT_LITERAL] = value
    else:
        written[semconv.OBJECT_JSON] = to_json(value)
    get_tracer().start_span(semconv.OBJECT, attributes=written).end()


def emit_exception(error: BaseException, *, attributes: Mapping[str, AttributeValue] | None = None) -> None:
    """Record an exception: an ERROR span with the OpenTelemetry ``exception`` event and ``error.type``."""
    span = get_tracer().start_span(
        semconv.EXCEPTION, attributes={**(attributes or {}), semconv.ERROR_TYPE: type(error).__qualname__}
    )
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


def to_json(value: Any) -> str:
    """JSON for span attributes; what JSON cannot encode is written as its ``repr``."""
    return json.dumps(value, default=repr, ensure_ascii=False)


def _finite(name: str, number: Any) -> float:
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise ValueError(f"reward {name!r} must be a number, not {type(number).__name__}")
    if not math.isfinite(number):
        raise ValueError(f"reward {name!r} must be finite, not {number}")
    return float(number)
