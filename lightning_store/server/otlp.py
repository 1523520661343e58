"""OTLP/HTTP trace ingest: ``POST /v1/traces`` in protobuf or JSON, optionally gzip-compressed (and :func:`ingest`,
which the OTLP/gRPC service shares).

Each span is bound to a rollout attempt by the attributes ``agentlightning.rollout_id`` and
``agentlightning.attempt_id`` (or ``lightning_store.…``), looked up on the span first and then on its resource;
``…span_sequence_id`` is optional and allocated from the rollout's counter when absent. Spans without ids are
counted as rejected in the OTLP partial-success answer; the others are stored in one batch.

A span that breaks the store's limits (``lightning_store.limits``) is rejected alone, the same way. The limits
are checked while a span is converted rather than by walking the result again (half of the conversion's cost):
only a span in which the conversion saw a value that may break one goes through ``check_json``, which decides.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.limits import MAX_DEPTH, MAX_SEQUENCE_ID, MAX_SPAN_NAME_LENGTH, check_json
from lightning_store.server.json_body import decode
from lightning_store.server.routes_rollouts import Store

router = APIRouter()

ID_PREFIXES = ("agentlightning.", "lightning_store.")
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}

# The nesting level at which each attributes object sits in a stored span (the span itself is level 1), for the
# depth limit: ``span.attributes``, ``span.resource.attributes``, ``span.events.N.attributes`` (and links').
ATTRIBUTES_DEPTH = 2
RESOURCE_DEPTH = 3
NESTED_ATTRIBUTES_DEPTH = 4
_NUL = "\x00"
_ID_KEYS = {
    name: tuple(prefix + name for prefix in ID_PREFIXES) for name in ("rollout_id", "attempt_id", "span_sequence_id")
}


class _Suspect(Exception):
    """A value that may break the store's limits: its span is converted again and judged by ``check_json``."""


@router.post("/v1/metrics", include_in_schema=False)
@router.post("/v1/logs", include_in_schema=False)
@router.post("/v1/development/profiles", include_in_schema=False)
async def other_signals() -> Response:
    """OTLP's other signals: 501, as Agent Lightning's server answers (an exporter of metrics or logs pointed at
    the store's base URL gets a clear "not here", not a 404 that reads as a wrong address)."""
    return Response(status_code=501)


@router.post("/v1/traces")
async def export_traces(request: Request, store: Store) -> Response:
    body = _decompressed(await request.body(), request.headers.get("content-encoding", ""), request.app.state.max_body)
    as_json = request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"
    answer = await ingest(store, _parse(body, as_json))
    if as_json:
        return Response(json_format.MessageToJson(answer), media_type="application/json")
    return Response(answer.SerializeToString(), media_type="application/x-protobuf")


async def ingest(store: LightningStore, export: ExportTraceServiceRequest) -> ExportTraceServiceResponse:
    """Store the spans of ``export`` in one batch and answer what OTLP answers: the spans without ids or past the
    limits rejected alone (partial success). Shared by ``POST /v1/traces`` and the gRPC service
    (:mod:`lightning_store.server.otlp_grpc`). A store error (an unknown attempt, an outage) is raised."""
    spans, rejected, problem = _spans(export)
    missing = [i for i, span in enumerate(spans) if span["sequence_id"] is None]
    if spans and len(missing) == len(spans):  # the usual case: the store numbers them as it writes them
        await store.add_many_spans(spans, allocate_sequence_ids=True)  # type: ignore[arg-type]  # validated there
    elif spans:
        numbers = await store.get_many_span_sequence_ids(
            [(spans[i]["rollout_id"], spans[i]["attempt_id"]) for i in missing]
        )
        for i, number in zip(missing, numbers, strict=True):
            spans[i]["sequence_id"] = number
        await store.add_many_spans(spans)  # type: ignore[arg-type]  # validated by the store
    answer = ExportTraceServiceResponse()
    if rejected:
        answer.partial_success.rejected_spans = rejected
        answer.partial_success.error_message = problem
    return answer


def _decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding.strip().lower() != "gzip":
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidRequestError(f"body is not valid gzip: {exc}", field="body") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise InvalidRequestError(f"decompressed body over the limit of {limit} bytes", field="body")
    return data


def _parse(body: bytes, as_json: bool) -> ExportTraceServiceRequest:
    export = ExportTraceServiceRequest()
    try:
        if as_json:
            # OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64 for bytes.
            payload = decode(body or b"{}", checked=False)
            if not isinstance(payload, dict):
                raise InvalidRequestError("body: an OTLP export request must be a JSON object", field="body")
            json_format.ParseDict(_hex_ids_to_base64(payload), export)
        else:
            export.ParseFromString(body)
    except InvalidRequestError:
        raise
    except (DecodeError, json_format.ParseError, ValueError, RecursionError) as exc:
        raise InvalidRequestError(f"undecodable OTLP traces payload: {exc}", field="body") from None
    return export


def _hex_ids_to_base64(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: base64.b64encode(bytes.fromhex(item)).decode()
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(item, str)
            else _hex_ids_to_base64(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids_to_base64(item) for item in value]
    return value


def _spans(export: ExportTraceServiceRequest) -> tuple[list[dict[str, Any]], int, str]:
    """The export's spans in the store's shape, how many were dropped, and why the last one was: a span without
    rollout and attempt ids, or one whose values break the store's limits (a NUL in a string, say), is dropped
    alone so that it does not sink its batch (OTLP's partial success)."""
    spans: list[dict[str, Any]] = []
    rejected = 0
    problem = ""
    for resource_spans in export.resource_spans:
        schema_url = resource_spans.schema_url
        try:
            resource = _attributes(resource_spans.resource.attributes, RESOURCE_DEPTH)
            resource_checked = _NUL not in schema_url
        except _Suspect:
            resource = _attributes(resource_spans.resource.attributes, None)
            resource_checked = False
        for scope_spans in resource_spans.scope_spans:
            for proto in scope_spans.spans:
                try:
                    if not resource_checked:
                        raise _Suspect
                    span = _span(proto, resource, schema_url, checked=True)
                except _Suspect:  # the store's own check decides, and names the problem
                    span = _span(proto, resource, schema_url, checked=False)
                    try:
                        check_json(span, "span")
                    except InvalidRequestError as exc:
                        rejected += 1
                        problem = f"a span was dropped: {exc}"
                        continue
                if span is None:
                    rejected += 1
                    problem = "spans without agentlightning.rollout_id/attempt_id were dropped"
                    continue
                if len(span["name"]) > MAX_SPAN_NAME_LENGTH:
                    rejected += 1
                    problem = f"a span was dropped: name: longer than {MAX_SPAN_NAME_LENGTH} characters"
                    continue
                spans.append(span)
    return spans, rejected, problem


def _span(proto: Span, resource: dict[str, Any], schema_url: str, *, checked: bool) -> dict[str, Any] | None:
    """``proto`` in the store's shape, or None without rollout and attempt ids; ``checked`` raises
    :class:`_Suspect` at a value of its attributes, events and links that may break the store's limits."""
    attributes = _attributes(proto.attributes, ATTRIBUTES_DEPTH if checked else None)
    rollout_id = _lookup("rollout_id", attributes, resource)
    attempt_id = _lookup("attempt_id", attributes, resource)
    if rollout_id is None or attempt_id is None:
        return None
    name = proto.name
    description = proto.status.message
    if checked and (_NUL in name or _NUL in description):
        raise _Suspect
    trace_id = proto.trace_id.hex()
    span_id = proto.span_id.hex()
    return {
        "rollout_id": str(rollout_id),
        "attempt_id": str(attempt_id),
        "sequence_id": _sequence_id(_lookup("span_sequence_id", attributes, resource)),
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": proto.parent_span_id.hex() or None,
        "name": name,
        "status": {
            "status_code": STATUS_CODES.get(proto.status.code, "UNSET"),
            "description": description or None,
        },
        "attributes": attributes,
        "events": [_event(event, checked) for event in proto.events] if proto.events else [],
        "links": [_link(link, checked) for link in proto.links] if proto.links else [],
        "start_time": proto.start_time_unix_nano / 1e9 or None,
        "end_time": proto.end_time_unix_nano / 1e9 or None,
        "context": {"trace_id": trace_id, "span_id": span_id, "is_remote": False, "trace_state": {}},
        "parent": None,
        "resource": {"attributes": resource, "schema_url": schema_url},
    }


def _event(event: Span.Event, checked: bool) -> dict[str, Any]:
    if checked and _NUL in event.name:
        raise _Suspect
    return {
        "name": event.name,
        "attributes": _attributes(event.attributes, NESTED_ATTRIBUTES_DEPTH if checked else None),
        "timestamp": event.time_unix_nano / 1e9 or None,
    }


def _link(link: Span.Link, checked: bool) -> dict[str, Any]:
    context = {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(), "is_remote": True, "trace_state": {}}
    attributes = _attributes(link.attributes, NESTED_ATTRIBUTES_DEPTH if checked else None)
    return {"context": context, "attributes": attributes or None}


def _lookup(name: str, attributes: dict[str, Any], resource: dict[str, Any]) -> Any:
    keys = _ID_KEYS[name]
    for source in (attributes, resource):
        for key in keys:
            if key in source:
                return source[key]
    return None


def _sequence_id(value: Any) -> int | None:
    if value is None:  # the usual case, without the cost of int("None")'s exception
        return None
    try:
        number = int(str(value))
    except ValueError:
        return None
    return number if 0 <= number <= MAX_SEQUENCE_ID else None


def _attributes(items: Iterable[KeyValue], depth: int | None) -> dict[str, Any]:
    """OTLP attributes as a JSON object. With the ``depth`` the object will sit at in a span (see
    :func:`~lightning_store.limits.check_json`), raises :class:`_Suspect` at a key or value that may break the
    store's limits: a NUL (protobuf's strings are valid UTF-8, so no lone surrogate gets this far), a double
    that is not finite, nesting deeper than :data:`~lightning_store.limits.MAX_DEPTH`. None checks nothing."""
    if depth is None:
        return {item.key: _value(item.value, None) for item in items}
    if depth > MAX_DEPTH:
        raise _Suspect
    found: dict[str, Any] = {}
    text: list[str] = []
    for item in items:
        key = item.key
        value = item.value
        if value.WhichOneof("value") == "string_value":  # most attributes: no call of _value
            found[key] = string = value.string_value
            text.append(string)
        else:
            found[key] = _value(value, depth + 1)
        text.append(key)
    if _NUL in "".join(text):
        raise _Suspect
    return found


def _value(value: AnyValue, depth: int | None) -> Any:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text = value.string_value
        if depth is not None and _NUL in text:
            raise _Suspect
        return text
    if kind is None:
        return None
    if kind == "double_value":
        number = value.double_value
        if depth is not None and not math.isfinite(number):
            raise _Suspect
        return number
    if kind == "array_value":
        if depth is not None and depth > MAX_DEPTH:
            raise _Suspect
        return [_value(item, None if depth is None else depth + 1) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values, depth)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)  # a bool, or an int64 (within the store's 64-bit limit)
