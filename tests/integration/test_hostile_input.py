"""Hostile and careless input over HTTP, on SQLite and on Postgres: every item is refused with a 4xx naming the
field, writes nothing, and leaves the server healthy and the queue serving; every value that is accepted comes
back unchanged, the same on both backends (``lightning_store.limits``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from lightning_store.limits import MAX_DEPTH, MAX_INT, MAX_SEQUENCE_ID
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
JSON = {"content-type": "application/json"}


def nested(depth: int, leaf: str = "0") -> str:
    """A JSON array nested ``depth`` levels deep, as text (``json.dumps`` would recurse)."""
    return "[" * depth + leaf + "]" * depth


def span(**overrides: Any) -> dict[str, Any]:
    base = {"rollout_id": "r-1", "attempt_id": "a-1", "sequence_id": 1, "trace_id": "t1", "span_id": "s1", "name": "n"}
    return {**base, **overrides}


@dataclass
class Case:
    name: str
    path: str
    body: bytes | None = None
    method: str = "POST"
    status: int = 422
    field: str | None = None
    """The field the error must name (a prefix, for deep paths)."""
    headers: dict[str, str] = dataclasses.field(default_factory=lambda: dict(JSON))


def raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


ENQUEUE = "/v1/agl/queues/rollouts/enqueue"
CASES = [
    # 1. A value nested deeper than the limit is refused before it is written (it used to poison the queue).
    Case("deep input", ENQUEUE, raw('{"rollouts":[{"input":' + nested(256) + "}]}"), field="rollouts.0.input.0.0"),
    Case(
        "deep metadata",
        ENQUEUE,
        raw('{"rollouts":[{"input":1,"metadata":{"a":' + nested(80) + "}}]}"),
        field="rollouts.0.metadata.a",
    ),
    Case(
        "just too deep",
        ENQUEUE,
        raw('{"rollouts":[{"input":' + nested(MAX_DEPTH - 2) + "}]}"),
        field="rollouts.0.input",
    ),
    Case("deeper than the parser", ENQUEUE, raw('{"rollouts":[{"input":' + nested(5000) + "}]}"), field="body"),
    # 2. Non-finite timeouts.
    Case("wait NaN", "/v1/agl/waits/rollouts", raw('{"rollout_ids":["x"],"timeout":NaN}'), field="timeout"),
    Case("dequeue NaN", "/v1/agl/queues/rollouts/dequeue", raw('{"timeout":NaN}'), field="timeout"),
    Case("dequeue -Infinity", "/v1/agl/queues/rollouts/dequeue", raw('{"timeout":-Infinity}'), field="timeout"),
    # 3. NUL characters anywhere.
    Case("NUL in input", ENQUEUE, raw('{"rollouts":[{"input":"a\\u0000b"}]}'), field="rollouts.0.input"),
    Case(
        "NUL in a key",
        ENQUEUE,
        raw('{"rollouts":[{"input":1,"metadata":{"a\\u0000":1}}]}'),
        field="rollouts.0.metadata.a",
    ),
    Case(
        "NUL in rollout_id",
        ENQUEUE,
        raw('{"rollouts":[{"input":1,"rollout_id":"r\\u0000"}]}'),
        field="rollouts.0.rollout_id",
    ),
    Case("NUL in a path id", "/v1/agl/rollouts/r%00x", method="GET", field="path"),
    Case("NUL in a query", "/v1/agl/resources?resources_id=%00", method="GET", field="query"),
    Case("NUL in a span name", "/v1/agl/spans", raw(json.dumps(span(name="a\x00"))), field="name"),
    Case(
        "NUL in a span attribute",
        "/v1/agl/spans/batch",
        raw(json.dumps({"spans": [span(attributes={"k": "\x00"})]})),
        field="spans.0.attributes.k",
    ),
    Case(
        "NUL in a filter",
        "/v1/agl/rollouts/search",
        raw('{"rollout_id_contains":"\\u0000"}'),
        field="rollout_id_contains",
    ),
    Case("NUL in a worker id", "/v1/agl/workers/w%00", body=b"{}", field="path"),
    # 6. NaN, Infinity and overflowing numbers.
    Case("NaN input", ENQUEUE, raw('{"rollouts":[{"input":NaN}]}'), field="rollouts.0.input"),
    Case(
        "Infinity metadata",
        ENQUEUE,
        raw('{"rollouts":[{"input":1,"metadata":{"x":Infinity}}]}'),
        field="rollouts.0.metadata.x",
    ),
    Case("1e400 input", ENQUEUE, raw('{"rollouts":[{"input":[1e400]}]}'), field="rollouts.0.input.0"),
    Case(
        "1e400 span start",
        "/v1/agl/spans",
        raw(json.dumps(span()).replace('"name"', '"start_time":1e400,"name"')),
        field="start_time",
    ),
    # 7. Integers beyond 64 bits, and sequence ids that would break a rollout's counter.
    Case("2^64 limit", "/v1/agl/rollouts/search", raw('{"limit":18446744073709551616}'), field="limit"),
    Case("2^63 offset", "/v1/agl/workers/search", raw(f'{{"offset":{MAX_INT + 1}}}'), field="offset"),
    Case(
        "2^64 span offset",
        "/v1/agl/spans/search",
        raw('{"rollout_id":"r","offset":18446744073709551616}'),
        field="offset",
    ),
    Case("2^64 query limit", f"/v1/agl/resources?limit={2**64}", method="GET", field="limit"),
    Case("2^64 list limit", f"/v1/agl/rollouts?limit={2**64}", method="GET", field="limit"),
    Case("2^63 list offset", f"/v1/agl/workers?offset={2**63}", method="GET", field="offset"),
    Case("NUL in a list filter", "/v1/agl/spans?rollout_id=r-1&name_contains=%00", method="GET", field="query"),
    Case(
        "an unknown status in a list",
        "/v1/agl/rollouts?status_in=running&status_in=bogus",
        method="GET",
        field="status_in.1",
    ),
    Case("a negative list offset", "/v1/agl/rollouts/r-1/attempts?offset=-1", method="GET", status=400, field="offset"),
    Case("a list sorted by JSON", "/v1/agl/rollouts?sort_by=metadata", method="GET", status=400, field="sort_by"),
    Case("2^64 dequeue limit", "/v1/agl/queues/rollouts/dequeue", raw('{"limit":18446744073709551616}'), field="limit"),
    Case("2^70 input", ENQUEUE, raw(f'{{"rollouts":[{{"input":{2**70}}}]}}'), field="rollouts.0.input"),
    Case("5000 digits", ENQUEUE, raw('{"rollouts":[{"input":' + "9" * 5000 + "}]}"), field="body"),
    Case("max sequence id", "/v1/agl/spans", raw(json.dumps(span(sequence_id=MAX_INT))), field="sequence_id"),
    Case(
        "2^40 resources version",
        "/v1/agl/llm_calls/batch",
        raw(
            json.dumps(
                {
                    "calls": [
                        {
                            "rollout_id": "r",
                            "attempt_id": "a",
                            "prompt_token_ids": [],
                            "response_token_ids": [],
                            "start_time": 1,
                            "resources_version": 2**40,
                        }
                    ]
                }
            )
        ),
        field="calls.0.resources_version",
    ),
    # 8. Lone surrogates.
    Case("surrogate input", ENQUEUE, raw('{"rollouts":[{"input":"\\udfff"}]}'), field="rollouts.0.input"),
    Case("surrogate worker", "/v1/agl/queues/rollouts/dequeue", raw('{"worker_id":"\\ud800"}'), field="worker_id"),
    Case("surrogate span name", "/v1/agl/spans", raw(json.dumps(span()).replace('"n"', '"\\udfff"')), field="name"),
    Case(
        "surrogate match",
        "/v1/agl/rollouts/search",
        raw('{"metadata_match":{"k":"\\udfff"}}'),
        field="metadata_match.k",
    ),
    # 9. Ids longer than their columns.
    Case(
        "long resources_id",
        ENQUEUE,
        raw(json.dumps({"rollouts": [{"input": 1, "resources_id": "r" * 129}]})),
        field="rollouts.0.resources_id",
    ),
    Case(
        "long worker_id",
        "/v1/agl/queues/rollouts/dequeue",
        raw(json.dumps({"worker_id": "w" * 129})),
        field="worker_id",
    ),
    Case("long worker path", "/v1/agl/workers/" + "w" * 129, body=b"{}", field="worker_id"),
    Case(
        "long resources path",
        "/v1/agl/resources/" + "r" * 129,
        raw('{"p":{"resource_type":"prompt_template","template":"x","engine":"f-string"}}'),
        field="resources_id",
    ),
    Case("long span_id", "/v1/agl/spans", raw(json.dumps(span(span_id="s" * 65))), field="span_id"),
    Case("long trace_id", "/v1/agl/spans", raw(json.dumps(span(trace_id="t" * 65))), field="trace_id"),
    Case("long parent_id", "/v1/agl/spans", raw(json.dumps(span(parent_id="p" * 65))), field="parent_id"),
    # 10. Deep OTLP/JSON and undecodable bodies get the documented error shape.
    Case("deep OTLP", "/v1/traces", raw('{"resourceSpans":' + nested(600) + "}"), field="body"),
    Case("invalid UTF-8", ENQUEUE, b'{"rollouts":[{"input":"\xff"}]}', field="body"),
    Case("not JSON", ENQUEUE, b'{"rollouts":', field="body"),
    Case("OTLP null", "/v1/traces", b"null", field="body"),
    Case("OTLP array", "/v1/traces", b"[]", field="body"),
    Case("dot id", ENQUEUE, raw('{"rollouts":[{"input":1,"rollout_id":".."}]}'), field="rollouts.0.rollout_id"),
    Case("false offset", "/v1/agl/rollouts/search", raw('{"offset":false}'), field="offset"),
    # 13. Odds and ends.
    Case(
        "slash in rollout_id",
        ENQUEUE,
        raw('{"rollouts":[{"input":1,"rollout_id":"a/b"}]}'),
        field="rollouts.0.rollout_id",
    ),
    Case(
        "chunked, wrong type",
        ENQUEUE,
        b'{"rollouts":[{"input":1}]}',
        status=415,
        headers={"content-type": "text/plain"},
    ),
]


@contextlib.asynccontextmanager
async def server(database_url: str) -> AsyncIterator[tuple[SqlStore, httpx.AsyncClient]]:
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    try:
        async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
            yield store, http
    finally:
        await store.close()


async def row_counts(store: SqlStore) -> dict[str, int]:
    stats = await store.statistics()
    return {
        name: int(stats[name])
        for name in ("total_rollouts", "total_attempts", "total_spans", "total_resources", "total_workers")
    }


async def queue_serves(http: httpx.AsyncClient) -> None:
    """Enqueue, search, claim and read back one ordinary rollout."""
    enqueued = await http.post(ENQUEUE, json={"rollouts": [{"input": {"q": "2+2"}}]})
    assert enqueued.status_code == 201, enqueued.text
    assert (await http.post("/v1/agl/rollouts/search", json={})).status_code == 200
    rollout_id = enqueued.json()[0]["rollout_id"]
    claimed = await http.post("/v1/agl/queues/rollouts/dequeue", json={"worker_id": "w", "limit": 10})
    assert claimed.status_code == 200 and rollout_id in [r["rollout_id"] for r in claimed.json()], claimed.text
    assert (await http.get(f"/v1/agl/rollouts/{rollout_id}")).json()["input"] == {"q": "2+2"}


def chunks(body: bytes) -> AsyncIterator[bytes]:
    async def generate() -> AsyncIterator[bytes]:
        yield body

    return generate()


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_hostile_input_is_refused_and_writes_nothing(database_url: str, case: Case) -> None:
    async with server(database_url) as (store, http):
        # A rollout and an attempt the span cases could attach to, so that only the bad value can refuse them.
        await http.post(ENQUEUE, json={"rollouts": [{"input": 0, "rollout_id": "r-1"}]})
        before = await row_counts(store)
        content: Any = chunks(case.body or b"") if case.name.startswith("chunked") else case.body
        answer = await http.request(case.method, case.path, content=content, headers=case.headers)
        assert answer.status_code == case.status, answer.text
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()
        assert set(error) >= {"detail", "field", "error_type"}, error
        if case.field is not None:
            assert (error["field"] or "").startswith(case.field), error
        assert await row_counts(store) == before
        assert (await http.get("/v1/agl/health")).status_code == 200
        await queue_serves(http)


def canonical(value: Any) -> str:
    """JSON text that tells 1 from 1.0 and True from 1, and ignores object key order (Postgres's jsonb sorts keys)."""
    return json.dumps(value, sort_keys=True)


ACCEPTED: list[Any] = [
    json.loads(nested(MAX_DEPTH - 4)),  # the deepest: body, rollouts, item, metadata and "v" take 5 levels
    [MAX_INT, -MAX_INT - 1, 2**53 + 1, 0, -1],
    [1.5, -0.25, 1e300, -1e-300, 5e-324, 1.7976931348623157e308, 0.1, 1e16, 123456789.123],
    ["é", "😀", "\u2028", "\\u0000", "\x01\x1f", "a" * 100_000, "\ufeff"],
    {"": 1, "a.b": 2, 'q"uote': 3, "$": 4, "[0]": 5, "😀": 6, "a\\b": 7},
    {"nested": {"list": [None, True, False, {"x": []}]}},
]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize("value", ACCEPTED, ids=["deepest", "int64", "floats", "strings", "keys", "mixed"])
async def test_accepted_values_come_back_unchanged(database_url: str, value: Any) -> None:
    async with server(database_url) as (_, http):
        body = {"rollouts": [{"input": value, "metadata": {"v": value}, "rollout_id": "r-1"}]}
        answer = await http.post(ENQUEUE, json=body)
        assert answer.status_code == 201, answer.text
        got = (await http.get("/v1/agl/rollouts/r-1")).json()
        assert canonical(got["input"]) == canonical(value)
        assert canonical(got["metadata"]) == canonical({"v": value})
        claimed = (await http.post("/v1/agl/queues/rollouts/dequeue", json={})).json()
        assert canonical(claimed[0]["input"]) == canonical(value)
        span = {"rollout_id": "r-1", "attempt_id": claimed[0]["attempt"]["attempt_id"], "sequence_id": 1}
        span |= {"trace_id": "t", "span_id": "s", "name": "n", "attributes": {"v": value}}
        assert (await http.post("/v1/agl/spans", json=span)).status_code == 201
        spans = (await http.post("/v1/agl/spans/search", json={"rollout_id": "r-1"})).json()["items"]
        assert canonical(spans[0]["attributes"]) == canonical({"v": value})
        found = await http.post("/v1/agl/rollouts/search", json={"metadata_match": {"v": value}})
        assert found.status_code == 200 and found.json()["total"] == 1, found.text
        assert canonical(found.json()["items"][0]["input"]) == canonical(value)
        assert canonical(found.json()["items"][0]["metadata"]) == canonical({"v": value})
        if isinstance(value, dict):  # the value's own keys, as metadata keys
            assert (await http.post("/v1/agl/rollouts/r-1", json={"metadata": value})).status_code == 200
            for key, item in value.items():
                found = await http.post("/v1/agl/rollouts/search", json={"metadata_match": {key: item}})
                assert found.status_code == 200 and found.json()["total"] == 1, (key, found.text)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_span_at_the_largest_sequence_id_leaves_none_to_hand_out(database_url: str) -> None:
    """The counter never hands out a number past the documented 2^53 - 1 (it once gave 2^53): a 409 naming the
    rollout, and the rollout's spans that bring their own numbers still go in."""
    async with server(database_url) as (_, http):
        await http.post(ENQUEUE, json={"rollouts": [{"input": 0, "rollout_id": "r-1"}]})
        attempt = (await http.post("/v1/agl/queues/rollouts/dequeue", json={})).json()[0]["attempt"]["attempt_id"]
        added = await http.post("/v1/agl/spans", json=span(attempt_id=attempt, sequence_id=MAX_SEQUENCE_ID))
        assert added.status_code == 201, added.text
        following = await http.post("/v1/agl/spans/next", json={"rollout_id": "r-1", "attempt_id": attempt})
        assert following.status_code == 409 and following.json()["field"] == "rollout_id", following.text
        lower = await http.post("/v1/agl/spans", json=span(attempt_id=attempt, sequence_id=3, span_id="s-low"))
        assert lower.status_code == 201, lower.text


def otlp_span(span_id: str, attempt_id: str, value: str) -> dict[str, Any]:
    attributes = {"agentlightning.rollout_id": "r-1", "agentlightning.attempt_id": attempt_id, "note": value}
    return {
        "traceId": "ab" * 16,
        "spanId": span_id * 8,
        "name": "tool",
        "startTimeUnixNano": "1700000000000000000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_an_otlp_span_beyond_the_limits_is_dropped_alone(database_url: str) -> None:
    async with server(database_url) as (store, http):
        await http.post(ENQUEUE, json={"rollouts": [{"input": 0, "rollout_id": "r-1"}]})
        attempt = (await http.post("/v1/agl/queues/rollouts/dequeue", json={})).json()[0]["attempt"]["attempt_id"]
        spans = [otlp_span("01", attempt, "fine"), otlp_span("02", attempt, "nul \x00 here")]
        export = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
        answer = await http.post("/v1/traces", json=export)
        assert answer.status_code == 200, answer.text
        partial = answer.json()["partialSuccess"]
        assert partial["rejectedSpans"] == "1" and "NUL" in partial["errorMessage"], partial
        stored = await store.query_spans("r-1")
        assert [span.span_id for span in stored] == ["01" * 8]
