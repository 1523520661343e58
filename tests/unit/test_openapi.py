"""The OpenAPI document as ``lightning_store.server.openapi`` corrects it, checked without a server.

``tests/integration/test_api_fuzz.py`` checks it against a live server; these check its structure: every
operation is described, every status is declared where the server can answer it, and the schemas are sound.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
from fastapi import FastAPI

from lightning_store.server import create_app
from lightning_store.server.openapi import CONFLICT, NOT_FOUND
from lightning_store.server.outage import unavailable_response
from lightning_store.settings import ServerSettings

OPEN = {("get", "/v1/agl/health")}
NO_DATABASE = {("get", "/metrics")}


def document(*, token: str | None) -> dict[str, Any]:
    app: Any = create_app(ServerSettings(token=token))
    while not isinstance(app, FastAPI):  # the middleware around it (guards, metrics, …) each hold the next
        app = app.app
    first = app.openapi()
    assert app.openapi() is first, "built once and cached"
    assert isinstance(first, dict)
    return first


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


@pytest.mark.parametrize("token", [None, "secret"], ids=["no-token", "token"])
def test_every_operation_declares_what_it_can_answer(token: str | None) -> None:
    doc = document(token=token)
    for method, path, operation in operations(doc):
        key = (method, path)
        statuses = set(operation["responses"])
        assert "422" in statuses, key
        assert ("401" in statuses) == (token is not None and key not in OPEN), key
        assert ("503" in statuses) == (key not in NO_DATABASE), key
        assert ("404" in statuses) == (key in NOT_FOUND), key
        assert ("409" in statuses) == (key in CONFLICT), key
        assert ({"413", "415"} <= statuses) == (method == "post"), key
        assert {s for s in statuses if s.startswith("2")}, f"{key}: no success answer"
        if token is not None:
            assert operation["security"] == ([] if key in OPEN else [{"bearerAuth": []}]), key
    assert ("securitySchemes" in doc["components"]) == (token is not None)
    assert ("get", "/metrics") in {(m, p) for m, p, _ in operations(doc)}


def test_errors_have_the_servers_shape() -> None:
    doc = document(token="secret")
    assert "HTTPValidationError" not in json.dumps(doc)
    assert "ValidationError" not in doc["components"]["schemas"]
    for method, path, operation in operations(doc):
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")):
                name = "HealthUnavailable" if (path, status) == ("/v1/agl/health", "503") else "Error"
                expected = {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
                assert response["content"] == expected, (method, path, status)


def validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema_rs.Draft202012Validator:
    return jsonschema_rs.Draft202012Validator({**schema, "components": doc["components"]})


def test_the_servers_error_bodies_match() -> None:
    doc = document(token=None)
    error = validator(doc, {"$ref": "#/components/schemas/Error"})
    error.validate({"detail": "rollout 'x' not found", "field": "rollout_id", "error_type": "NotFoundError"})
    error.validate(
        {
            "detail": "limit: Input should be a valid integer",
            "field": "limit",
            "error_type": "ValidationError",
            "errors": [{"loc": ["body", "limit"], "msg": "Input should be a valid integer", "type": "int_parsing"}],
        }
    )
    assert not error.is_valid({"detail": [{"loc": ["body"], "msg": "x", "type": "y"}]})  # FastAPI's own shape
    health = doc["paths"]["/v1/agl/health"]["get"]["responses"]
    ok = validator(doc, health["200"]["content"]["application/json"]["schema"])
    ok.validate({"status": "ok", "database": "ok"})
    ok.validate({"status": "ok"})
    down = validator(doc, health["503"]["content"]["application/json"]["schema"])
    down.validate(json.loads(bytes(unavailable_response(status="unavailable", database="unreachable").body)))


def test_every_route_has_a_described_success_body() -> None:
    """FastAPI's generic answers ("any object", titled ``Response …``) are all replaced: a route added later
    must be described in ``server/openapi.py``."""
    doc = document(token=None)
    for method, path, operation in operations(doc):
        for status, response in operation["responses"].items():
            if status.startswith("2"):
                text = json.dumps(response)
                assert '"title": "Response ' not in text, (method, path)
                assert response["content"], (method, path)
                assert all(media["schema"] != {} for media in response["content"].values()), (method, path)


def test_getters_of_unknown_ids_allow_null() -> None:
    doc = document(token=None)
    for path in (
        "/v1/agl/rollouts/{rollout_id}",
        "/v1/agl/rollouts/{rollout_id}/attempts/latest",
        "/v1/agl/resources/latest",
        "/v1/agl/resources/{resources_id}",
        "/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}/resources",
        "/v1/agl/workers/{worker_id}",
    ):
        schema = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert validator(doc, schema).is_valid(None), path


def test_schemas_are_sound_and_references_resolve() -> None:
    doc = document(token="secret")
    schemas = doc["components"]["schemas"]
    for name, schema in schemas.items():
        assert jsonschema_rs.meta.is_valid(schema), name
    referenced = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert referenced <= set(schemas), referenced - set(schemas)
