"""Spans: OpenTelemetry spans tied to a rollout attempt, in the Agent Lightning 0.3 JSON shape.

Unknown fields are kept (``extra="allow"``) and stored, so a span that a newer client sends loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lightning_store.limits import MAX_SPAN_NAME_LENGTH, Id, OtelId, SequenceId

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext as OtelSpanContext

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[bool] | Sequence[int] | Sequence[float]
Attributes = dict[str, Any]
StatusCode = Literal["UNSET", "OK", "ERROR"]


class SpanContext(BaseModel):
    model_config = ConfigDict(extra="allow")

    trace_id: str
    span_id: str
    is_remote: bool = False
    trace_state: dict[str, str] = Field(default_factory=dict)


class TraceStatus(BaseModel):
    model_config = ConfigDict(extra="allow")

    status_code: StatusCode = "UNSET"
    description: str | None = None


class Event(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    attributes: Attributes = Field(default_factory=dict)
    timestamp: float | None = None


class Link(BaseModel):
    model_config = ConfigDict(extra="allow")

    context: SpanContext
    attributes: Attributes | None = None


class OtelResource(BaseModel):
    """The OpenTelemetry resource (service name, …) of a span; unrelated to training resources."""

    model_config = ConfigDict(extra="allow")

    attributes: Attributes = Field(default_factory=dict)
    schema_url: str = ""


class Span(BaseModel):
    """A stored span. ``(rollout_id, attempt_id, span_id)`` identifies it; ``sequence_id`` orders it."""

    model_config = ConfigDict(extra="allow")

    rollout_id: Id
    attempt_id: Id
    sequence_id: SequenceId
    trace_id: OtelId
    span_id: OtelId = Field(min_length=1)
    parent_id: OtelId | None = None
    name: str = Field(max_length=MAX_SPAN_NAME_LENGTH)
    status: TraceStatus = Field(default_factory=TraceStatus)
    attributes: Attributes = Field(default_factory=dict)
    events: list[Event] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)
    start_time: float | None = None
    end_time: float | None = None
    context: SpanContext | None = None
    parent: SpanContext | None = None
    resource: OtelResource = Field(default_factory=OtelResource)

    @classmethod
    def from_opentelemetry(cls, src: ReadableSpan, rollout_id: str, attempt_id: str, sequence_id: int) -> Span:
        """Convert an SDK span; times become seconds, ids become lowercase hex as OpenTelemetry formats them."""
        from opentelemetry import trace as trace_api

        ctx = src.get_span_context()
        parent = src.parent
        return cls(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            sequence_id=sequence_id,
            trace_id=trace_api.format_trace_id(ctx.trace_id if ctx else 0),
            span_id=trace_api.format_span_id(ctx.span_id if ctx else 0),
            parent_id=trace_api.format_span_id(parent.span_id) if parent else None,
            name=src.name[:MAX_SPAN_NAME_LENGTH],  # a framework's span is kept, its name cut to the limit
            status=TraceStatus(status_code=src.status.status_code.name, description=src.status.description),
            attributes=_jsonable(dict(src.attributes or {})),
            events=[
                Event(name=e.name, attributes=_jsonable(dict(e.attributes or {})), timestamp=_seconds(e.timestamp))
                for e in src.events
            ],
            links=[
                Link(context=_context(link.context), attributes=_jsonable(dict(link.attributes or {})))
                for link in src.links
            ],
            start_time=_seconds(src.start_time),
            end_time=_seconds(src.end_time),
            context=_context(ctx) if ctx else None,
            parent=_context(parent) if parent else None,
            resource=OtelResource(
                attributes=_jsonable(dict(src.resource.attributes)), schema_url=src.resource.schema_url or ""
            ),
        )


def _seconds(nanos: int | None) -> float | None:
    return nanos / 1e9 if nanos else None


def _context(ctx: OtelSpanContext) -> SpanContext:
    from opentelemetry import trace as trace_api

    return SpanContext(
        trace_id=trace_api.format_trace_id(ctx.trace_id),
        span_id=trace_api.format_span_id(ctx.span_id),
        is_remote=ctx.is_remote,
        trace_state=dict(ctx.trace_state.items()) if ctx.trace_state else {},
    )


def _jsonable(attributes: dict[str, Any]) -> dict[str, Any]:
    # OpenTelemetry attribute values may be tuples; JSON has lists only.
    result: dict[str, Any] = json.loads(json.dumps(attributes, default=str))
    return result
