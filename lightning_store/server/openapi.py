"""The server's OpenAPI document (``/openapi.json``, ``/docs``), made true to what the server answers.

FastAPI derives the document from the routes' signatures: it gets the inputs right but not the answers. Most
routes return plain dicts, so their bodies are documented as "any object"; errors are documented as FastAPI's
``HTTPValidationError``, a shape this server never sends; and what the middleware answers (401, 413, 415),
what the error handlers answer (404, 409, 503) and what is served outside the router (``GET /metrics``) is
missing. :func:`install_openapi` replaces ``app.openapi`` with a function that post-processes FastAPI's document
once and caches the result. The contract of the document it returns:

- **One error shape.** Every error answer is documented with the ``Error`` schema, the body the server really
  sends: ``{"detail": str, "field": str | null, "error_type": str}``, plus an ``errors`` array on a 422 from
  request validation. ``HTTPValidationError`` and ``ValidationError`` are gone from the document. ``field`` is
  not required: the LLM proxy's 502 answers leave it out. An error status that a route declares itself keeps
  its description and gets this schema.
- **Every status an operation can answer**, and no other (a 500 is a bug, never documented):

  - 422 on every operation: invalid input, including a NUL character in the path or query, which the guards
    refuse on any route;
  - 401 on every operation but ``GET /v1/agl/health``, with a ``bearerAuth`` security requirement, when the
    server has a token (``bearer_token=True``); neither when it has none;
  - 413 (body over ``max_body_bytes``) and 415 (a content type other than JSON; for ``/v1/traces`` other than
    protobuf or JSON) on every ``POST``: the guards check any request that carries a body;
  - 404 where a route looks up an id that must exist (:data:`NOT_FOUND`), 409 where an update is conditional
    (:data:`CONFLICT`);
  - 503 (the database cannot be reached; retry, ``Retry-After``) on every operation that touches the
    database: all but ``GET /metrics`` (``GET /v1/agl/health`` checks it);
  - 502 and the upstream's own statuses on the LLM proxy routes, which forward to an upstream.

- **Success bodies from the store's models** (serialization mode): ``Rollout``, ``AttemptedRollout``,
  ``Attempt``, ``Span``, ``ResourcesUpdate``, ``Worker``, ``LlmCall``, ``Claim``, pages of them; a getter that
  answers JSON ``null`` for an unknown id (``GET /v1/agl/rollouts/{rollout_id}``, …) allows ``null``.
- **Bodies read by hand are described**: the OTLP export of ``POST /v1/traces`` (protobuf or JSON) and the
  OpenAI-style request of the LLM proxy, with the proxy's ``x-rollout-id``/``x-attempt-id`` headers.

An operation this module does not know (a route added later) keeps FastAPI's success schema and gets the error
statuses every operation can answer, so the document stays true, if less precise, until it is described here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter

from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt, AttemptedRollout, Claim, Rollout, Worker
from lightning_store.resources import NamedResources, ResourcesUpdate
from lightning_store.spans import Span

__all__ = ["CONFLICT", "NOT_FOUND", "build_document", "install_openapi"]

Schema = dict[str, Any]
Document = dict[str, Any]

REF = "#/components/schemas/{model}"
JSON = "application/json"
PROTOBUF = "application/x-protobuf"
SECURITY_SCHEME = "bearerAuth"
OPEN_OPERATIONS = frozenset({("get", "/v1/agl/health")})
"""Operations the guards serve without a token (``guards.OPEN_PATHS``)."""
NO_DATABASE = frozenset({("get", "/metrics")})
"""Operations that never touch the database, so never answer 503."""
HEALTH = ("get", "/v1/agl/health")
"""Answers 503 too when the database does not answer, with its ``status`` and ``database`` keys."""

PROXY_BOUND = "/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind}"
PROXY_WORKER = "/worker/{worker_id}/v1/{kind}"
PROXY_PATHS = frozenset({PROXY_BOUND, PROXY_WORKER, "/v1/chat/completions", "/v1/completions"})

NOT_FOUND: dict[tuple[str, str], str] = {
    ("post", "/v1/agl/rollouts/{rollout_id}"): "No rollout has this id.",
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts"): "No rollout has this id.",
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): "No such rollout, or no such attempt of it.",
    ("post", "/v1/agl/attempts/end"): "An entry names an unknown rollout or attempt (nothing was written).",
    ("get", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}/resources"): "No such rollout or attempt.",
    ("post", "/v1/agl/spans"): "The span's rollout or attempt does not exist.",
    ("post", "/v1/agl/spans/batch"): "A span's rollout or attempt does not exist (nothing was written).",
    ("post", "/v1/agl/spans/next"): "No such rollout or attempt.",
    ("post", "/v1/agl/spans/next/batch"): "A pair names an unknown rollout or attempt (nothing was allocated).",
    ("post", "/v1/agl/llm_calls/batch"): "A call's rollout or attempt does not exist (nothing was written).",
    ("post", "/v1/traces"): "A span names an unknown rollout or attempt (nothing was written).",
    ("post", PROXY_BOUND): "No such rollout or attempt, or no proxy route for this kind.",
    ("post", PROXY_WORKER): "No such worker, or no proxy route for this kind.",
    ("post", "/v1/chat/completions"): "The x-rollout-id/x-attempt-id headers name no known attempt.",
    ("post", "/v1/completions"): "The x-rollout-id/x-attempt-id headers name no known attempt.",
}
"""The operations that answer 404, and when: those that look up an id that must exist. Getters answer ``null``
for an unknown id instead, searches an empty page, and upserts (resources, workers) create what is missing."""

CONFLICT: dict[tuple[str, str], str] = {
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): (
        "With if_current: the attempt is no longer its rollout's latest, or has already ended. Nothing was written."
    ),
    ("post", PROXY_WORKER): "The worker is running no attempt (error_type NoAttempt; not to be retried).",
    ("post", "/v1/agl/spans/next"): "The rollout has no sequence ids left (a span took 2^53 - 1).",
    ("post", "/v1/agl/spans/next/batch"): "A rollout has no sequence ids left (nothing was allocated).",
}
"""The operations that answer 409: conditional updates whose condition no longer holds, and a call on the proxy
route of a worker that runs no attempt."""

_PAGE_400 = "A page that cannot be served: `sort_by` names no sortable field, `limit` is 0 or below -1, `offset` < 0."
_NULL_400 = "An explicit null for a field that needs a value (leave the key out to keep the field)."
BAD_REQUEST: dict[tuple[str, str], str] = {
    **{
        (method, path): _PAGE_400
        for method, path in (
            ("get", "/v1/agl/rollouts"),
            ("post", "/v1/agl/rollouts/search"),
            ("get", "/v1/agl/rollouts/{rollout_id}/attempts"),
            ("post", "/v1/agl/rollouts/{rollout_id}/attempts/search"),
            ("get", "/v1/agl/spans"),
            ("post", "/v1/agl/spans/search"),
            ("post", "/v1/agl/spans/query"),
            ("get", "/v1/agl/resources"),
            ("get", "/v1/agl/workers"),
            ("post", "/v1/agl/workers/search"),
        )
    },
    ("post", "/v1/agl/rollouts/{rollout_id}"): _NULL_400,
    ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): _NULL_400,
    ("post", "/v1/agl/workers/{worker_id}"): _NULL_400,
}
"""The operations that answer 400, where Agent Lightning's server does (``BadRequestError``)."""

FASTAPI_422 = "Validation Error"
"""FastAPI's description of the 422 it documents (with its own error schema)."""
ERROR_DESCRIPTIONS = {
    "401": "The server has a token and the request does not carry it (`Authorization: Bearer <token>`).",
    "413": "The request body is over the server's limit (max_body_bytes).",
    "415": "The request carries a body whose content type is not accepted here.",
    "422": "Invalid input: the body, a parameter, the path or the query breaks the contract; `field` names it.",
    "502": "The LLM upstream cannot be reached, gave an answer that is not JSON, or none is configured.",
    "503": "The database cannot be reached: nothing was done, retry.",
}


@dataclass(frozen=True)
class Success:
    """An operation's success answer: its status, description and JSON schema."""

    status: str
    description: str
    schema: Schema


def _ref(name: str) -> Schema:
    return {"$ref": REF.format(model=name)}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _object(properties: dict[str, Schema], *, title: str) -> Schema:
    return {"type": "object", "title": title, "properties": properties, "required": list(properties)}


def _page(item: str) -> Schema:
    return _ref(f"{item}Page")


def _successes() -> dict[tuple[str, str], Success]:
    """Every known operation's success answer (see the route modules for what each returns)."""
    rollout_any = _ref("RolloutWithLatestAttempt")
    return {
        ("get", "/v1/agl/health"): Success("200", "The server is up.", _ref("Health")),
        ("get", "/v1/agl/statistics"): Success("200", "Counts of what the store holds.", _ref("StoreStatistics")),
        ("post", "/v1/agl/queues/rollouts/enqueue"): Success(
            "201", "The queued rollouts, in request order (without an `attempt` key).", _array(_ref("Rollout"))
        ),
        ("post", "/v1/agl/queues/rollouts/dequeue"): Success(
            "200",
            "The claimed rollouts with their new attempts; empty when the queue stayed empty.",
            _array(_ref("AttemptedRollout")),
        ),
        ("post", "/v1/agl/queues/rollouts/claim"): Success(
            "200",
            "The claimed rollouts, each with the resources its attempt runs with (null: the store holds none); "
            "empty when the queue stayed empty.",
            _array(_ref("Claim")),
        ),
        ("post", "/v1/agl/rollouts"): Success(
            "201", "The rollout, started with its first attempt.", _ref("AttemptedRollout")
        ),
        ("get", "/v1/agl/rollouts"): Success(
            "200", "A page of rollouts, each with its latest attempt when it has one.", _page("Rollout")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts"): Success(
            "200", "A page of the rollout's attempts (empty for an unknown rollout).", _page("Attempt")
        ),
        ("get", "/v1/agl/spans"): Success("200", "A page of the rollout's spans.", _page("Span")),
        ("get", "/v1/agl/workers"): Success("200", "A page of workers.", _page("Worker")),
        ("post", "/v1/agl/rollouts/search"): Success(
            "200", "A page of rollouts, each with its latest attempt when it has one.", _page("Rollout")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}"): Success(
            "200",
            "The rollout (with its latest attempt when it has one), or null when no rollout has this id.",
            _nullable(rollout_any),
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}"): Success(
            "200", "The updated rollout, with its latest attempt when it has one.", rollout_any
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts"): Success(
            "201", "The rollout with its new attempt.", _ref("AttemptedRollout")
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts/search"): Success(
            "200", "A page of the rollout's attempts (empty for an unknown rollout).", _page("Attempt")
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts/latest"): Success(
            "200",
            "The rollout's latest attempt, or null when it has none (or no rollout has this id).",
            _nullable(_ref("Attempt")),
        ),
        ("post", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}"): Success(
            "200", "The updated attempt.", _ref("Attempt")
        ),
        ("post", "/v1/agl/attempts/end"): Success(
            "200",
            "Per entry, the ended attempt, or null where the attempt was no longer current.",
            _array(_nullable(_ref("Attempt"))),
        ),
        ("post", "/v1/agl/waits/rollouts"): Success(
            "200",
            "The rollouts among those named that have finished (without an `attempt` key).",
            _array(_ref("Rollout")),
        ),
        ("post", "/v1/agl/watchdog/scan"): Success(
            "200", "How many attempts the scan marked.", _object({"marked": {"type": "integer"}}, title="ScanResult")
        ),
        ("post", "/v1/agl/spans"): Success(
            "201", "The stored span, or null when a span with its ids was stored already.", _nullable(_ref("Span"))
        ),
        ("post", "/v1/agl/spans/batch"): Success(
            "201",
            "The spans stored by this request (duplicates left out); with `return_spans: false`, their positions "
            "in the request and the sequence ids they were stored with.",
            {
                "anyOf": [
                    _object({"spans": _array(_ref("Span"))}, title="AddedSpans"),
                    _object(
                        {"added": _array({"type": "integer"}), "sequence_ids": _array({"type": "integer"})},
                        title="AddedSpanPositions",
                    ),
                ]
            },
        ),
        ("post", "/v1/agl/spans/search"): Success("200", "A page of the rollout's spans.", _page("Span")),
        ("post", "/v1/agl/spans/query"): Success("200", "A page of the spans found.", _page("Span")),
        ("post", "/v1/agl/spans/next"): Success(
            "200", "The next sequence id.", _object({"sequence_id": {"type": "integer"}}, title="SequenceId")
        ),
        ("post", "/v1/agl/spans/next/batch"): Success(
            "200",
            "One sequence id per pair, in order.",
            _object({"sequence_ids": _array({"type": "integer"})}, title="SequenceIds"),
        ),
        ("post", "/v1/agl/llm_calls/batch"): Success(
            "201", "How many calls the request carried.", _object({"received": {"type": "integer"}}, title="Received")
        ),
        ("post", "/v1/agl/llm_calls/search"): Success(
            "200", "The LLM calls found.", _object({"items": _array(_ref("LlmCall"))}, title="LlmCalls")
        ),
        ("get", "/v1/agl/resources"): Success("200", "A page of resources snapshots.", _page("ResourcesUpdate")),
        ("post", "/v1/agl/resources"): Success("201", "The new snapshot.", _ref("ResourcesUpdate")),
        ("get", "/v1/agl/resources/latest"): Success(
            "200", "The latest snapshot, or null when there is none.", _nullable(_ref("ResourcesUpdate"))
        ),
        ("post", "/v1/agl/resources/{resources_id}"): Success(
            "200", "The snapshot under this id (created when it did not exist).", _ref("ResourcesUpdate")
        ),
        ("get", "/v1/agl/resources/{resources_id}"): Success(
            "200", "The snapshot, or null when none has this id.", _nullable(_ref("ResourcesUpdate"))
        ),
        ("get", "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}/resources"): Success(
            "200",
            "The resources the attempt runs with, or null when there are none.",
            _nullable(_ref("ResourcesUpdate")),
        ),
        ("post", "/v1/agl/workers/search"): Success("200", "A page of workers.", _page("Worker")),
        ("get", "/v1/agl/workers/{worker_id}"): Success(
            "200", "The worker, or null when none has this id.", _nullable(_ref("Worker"))
        ),
        ("post", "/v1/agl/workers/{worker_id}"): Success(
            "200", "The worker (created when it did not exist).", _ref("Worker")
        ),
    }


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


def _model_schemas() -> tuple[dict[str, Schema], dict[str, Schema]]:
    """The models' JSON schemas with everything they refer to, and the schemas of :data:`REQUEST_MODELS` (a
    reference where pydantic names the model, such as ``Span`` when both modes agree)."""
    keyed = [(name, "serialization", TypeAdapter(model)) for name, model in RESPONSE_MODELS.items()]
    keyed += [(name, "validation", TypeAdapter(model)) for name, model in REQUEST_MODELS.items()]
    mapping, definitions = TypeAdapter.json_schemas(keyed, ref_template=REF)  # type: ignore[arg-type]
    schemas: dict[str, Schema] = definitions.get("$defs", {})
    for name in RESPONSE_MODELS:
        if mapping[(name, "serialization")] != _ref(name):  # pydantic named it otherwise: refer to it
            schemas[name] = mapping[(name, "serialization")]
    requests = {name: mapping[(name, "validation")] for name in REQUEST_MODELS}
    # A rollout as most routes send it: an `attempt` key exactly when it has an attempt (Agent Lightning's
    # client tells Rollout from AttemptedRollout by that key).
    with_latest = copy.deepcopy(_resolved(schemas, schemas["AttemptedRollout"]))
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
        schemas[f"{item}Page"] = _object(
            {
                "items": _array(_ref(name)),
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
            _ref("Error"),
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
                "items": _ref("ValidationProblem"),
            },
        },
        "required": ["detail", "error_type"],
    }
    schemas["ValidationProblem"] = {
        "type": "object",
        "title": "ValidationProblem",
        "properties": {
            "loc": _array({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
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
    schemas["OtlpExportRequest"] = _otlp_request()
    return schemas, requests


def _resolved(schemas: dict[str, Schema], schema: Schema) -> Schema:
    while set(schema) == {"$ref"}:
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _otlp_request() -> Schema:
    """OTLP's ExportTraceServiceRequest in its JSON mapping (ids as hex), as far as the store reads it."""
    key_values = _array(
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
            "events": _array({"type": "object"}),
            "links": _array({"type": "object"}),
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
            "resourceSpans": _array(
                {
                    "type": "object",
                    "properties": {
                        "resource": {"type": "object", "properties": {"attributes": key_values}},
                        "scopeSpans": _array({"type": "object", "properties": {"spans": _array(span)}}),
                        "schemaUrl": {"type": "string"},
                    },
                }
            )
        },
    }


@dataclass(frozen=True)
class _Merge:
    """Schemas to add to the document's components, and the references to rewrite because of them."""

    schemas: dict[str, Schema]
    replace: dict[str, str]

    def rewrite(self, value: Any) -> Any:
        """``value`` with its references to renamed schemas changed."""
        if isinstance(value, dict):
            return {
                key: self.replace.get(item, item) if key == "$ref" and isinstance(item, str) else self.rewrite(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [self.rewrite(item) for item in value]
        return value


def _merged(existing: dict[str, Schema], added: dict[str, Schema]) -> _Merge:
    """``added`` as it can join ``existing``: a schema FastAPI already has (a request model that is also part of
    a response, such as ``RolloutConfig``) is shared when it means the same; one that differs is renamed
    ``<name>Output`` (FastAPI's own convention), and the references to it follow."""
    renamed = {
        name: f"{name}Output"
        for name, schema in added.items()
        if name in existing and _without_null_defaults(existing[name]) != _without_null_defaults(schema)
    }
    merge = _Merge({}, {REF.format(model=old): REF.format(model=new) for old, new in renamed.items()})
    for name, schema in added.items():
        if name in renamed or name not in existing:
            merge.schemas[renamed.get(name, name)] = merge.rewrite(schema)
    return merge


def _without_null_defaults(value: Any) -> Any:
    """``value`` without ``"default": null`` (FastAPI leaves those out of the schemas it writes)."""
    if isinstance(value, dict):
        return {
            key: _without_null_defaults(item) for key, item in value.items() if not (key == "default" and item is None)
        }
    if isinstance(value, list):
        return [_without_null_defaults(item) for item in value]
    return value


def _error_response(status: str, description: str | None = None, schema: str = "Error") -> Schema:
    response: Schema = {
        "description": description or ERROR_DESCRIPTIONS.get(status, "An error."),
        "content": {JSON: {"schema": _ref(schema)}},
    }
    if status == "401":
        response["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}}
    if status == "503":
        response["headers"] = {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait."}}
    return response


def _describe_bodies(paths: dict[str, Any], requests: dict[str, Schema], schemas: dict[str, Schema]) -> None:
    """Request and success bodies of the routes that read their request by hand, and the bodies that FastAPI
    takes as plain JSON for the store to validate (so that it names the offending field): ``requests`` holds
    what the store requires of them (:data:`REQUEST_MODELS`)."""
    for path, name in (
        ("/v1/agl/spans", "SpanInput"),
        ("/v1/agl/resources", "NamedResources"),
        ("/v1/agl/resources/{resources_id}", "NamedResources"),
    ):
        body = paths.get(path, {}).get("post", {}).get("requestBody", {}).get("content", {}).get(JSON)
        if body is not None:
            body["schema"] = requests[name]
    for component, field, name in (("SpansBody", "spans", "SpanInput"), ("LlmCallsBody", "calls", "LlmCallInput")):
        prop = schemas.get(component, {}).get("properties", {}).get(field)
        if prop is not None and prop.get("type") == "array":
            prop["items"] = requests[name]
    traces = paths.get("/v1/traces", {}).get("post")
    if traces is not None:
        traces["requestBody"] = {
            "required": False,
            "description": "An OTLP/HTTP trace export, optionally gzip-compressed (`Content-Encoding: gzip`).",
            "content": {
                PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                JSON: {"schema": _ref("OtlpExportRequest")},
            },
        }
        traces["responses"]["200"] = {
            "description": "The export's outcome, in the request's encoding (protobuf when it had no content type).",
            "content": {
                PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                JSON: {"schema": _ref("OtlpExportResponse")},
            },
        }
    for path in PROXY_PATHS:
        operation = paths.get(path, {}).get("post")
        if operation is None:
            continue
        operation["requestBody"] = {
            "required": True,
            "description": "An OpenAI-compatible (chat) completion request, forwarded to the upstream.",
            "content": {JSON: {"schema": {"type": "object", "additionalProperties": True}}},
        }
        operation["responses"]["200"] = {
            "description": "The upstream's answer, unchanged (a server-sent event stream when `stream` is true).",
            "content": {
                JSON: {"schema": {"type": "object", "additionalProperties": True}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
        operation["responses"]["502"] = _error_response("502")
        operation["responses"]["default"] = {
            "description": "The upstream's error answer, passed on with its status and body.",
            "content": {"*/*": {"schema": {}}},
        }
        if path in (PROXY_BOUND, PROXY_WORKER):
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "kind":
                    parameter["schema"] = {"type": "string", "enum": ["chat/completions", "completions"]}
                    parameter["description"] = "The OpenAI endpoint: `chat/completions` or `completions`."
        else:
            operation["parameters"] = [
                *operation.get("parameters", []),
                *(
                    {
                        "name": f"x-{name}-id",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                        "description": f"The {name} this call belongs to (required by the server; 422 without).",
                    }
                    for name in ("rollout", "attempt")
                ),
            ]


def _metrics_operation() -> Schema:
    return {
        "summary": "Prometheus metrics",
        "operationId": "metrics",
        "description": "The server's request counts and latencies in Prometheus' text format.",
        "responses": {
            "200": {
                "description": "The metrics.",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    }


def build_document(generated: Document, *, bearer_token: bool) -> Document:
    """The corrected document: ``generated`` (FastAPI's, left unchanged) post-processed as the module says.
    ``bearer_token``: the server has a token (401 and the security requirement are documented)."""
    document = copy.deepcopy(generated)
    components = document.setdefault("components", {})
    schemas: dict[str, Schema] = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    added, requests = _model_schemas()
    merged = _merged(schemas, added)
    schemas.update(merged.schemas)
    paths: dict[str, Any] = document.setdefault("paths", {})
    paths.setdefault("/metrics", {})["get"] = _metrics_operation()
    _describe_bodies(paths, {name: merged.rewrite(schema) for name, schema in requests.items()}, schemas)
    if bearer_token:
        components["securitySchemes"] = {
            SECURITY_SCHEME: {
                "type": "http",
                "scheme": "bearer",
                "description": "The token the server was started with (`store serve --token`).",
            }
        }
    successes = _successes()
    for path, operations in paths.items():
        for method, operation in operations.items():
            success = successes.get((method, path))
            if success is not None:
                success = Success(success.status, success.description, merged.rewrite(success.schema))
            _correct_operation(path, method, operation, success, bearer_token=bearer_token)
    return document


def _correct_operation(
    path: str, method: str, operation: Schema, success: Success | None, *, bearer_token: bool
) -> None:
    key = (method, path)
    responses: dict[str, Schema] = operation.setdefault("responses", {})
    if success is not None:  # else FastAPI's success answer stays
        for status in ("200", "201"):
            responses.pop(status, None)
        responses[success.status] = {"description": success.description, "content": {JSON: {"schema": success.schema}}}
    declared = {
        status: response.get("description")
        for status, response in responses.items()
        if status.startswith(("4", "5")) and response.get("description") != FASTAPI_422
    }
    errors: dict[str, Schema] = {status: _error_response(status) for status in declared}  # a route's own
    errors["422"] = _error_response("422")
    if bearer_token and key not in OPEN_OPERATIONS:
        errors["401"] = _error_response("401")
        operation["security"] = [{SECURITY_SCHEME: []}]
    elif bearer_token:
        operation["security"] = []
    if method in ("post", "put", "patch"):
        errors["413"] = _error_response("413")
        errors["415"] = _error_response(
            "415",
            "The request carries a body that is neither `application/x-protobuf` nor `application/json`."
            if path == "/v1/traces"
            else "The request carries a body that is not `application/json`.",
        )
    if key in BAD_REQUEST:
        errors["400"] = _error_response("400", BAD_REQUEST[key])
    if key in NOT_FOUND:
        errors["404"] = _error_response("404", NOT_FOUND[key])
    if key in CONFLICT:
        errors["409"] = _error_response("409", CONFLICT[key])
    if key not in NO_DATABASE:
        errors["503"] = _error_response("503", schema="HealthUnavailable" if key == HEALTH else "Error")
    for status, description in declared.items():
        if description:  # what the route says of its own answer is the more precise
            errors[status]["description"] = description
    responses.update(errors)
    operation["responses"] = dict(sorted(responses.items()))


def install_openapi(app: FastAPI, *, bearer_token: bool = False) -> None:
    """Serve :func:`build_document` of FastAPI's document as ``app``'s OpenAPI document, built once and cached."""
    generate: Callable[[], Document] = app.openapi
    corrected: list[Document] = []

    def openapi() -> Document:
        if not corrected:
            corrected.append(build_document(generate(), bearer_token=bearer_token))
            app.openapi_schema = corrected[0]
        return corrected[0]

    app.openapi = openapi  # type: ignore[method-assign]
