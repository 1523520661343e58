"""The HTTP server's own promises: every caller mistake is a clear 4xx that writes nothing; tokens; OTLP ingest."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from lightning_store.client import HttpStore
from lightning_store.errors import UnauthorizedError
from lightning_store.limits import MAX_SPAN_NAME_LENGTH
from lightning_store.models import AttemptedRollout, RolloutConfig
from lightning_store.server.run import check
from lightning_store.settings import ServerSettings
from lightning_store.sql import SqlStore
from tests.conftest import serving


@pytest.fixture
async def base_url(sql_store: SqlStore) -> AsyncIterator[str]:
    async with serving(sql_store, max_body_bytes=64 * 1024) as url:
        yield url


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        yield client


async def counts(store: SqlStore) -> tuple[int, int]:
    stats = await store.statistics()
    return stats["total_rollouts"], stats["total_spans"]


def span_json(rollout: AttemptedRollout, span_id: str, **changes: Any) -> dict[str, Any]:
    span = {
        "rollout_id": rollout.rollout_id,
        "attempt_id": rollout.attempt.attempt_id,
        "sequence_id": 1,
        "trace_id": "ab" * 16,
        "span_id": span_id,
        "parent_id": None,
        "name": "step",
        "status": {"status_code": "OK"},
        "attributes": {},
        "events": [],
        "links": [],
        "start_time": 1.0,
        "end_time": 2.0,
        "context": None,
        "parent": None,
        "resource": {"attributes": {}, "schema_url": ""},
    }
    span.update(changes)
    return span


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/agl/queues/rollouts/enqueue", {"rollouts": [{"input": 1, "mode": "prod"}]}, "rollouts.0.mode"),
        (
            "/v1/agl/queues/rollouts/enqueue",
            {"rollouts": [{"input": 1, "config": {"max_attempts": 0}}]},
            "rollouts.0.config.max_attempts",
        ),
        ("/v1/agl/queues/rollouts/enqueue", {"rollouts": [{"input": 1, "surprise": True}]}, "rollouts.0.surprise"),
        ("/v1/agl/queues/rollouts/enqueue", {}, "rollouts"),
        ("/v1/agl/rollouts/search", {"limit": "many"}, "limit"),
        ("/v1/agl/waits/rollouts", {"rollout_ids": "ro-1"}, "rollout_ids"),
        ("/v1/agl/resources", {"llm": {"resource_type": "llm"}}, "resources.llm.llm.endpoint"),
    ],
)
async def test_invalid_bodies_are_422_naming_the_field(
    http: httpx.AsyncClient, sql_store: SqlStore, path: str, body: Any, field: str
) -> None:
    response = await http.post(path, json=body)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert await counts(sql_store) == (0, 0)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/agl/rollouts/search", {"sort_by": "input"}, "sort_by"),
        ("/v1/agl/rollouts/search", {"limit": 0}, "limit"),
        ("/v1/agl/rollouts/search", {"offset": -1}, "offset"),
        ("/v1/agl/workers/search", {"sort_by": "heartbeat_stats"}, "sort_by"),
    ],
)
async def test_impossible_pages_are_400_as_in_agent_lightning(
    http: httpx.AsyncClient, path: str, body: Any, field: str
) -> None:
    response = await http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field


async def test_the_root_leads_to_the_dashboard(http: httpx.AsyncClient) -> None:
    response = await http.get("/")
    assert response.status_code == 307 and response.headers["location"] == "/dashboard/"


async def test_malformed_json_is_422_not_500(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/agl/queues/rollouts/enqueue", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422


async def test_null_status_in_update_is_refused_and_changes_nothing(
    http: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    rollout = await sql_store.enqueue_rollout(1, metadata={"keep": True})
    response = await http.post(f"/v1/agl/rollouts/{rollout.rollout_id}", json={"status": None, "metadata": {}})
    assert response.status_code == 400 and response.json()["field"] == "status"  # Agent Lightning's status
    assert await sql_store.get_rollout_by_id(rollout.rollout_id) == rollout


async def test_unknown_ids_are_404_and_getters_answer_null(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/agl/rollouts/ro-missing", json={"status": "cancelled"})
    assert response.status_code == 404 and response.json()["field"] == "rollout_id"
    response = await http.post("/v1/agl/rollouts/ro-missing/attempts/latest", json={"status": "failed"})
    assert response.status_code == 404
    # As in Agent Lightning, a getter answers 200 with null; its client turns that into None.
    for path in ("/v1/agl/rollouts/ro-missing", "/v1/agl/resources/rs-missing", "/v1/agl/workers/w-missing"):
        response = await http.get(path)
        assert (response.status_code, response.json()) == (200, None)


async def test_a_bad_span_in_a_batch_writes_none_of_it(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    good = span_json(rollout, "s1")
    bad = span_json(rollout, "s2", attempt_id="at-missing")
    response = await http.post("/v1/agl/spans/batch", json={"spans": [good, bad]})
    assert response.status_code == 404 and response.json()["field"] == "spans.1.attempt_id"
    response = await http.post("/v1/agl/spans/batch", json={"spans": [good, span_json(rollout, "s3", name=5)]})
    assert response.status_code == 422 and response.json()["field"] == "spans.1.name"
    assert await counts(sql_store) == (1, 0)


async def test_a_span_batch_that_allocates_its_numbers_may_leave_them_out(
    http: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    rollout = await sql_store.start_rollout(1)
    unnumbered = {k: v for k, v in span_json(rollout, "s1").items() if k != "sequence_id"}
    response = await http.post("/v1/agl/spans/batch", json={"spans": [unnumbered]})
    assert response.status_code == 422 and response.json()["field"] == "spans.0.sequence_id"
    response = await http.post("/v1/agl/spans/batch", json={"spans": [unnumbered], "allocate_sequence_ids": True})
    assert response.status_code == 201
    assert [span["sequence_id"] for span in response.json()["spans"]] == [1]
    response = await http.post("/v1/agl/spans/batch", json={"spans": [], "allocate_sequence_ids": "maybe"})
    assert response.status_code == 422 and response.json()["field"] == "allocate_sequence_ids"


async def test_a_span_batch_can_answer_positions_instead_of_spans(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    await http.post("/v1/agl/spans", json=span_json(rollout, "old"))
    batch = [span_json(rollout, "a"), span_json(rollout, "old"), span_json(rollout, "b"), span_json(rollout, "a")]
    response = await http.post("/v1/agl/spans/batch", json={"spans": batch, "return_spans": False})
    assert response.status_code == 201
    assert response.json() == {"added": [0, 2], "sequence_ids": [1, 1]}  # span_json numbers every span 1
    numbered = [span_json(rollout, "c"), span_json(rollout, "b"), span_json(rollout, "d")]
    body = {"spans": numbered, "allocate_sequence_ids": True, "return_spans": False}
    response = await http.post("/v1/agl/spans/batch", json=body)
    # The counter stood at 1 ("old"); the duplicate "b" was numbered too (3) before it was found stored.
    assert response.json() == {"added": [0, 2], "sequence_ids": [2, 4]}
    stored = {span.span_id: span.sequence_id for span in await sql_store.query_spans(rollout.rollout_id)}
    assert stored == {"old": 1, "a": 1, "b": 1, "c": 2, "d": 4}


async def test_duplicate_span_answers_null(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    first = await http.post("/v1/agl/spans", json=span_json(rollout, "s1"))
    again = await http.post("/v1/agl/spans", json=span_json(rollout, "s1"))
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json()["span_id"] == "s1" and again.json() is None


async def test_body_over_the_limit_is_413_and_writes_nothing(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    huge = {"rollouts": [{"input": "x" * (70 * 1024)}]}
    response = await http.post("/v1/agl/queues/rollouts/enqueue", json=huge)
    assert response.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit is counted while streaming
        yield json.dumps(huge).encode()

    response = await http.post(
        "/v1/agl/queues/rollouts/enqueue", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert await counts(sql_store) == (0, 0)


async def test_wrong_content_type_is_415(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    response = await http.post(
        "/v1/agl/queues/rollouts/enqueue",
        content=b"input=1",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 415
    response = await http.post("/v1/traces", content=b"x", headers={"content-type": "text/plain"})
    assert response.status_code == 415
    assert await counts(sql_store) == (0, 0)


async def test_token_guards_every_route_but_health(sql_store: SqlStore) -> None:
    async with serving(sql_store, token="s3cret") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.get("/v1/agl/health")).status_code == 200
            assert (await http.get("/v1/agl/statistics")).status_code == 401
            assert (await http.get("/metrics")).status_code == 401
            wrong = await http.get("/v1/agl/statistics", headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401
            refused = await http.post("/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": 1}]})
            assert refused.status_code == 401
        anonymous = HttpStore(url)
        with pytest.raises(UnauthorizedError):
            await anonymous.statistics()
        await anonymous.close()
        client = HttpStore(url, token="s3cret")
        assert (await client.enqueue_rollout(1)).status == "queuing"
        await client.close()
    assert (await sql_store.statistics())["total_rollouts"] == 1


@pytest.mark.parametrize(
    ("host", "token", "insecure", "allowed"),
    [
        ("127.0.0.1", None, False, True),
        ("localhost", None, False, True),
        ("::1", None, False, True),
        ("0.0.0.0", None, False, False),
        ("0.0.0.0", "t", False, True),
        ("0.0.0.0", None, True, True),
    ],
)
def test_non_loopback_host_needs_a_token(host: str, token: str | None, insecure: bool, allowed: bool) -> None:
    settings = ServerSettings(host=host, token=token, insecure=insecure)
    if allowed:
        check(settings)
    else:
        with pytest.raises(ValueError, match="--token"):
            check(settings)


def test_several_workers_need_postgres() -> None:
    with pytest.raises(ValueError, match="Postgres"):
        check(ServerSettings(workers=2, database_url="sqlite:///x.db"))


async def test_metrics_and_openapi(http: httpx.AsyncClient) -> None:
    await http.get("/v1/agl/health")
    metrics = await http.get("/metrics")
    assert metrics.status_code == 200 and "lightning_store_http_requests" in metrics.text
    openapi = (await http.get("/openapi.json")).json()
    assert "/v1/agl/queues/rollouts/dequeue" in openapi["paths"]


async def test_the_api_pages_need_no_network(http: httpx.AsyncClient) -> None:
    """/docs and /redoc load every script, style and icon from this server (an offline machine shows them), and
    /metrics counts those routes by name, not as ``unmatched``."""
    for page in ("/docs", "/redoc"):
        html = (await http.get(page)).text
        assets = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)['"]""", html)
        assert assets and all(a.startswith("/") and not a.startswith("//") for a in assets), (page, assets)
        assert "/openapi.json" in html
        for asset in assets:
            answer = await http.get(asset)
            assert answer.status_code == 200 and len(answer.content) > 100, (asset, answer.status_code)
    await http.get("/openapi.json")
    await http.get("/static-offline-docs/no-such-file.js")
    metrics = (await http.get("/metrics")).text
    for route in ("/docs", "/redoc", "/openapi.json", "/static-offline-docs/{path}"):
        assert f'route="{route}"' in metrics, route
    assert "no-such-file" not in metrics


async def test_long_poll_dequeue_over_http(base_url: str, sql_store: SqlStore) -> None:
    client = HttpStore(base_url)
    import asyncio

    async def enqueue_later() -> None:
        await asyncio.sleep(0.3)
        await sql_store.enqueue_rollout("late")

    claimed, _ = await asyncio.gather(client.dequeue_rollout(worker_id="w", timeout=20), enqueue_later())
    assert claimed is not None and claimed.input == "late"
    await client.close()


# OTLP --------------------------------------------------------------------------------------------------------


def export_with_sdk(url: str, resource: dict[str, Any], spans: list[tuple[str, dict[str, Any]]]) -> None:
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    tracer = provider.get_tracer("test")
    for name, attributes in spans:
        with tracer.start_as_current_span(name, attributes=attributes):
            pass
    provider.shutdown()


async def test_otlp_protobuf_from_the_sdk_exporter(base_url: str, sql_store: SqlStore) -> None:
    import asyncio

    rollout = await sql_store.start_rollout(1)
    resource = {
        "agentlightning.rollout_id": rollout.rollout_id,
        "agentlightning.attempt_id": rollout.attempt.attempt_id,
    }
    spans: list[tuple[str, dict[str, Any]]] = [
        ("first", {"agentlightning.span_sequence_id": "42", "k": [1, 2]}),
        ("second", {"ok": True}),
    ]
    await asyncio.to_thread(export_with_sdk, base_url, resource, spans)
    stored = await sql_store.query_spans(rollout.rollout_id)
    assert [(s.name, s.sequence_id) for s in stored] == [("first", 42), ("second", 43)]
    assert stored[0].attributes["k"] == [1, 2] and stored[1].resource.attributes["service.name"]
    attempt = await sql_store.get_latest_attempt(rollout.rollout_id)
    assert attempt is not None and attempt.status == "running"


def otlp_json(rollout: AttemptedRollout | None, names: list[str], first: int = 1) -> dict[str, Any]:
    resource = (
        []
        if rollout is None
        else [
            {"key": "agentlightning.rollout_id", "value": {"stringValue": rollout.rollout_id}},
            {"key": "agentlightning.attempt_id", "value": {"stringValue": rollout.attempt.attempt_id}},
        ]
    )
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": resource},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": f"{first + i:016x}",
                                "name": name,
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001000000000",
                                "attributes": [{"key": "n", "value": {"intValue": str(i)}}],
                                "status": {"code": 2, "message": "boom"},
                            }
                            for i, name in enumerate(names)
                        ]
                    }
                ],
            }
        ]
    }


async def test_otlp_json_and_gzip(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    rollout = await sql_store.start_rollout(1)
    response = await http.post("/v1/traces", json=otlp_json(rollout, ["a", "b"]))
    assert response.status_code == 200, response.text
    body = gzip.compress(json.dumps(otlp_json(rollout, ["c"], first=3)).encode())
    response = await http.post(
        "/v1/traces", content=body, headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    assert response.status_code == 200, response.text
    stored = await sql_store.query_spans(rollout.rollout_id)
    assert [s.name for s in stored] == ["a", "b", "c"]
    assert stored[0].trace_id == "5b8efff798038103d269b633813fc60c" and stored[0].span_id == "0000000000000001"
    assert stored[1].attributes == {"n": 1} and stored[0].status.status_code == "ERROR"
    assert stored[0].start_time == 1700000000.0


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_span_pages_are_sent_as_the_models_would_dump_them(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    """``/spans/search`` answers with the stored documents (not validated, not dumped again): each must be what the
    span's model dumps, field for field, whichever way the span arrived: a full span, one with only the required
    fields and an unknown one, OTLP."""
    rollout = await sql_store.start_rollout(1)
    minimal = {key: span_json(rollout, "s2")[key] for key in ("rollout_id", "attempt_id", "trace_id", "span_id")}
    minimal["sequence_id"] = 2
    batch = [span_json(rollout, "s1", attributes={"x": [1.5, None]}), {**minimal, "name": "bare", "surprise": {"a": 1}}]
    assert (await http.post("/v1/agl/spans/batch", json={"spans": batch})).status_code == 201
    assert (await http.post("/v1/traces", json=otlp_json(rollout, ["o"], first=7))).status_code == 200
    models = await sql_store.query_spans(rollout.rollout_id)
    answer = await http.post("/v1/agl/spans/search", json={"rollout_id": rollout.rollout_id, "limit": 2, "offset": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "items": [span.model_dump(mode="json") for span in models[1:3]],
        "limit": 2,
        "offset": 1,
        "total": 3,
    }
    assert [s["name"] for s in answer.json()["items"]] == ["bare", "o"] and answer.json()["items"][0]["surprise"]


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_rollout_pages_are_sent_as_the_models_would_dump_them(
    http: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    """``/rollouts/search`` answers with the stored documents too: a rollout with no attempt, one with null input
    and metadata, one whose latest attempt has metadata, as their models dump them (``attempt`` only where one is)."""
    config = RolloutConfig(max_attempts=3, retry_condition=["failed"], timeout_seconds=9.5)
    await sql_store.enqueue_rollout({"q": [1, 2.5, None]}, mode="train", config=config, metadata={"k": {"é": True}})
    bare = await sql_store.start_rollout(None)
    await sql_store.update_attempt(bare.rollout_id, "latest", metadata={"note": [1]}, last_heartbeat_time=3.0)
    models = await sql_store.query_rollouts(sort_by="start_time", sort_order="desc")
    answer = await http.post("/v1/agl/rollouts/search", json={"sort_by": "start_time", "sort_order": "desc"})
    assert answer.status_code == 200, answer.text
    expected = [rollout.model_dump(mode="json") for rollout in models]
    assert answer.json() == {"items": expected, "limit": -1, "offset": 0, "total": 2}
    assert "attempt" in answer.json()["items"][0] and "attempt" not in answer.json()["items"][1]


async def test_otlp_spans_without_ids_are_rejected_not_stored(http: httpx.AsyncClient, sql_store: SqlStore) -> None:
    response = await http.post("/v1/traces", json=otlp_json(None, ["orphan"]))
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert await counts(sql_store) == (0, 0)


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_an_otlp_span_whose_name_is_too_long_is_dropped_alone(
    http: httpx.AsyncClient, sql_store: SqlStore
) -> None:
    """A name over the stated limit (which a Postgres index entry cannot hold) loses that span only."""
    rollout = await sql_store.start_rollout(1)
    names = ["a", "𐀀" * (MAX_SPAN_NAME_LENGTH + 1), "c"]
    response = await http.post("/v1/traces", json=otlp_json(rollout, names))
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and f"longer than {MAX_SPAN_NAME_LENGTH}" in partial["errorMessage"]
    assert [s.name for s in await sql_store.query_spans(rollout.rollout_id)] == ["a", "c"]


async def test_otlp_undecodable_is_422(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/traces", content=b"\xff\x00garbage", headers={"content-type": "application/x-protobuf"}
    )
    assert response.status_code == 422
    response = await http.post(
        "/v1/traces", content=b"not gzip", headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    assert response.status_code == 422
