"""The schemas :mod:`lightning_store.server.openapi` adds to FastAPI's document: the store's models (responses in
serialization mode, the bodies the store validates itself in validation mode), pages of them, the health and
statistics answers, the one error shape, and OTLP's export request and response in their JSON mapping.

Imports only the core's centre (the models): the document's data, with no knowledge of routes.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import TypeAdapter

from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt, AttemptedRollout, Claim, Rollout, Worker
from lightning_store.resources import NamedResources, ResourcesUpdate
from lightning_store.spans import Span

Schema = dict[str, Any]

REF = "#/components/schemas/{model}"


def ref(name: str) -> Schema:
    return {"$ref": REF.format(model=name)}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def object_schema(properties: dict[str, Schema], *, title: str) -> Schema:
    return {"type": "object", "title": title, "properties": properties, "required": list(properties)}


def page(item: str) -> Schema:
    return ref(f"{item}Page")


RESPONSE_MODELS: dict[str, type[Any]] = {
    "Rollout": Rollout,
    "AttemptedRollout": AttemptedRollout,
    "Attempt": Attempt,
    "Span": Span,
    "ResourcesUpdate": ResourcesUpdate,
    "Worker": Worker,
    "LlmCall": LlmCall,
    "Claim": Claim,
}
"""The models of success bodies, by the component name the document gives their serialization-mode schema."""
REQUEST_MODELS: dict[str, Any] = {"SpanInput": Span, "LlmCallInput": LlmCall, "NamedResources": NamedResources}
"""What the bodies the store validates itself (routes that take plain JSON) must be, in validation mode."""


def model_schemas() -> tuple[dict[str, Schema], dict[str, Schema]]:
    """The models' JSON schemas with everything they refer to, and the schemas of :data:`REQUEST_MODELS` (a
    reference where pydantic names the model, such as ``Span`` when both modes agree)."""
    keyed = [(name, "serialization", TypeAdapter(model)) for name, model in RESPONSE_MODELS.items()]
    keyed += [(name, "validation", TypeAdapter(model)) for name, model in REQUEST_MODELS.items()]
    mapping, definitions = TypeAdapter.json_schemas(keyed, ref_template=REF)  # type: ignore[arg-type]
    schemas: dict[str, Schema] = definitions.get("$defs", {})
    for name in RESPONSE_MODELS:
        if mapping[(name, "serialization")] != ref(name):  # pydantic named it otherwise: refer to it
            schemas[name] = mapping[(name, "serialization")]
    requests = {name: mapping[(name, "validation")] for name in REQUEST_MODELS}
    # A rollout as most routes send it: an `attempt` key exactly when it has an attempt (Agent Lightning's
    # client tells Rollout from AttemptedRollout by that key).
    with_latest = copy.deepcopy(resolved(schemas, schemas["AttemptedRollout"]))
    with_latest["title"] = "RolloutWithLatestAttempt"
    with_latest["description"] = "A rollout, with its latest attempt under `attempt` when it has one."
    with_latest["required"] = [name for name in with_latest.get("required", []) if name != "attempt"]
    schemas["RolloutWithLatestAttempt"] = with_latest
    for item, name in (
        ("Rollout", "RolloutWithLatestAttempt"),
        ("Attempt", "Attempt"),
        ("Span", "Span"),
        ("ResourcesUpdate", "ResourcesUpdate"),
        ("Worker", "Worker"),
    ):
        schemas[f"{item}Page"] = object_schema(
            {
                "items": array(ref(name)),
                "limit": {"type": "integer", "description": "The page size asked for; -1: no limit."},
                "offset": {"type": "integer"},
                "total": {"type": "integer", "description": "How many items match, over all pages."},
            },
            title=f"{item}Page",
        )
    schemas["Health"] = {
        "type": "object",
        "title": "Health",
        "properties": {
            "status": {"const": "ok"},
            "database": {"const": "ok", "description": "Present when the store has a database: it answered."},
        },
        "required": ["status"],
    }
    schemas["HealthUnavailable"] = {
        "title": "HealthUnavailable",
        "description": "The error body, and which part is down.",
        "allOf": [
            ref("Error"),
            {
                "type": "object",
                "properties": {"status": {"const": "unavailable"}, "database": {"const": "unreachable"}},
                "required": ["status", "database"],
            },
        ],
    }
    counts = {"type": "integer", "minimum": 0}
    schemas["StoreStatistics"] = {
        "type": "object",
        "title": "StoreStatistics",
        "properties": {
            "name": {"type": "string", "description": "The store's implementation."},
            "total_rollouts": counts,
            "total_attempts": counts,
            "total_spans": counts,
            "total_resources": counts,
            "total_workers": counts,
            "uptime": {"type": "number", "description": "Seconds since the store started."},
            "rollouts_by_status": {"type": "object", "additionalProperties": counts},
        },
    }
    schemas["Error"] = {
        "type": "object",
        "title": "Error",
        "description": "Every error answer of the server.",
        "properties": {
            "detail": {"type": "string", "description": "What went wrong, for people."},
            "field": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "The offending input (`ends.0.attempt_id`, `body`, `path`, …), or null.",
            },
            "error_type": {"type": "string", "description": "A stable name of the kind of error."},
            "errors": {
                "type": "array",
                "description": "On a 422 from request validation: every problem found.",
                "items": ref("ValidationProblem"),
            },
            "maybe_written": {
                "type": "boolean",
                "description": "On a 503: true when the database went away while the request's write committed, "
                "so it may have been done; send it again only if it is idempotent.",
            },
        },
        "required": ["detail", "error_type"],
    }
    schemas["ValidationProblem"] = {
        "type": "object",
        "title": "ValidationProblem",
        "properties": {
            "loc": array({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
            "msg": {"type": "string"},
            "type": {"type": "string"},
        },
        "required": ["loc", "msg", "type"],
    }
    schemas["OtlpExportResponse"] = {
        "type": "object",
        "title": "OtlpExportResponse",
        "description": "OTLP's ExportTraceServiceResponse in its JSON mapping; empty when every span was stored.",
        "properties": {
            "partialSuccess": {
                "type": "object",
                "properties": {
                    "rejectedSpans": {
                        "anyOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "integer", "minimum": 0}],
                        "description": "How many spans were dropped (a string: int64 in protobuf's JSON mapping).",
                    },
                    "errorMessage": {"type": "string"},
                },
            }
        },
    }
    schemas["OtlpExportRequest"] = otlp_request()
    return schemas, requests


def resolved(schemas: dict[str, Schema], schema: Schema) -> Schema:
    while set(schema) == {"$ref"}:
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def otlp_request() -> Schema:
    """OTLP's ExportTraceServiceRequest in its JSON mapping (ids as hex), as far as the store reads it."""
    key_values = array(
        {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "object"}}, "required": ["key"]}
    )
    nanos = {"anyOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "integer", "minimum": 0}]}
    hex_id = {"type": "string", "pattern": "^([0-9a-fA-F]{2})*$"}
    span = {
        "type": "object",
        "properties": {
            "traceId": hex_id,
            "spanId": hex_id,
            "parentSpanId": hex_id,
            "name": {"type": "string"},
            "startTimeUnixNano": nanos,
            "endTimeUnixNano": nanos,
            "attributes": key_values,
            "events": array({"type": "object"}),
            "links": array({"type": "object"}),
            "status": {"type": "object", "properties": {"code": {"type": "integer"}, "message": {"type": "string"}}},
        },
    }
    return {
        "type": "object",
        "title": "OtlpExportRequest",
        "description": (
            "Spans are bound to an attempt by the attributes `agentlightning.rollout_id` and "
            "`agentlightning.attempt_id` (or `lightning_store.…`), on the span or on its resource."
        ),
        "properties": {
            "resourceSpans": array(
                {
                    "type": "object",
                    "properties": {
                        "resource": {"type": "object", "properties": {"attributes": key_values}},
                        "scopeSpans": array({"type": "object", "properties": {"spans": array(span)}}),
                        "schemaUrl": {"type": "string"},
                    },
                }
            )
        },
    }
