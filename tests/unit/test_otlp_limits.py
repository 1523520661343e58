"""OTLP ingest checks the store's limits while it converts, and keeps exactly the spans ``check_json`` accepts.

``server/otlp.py`` does not walk each converted span again with :func:`~lightning_store.limits.check_json`: it
notices, while converting, any value that may break a limit and only then asks ``check_json``. These tests hold
that shortcut to the full check: on random exports, with NULs, non-finite doubles and nesting around the depth
limit anywhere a span can hold them, the spans kept and the count dropped are those of converting without the
shortcut and asking ``check_json`` of every span.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import MAX_DEPTH, check_json
from lightning_store.server.otlp import _attributes, _span, _spans


def _rarely(usual: st.SearchStrategy[Any], unusual: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``unusual`` one time in eight: a span holds a dozen values, and a span with one problem among clean values
    is what tells a check that misses that problem from one that does not."""
    return st.integers(0, 7).flatmap(lambda n: unusual if n == 0 else usual)


_text = _rarely(
    st.one_of(
        st.sampled_from(["", "ok", "\\u0000", "ünïcode"]),
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=6),
    ),
    st.sampled_from(["a\x00b", "\x00", "é\x00"]),
)
_double = _rarely(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([math.nan, math.inf, -math.inf]))
_leaf = st.one_of(
    st.builds(lambda text: AnyValue(string_value=text), _text),
    st.builds(lambda number: AnyValue(double_value=number), _double),
    st.builds(lambda number: AnyValue(int_value=number), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda flag: AnyValue(bool_value=flag), st.booleans()),
    st.builds(lambda data: AnyValue(bytes_value=data), st.binary(max_size=4)),
    st.just(AnyValue()),
)


# Values are copied with CopyFrom: extend() and the constructors copy through upb's parser, which refuses the
# nesting these tests need (about 50 arrays deep, as it refuses it on the wire and in OTLP/JSON).


def _array(items: list[AnyValue]) -> AnyValue:
    value = AnyValue()
    for item in items:
        value.array_value.values.add().CopyFrom(item)
    return value


def _kvlist(items: list[tuple[str, AnyValue]]) -> AnyValue:
    value = AnyValue()
    _put(value.kvlist_value.values, items)
    return value


def _put(attributes: Any, items: list[tuple[str, AnyValue]]) -> None:
    for key, item in items:
        attributes.add(key=key).value.CopyFrom(item)


def _nested(levels: int, leaf: AnyValue, kinds: list[bool]) -> AnyValue:
    """``leaf`` inside ``levels`` arrays and key-value lists (``kinds`` picks which, cycling)."""
    outer = AnyValue()
    value = outer
    for level in range(levels):
        value = (
            value.array_value.values.add()
            if kinds[level % len(kinds)]
            else value.kvlist_value.values.add(key="k").value
        )
    value.CopyFrom(leaf)
    return outer


_deep = st.builds(
    _nested, st.integers(MAX_DEPTH - 5, MAX_DEPTH + 1), _leaf, st.lists(st.booleans(), min_size=1, max_size=3)
)
_value = st.recursive(
    _rarely(_leaf, _deep),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(_array),
        st.lists(st.tuples(_text, inner), max_size=3).map(_kvlist),
    ),
    max_leaves=6,
)
_attributes_strategy = st.lists(st.tuples(_text, _value), max_size=3)


@st.composite
def _exports(draw: st.DrawFn) -> ExportTraceServiceRequest:
    export = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        resource_spans = export.resource_spans.add()
        resource_spans.schema_url = draw(_rarely(st.just("https://x"), st.just("nul\x00")))
        ids = [("agentlightning.rollout_id", AnyValue(string_value="r-1"))]
        ids += [("agentlightning.attempt_id", AnyValue(string_value="a-1"))] if draw(st.booleans()) else []
        _put(resource_spans.resource.attributes, ids + draw(_attributes_strategy))
        spans = resource_spans.scope_spans.add().spans
        for number in range(draw(st.integers(1, 4))):
            proto = spans.add()
            proto.span_id = number.to_bytes(8, "big")
            proto.name = draw(_text)
            proto.status.message = draw(_text)
            extra = [("agentlightning.attempt_id", AnyValue(string_value="a-2"))] if draw(st.booleans()) else []
            _put(proto.attributes, extra + draw(_attributes_strategy))
            for _ in range(draw(st.integers(0, 2))):
                event = proto.events.add(name=draw(_text))
                _put(event.attributes, draw(_attributes_strategy))
            for _ in range(draw(st.integers(0, 1))):
                _put(proto.links.add().attributes, draw(_attributes_strategy))
    return export


def _by_the_full_check(export: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], int]:
    kept: list[dict[str, Any]] = []
    dropped = 0
    for resource_spans in export.resource_spans:
        resource = _attributes(resource_spans.resource.attributes, None)
        for proto in resource_spans.scope_spans[0].spans:
            span = _span(proto, resource, resource_spans.schema_url, checked=False)
            try:
                check_json(span, "span")
            except InvalidRequestError:
                span = None
            if span is None:
                dropped += 1
            else:
                kept.append(span)
    return kept, dropped


def _comparable(value: Any) -> Any:
    """NaN is not equal to itself; the spans are compared with it spelled out."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_comparable(item) for item in value]
    return value


@settings(max_examples=500, deadline=None)
@given(_exports())
def test_otlp_keeps_exactly_the_spans_the_full_check_accepts(export: ExportTraceServiceRequest) -> None:
    spans, rejected, problem = _spans(export)
    kept, dropped = _by_the_full_check(export)
    assert _comparable(spans) == _comparable(kept)
    assert rejected == dropped
    assert bool(problem) == bool(dropped)


def test_the_depth_limit_falls_where_check_json_puts_it() -> None:
    """A value nested to the limit is kept and one level deeper is dropped, in each place a span holds values."""
    for depth_of_place, place in ((2, "attributes"), (4, "events"), (4, "links"), (3, "resource")):
        for extra, expected_kept in ((MAX_DEPTH - depth_of_place, 1), (MAX_DEPTH - depth_of_place + 1, 0)):
            value = _nested(extra, AnyValue(int_value=1), [True])
            export = ExportTraceServiceRequest()
            resource_spans = export.resource_spans.add()
            ids = [(f"agentlightning.{name}", AnyValue(string_value="x")) for name in ("rollout_id", "attempt_id")]
            _put(resource_spans.resource.attributes, ids)
            proto = resource_spans.scope_spans.add().spans.add(name="s")
            holder = {
                "attributes": proto.attributes,
                "events": proto.events.add(name="e").attributes,
                "links": proto.links.add().attributes,
                "resource": resource_spans.resource.attributes,
            }[place]
            _put(holder, [("v", value)])
            spans, rejected, _ = _spans(export)
            assert (len(spans), rejected) == (expected_kept, 1 - expected_kept), (place, extra)
