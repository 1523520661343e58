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
  - 503 (the database cannot be reached; retry, ``Retry-After``; ``maybe_written`` when a write may have
    committed) on every operation that touches the database: all but ``GET /metrics`` (``GET /v1/agl/health``
    checks it);
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

from lightning_store.server.openapi_answers import (
    BAD_REQUEST,
    CONFLICT,
    ERROR_DESCRIPTIONS,
    FASTAPI_422,
    HEALTH,
    NO_DATABASE,
    NOT_FOUND,
    OPEN_OPERATIONS,
    PROXY_BOUND,
    PROXY_PATHS,
    PROXY_WORKER,
    Success,
    successes,
)
from lightning_store.server.openapi_schemas import REF, Schema, model_schemas, ref

__all__ = ["CONFLICT", "NOT_FOUND", "build_document", "install_openapi"]

Document = dict[str, Any]

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
SECURITY_SCHEME = "bearerAuth"


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
        "content": {JSON: {"schema": ref(schema)}},
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
                JSON: {"schema": ref("OtlpExportRequest")},
            },
        }
        traces["responses"]["200"] = {
            "description": "The export's outcome, in the request's encoding (protobuf when it had no content type).",
            "content": {
                PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
                JSON: {"schema": ref("OtlpExportResponse")},
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
    added, requests = model_schemas()
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
    known = successes()
    for path, operations in paths.items():
        for method, operation in operations.items():
            success = known.get((method, path))
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
