# mypy: ignore-errors
"""Drives Agent Lightning 0.3's unmodified ``LightningStoreClient`` against a store server and checks every answer.

Runs in an interpreter that has ``agentlightning`` installed (never in the project's own environment), so it
imports only ``agentlightning``, its dependencies (aiohttp, pydantic, opentelemetry) and the standard library::

    python tests/integration/agl_driver.py http://127.0.0.1:4747

The expectations are Agent Lightning 0.3's own semantics: the script passes against ``agl store`` (the in-memory
reference server), so a failure against another server is an incompatibility. It goes on after a failed check, so
one run reports every problem. Each failure names the client call, what was expected, what came back, and the HTTP
exchanges that call made (method, path, request body, status, response body), recorded by an aiohttp trace hook
that only observes. Where a server differs from the reference but the client cannot tell, the difference is listed
under ``differences`` and does not fail the run.

The last line of stdout is a JSON summary: ``ok``, ``failures``, ``differences``, ``calls`` (client methods
called), and ``state`` (the ids written and what they should hold) for the caller to check in the store itself.
Exit status: 0 when every check passed, 1 otherwise, 2 on a crash of the driver itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import sys
import time
import traceback
import urllib.request
from collections.abc import Awaitable, Iterator
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # agentlightning imports litellm, which else stalls

import aiohttp
from agentlightning import (
    LLM,
    Attempt,
    AttemptedRollout,
    EnqueueRolloutRequest,
    PromptTemplate,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    Span,
    Worker,
)
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types.tracer import OtelResource, SpanContext, TraceStatus
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

UNKNOWN = "ro-does-not-exist"
UPSERT_RESOURCES_ID = "rs-agl-compat-upsert"
OTLP_CHILD_SEQUENCE_ID = 1000
NOT_SENT = ("close",)  # coroutine methods that are not store calls


class CheckFailed(Exception):
    """A check failed inside a step; the failure is already recorded."""


class HttpLog:
    """Every HTTP exchange of the client's aiohttp session, as (method, path, request body, status, response)."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []
        self._bodies: dict[int, bytes] = {}

    def trace_config(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()
        config.on_request_chunk_sent.append(self._on_chunk)
        config.on_request_end.append(self._on_end)
        config.on_request_exception.append(self._on_exception)
        return config

    async def _on_chunk(self, _session: Any, context: Any, params: Any) -> None:
        self._bodies[id(context)] = self._bodies.get(id(context), b"") + bytes(params.chunk)

    async def _on_end(self, _session: Any, context: Any, params: Any) -> None:
        response = params.response
        try:
            text = (await response.read()).decode("utf-8", "replace")  # cached: the client reads it again
        except Exception as exc:
            text = f"<unreadable body: {exc!r}>"
        self._append(params.method, params.url, context, response.status, response.content_type, text)

    async def _on_exception(self, _session: Any, context: Any, params: Any) -> None:
        self._append(params.method, params.url, context, None, None, f"<{params.exception!r}>")

    def _append(self, method: str, url: Any, context: Any, status: Any, content_type: Any, text: str) -> None:
        request = self._bodies.pop(id(context), b"").decode("utf-8", "replace")
        self.exchanges.append(
            {
                "method": method,
                "path": url.path_qs,
                "request": request[:600],
                "status": status,
                "content_type": content_type,
                "response": text[:400],
            }
        )

    def mark(self) -> int:
        return len(self.exchanges)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.exchanges[mark:]


def describe(exchanges: list[dict[str, Any]]) -> str:
    lines = [
        f"    {e['method']} {e['path']} body={e['request'] or '-'} -> {e['status']} ({e['content_type']}) "
        f"{e['response']}"
        for e in exchanges[-4:]
    ]
    return "\n".join(lines) if lines else "    (no HTTP exchange)"


def dump(value: Any) -> Any:
    """A JSON-able view of a client result, for messages."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [dump(v) for v in value]
    return value


def short(value: Any, limit: int = 400) -> str:
    text = json.dumps(dump(value), default=str)
    return text if len(text) <= limit else text[:limit] + "…"


class Driver:
    """Calls every client method through :meth:`call` and records each failed :meth:`expect`."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # Short retry delays keep a 5xx from stalling the run; the schedule's shape (retry 5xx, not 4xx) is kept.
        self.client = LightningStoreClient(self.url, retry_delays=(0.05, 0.1, 0.2), health_retry_delays=(0.05,))
        self.http = HttpLog()
        self.failures: list[str] = []
        self.differences: list[str] = []
        self.calls: dict[str, int] = {}
        # Rollouts and attempts that the steps before "enqueue, unknown resources" create when they all pass.
        self.state: dict[str, Any] = {"created": 7, "created_attempts": 10}
        self._step = ""
        self._call = ""
        self._mark = 0

    # Recording ---------------------------------------------------------------------------------------------

    async def install_tracing(self) -> None:
        """Give the client a session (per event loop, as it makes them itself) that also carries the trace hook."""
        timeout = aiohttp.ClientTimeout(total=30.0, connect=5.0, sock_connect=5.0, sock_read=30.0)
        session = aiohttp.ClientSession(timeout=timeout, trace_configs=[self.http.trace_config()])
        self.client._sessions[id(asyncio.get_running_loop())] = session

    async def call(self, label: str, awaitable: Awaitable[Any]) -> Any:
        """Await one client call; an exception is a failure naming the call and its HTTP exchanges."""
        name = label.split("(")[0]
        self.calls[name] = self.calls.get(name, 0) + 1
        self._call, self._mark = label, self.http.mark()
        started = time.monotonic()
        try:
            result = await awaitable
        except Exception as exc:
            self.fail(f"raised {type(exc).__name__}: {exc}")
            raise CheckFailed from None
        self._slow_check(time.monotonic() - started)
        return result

    async def call_raises(
        self, label: str, awaitable: Awaitable[Any], *, lenient: str | None = None, status: int | None = None
    ) -> Any:
        """A call that must fail with an HTTP error status (``status`` where the reference's clients branch on it);
        returns the exception. A 5xx (retried) is a difference. With ``lenient``, success is a difference described
        by it rather than a failure (and returns None)."""
        name = label.split("(")[0]
        self.calls[name] = self.calls.get(name, 0) + 1
        self._call, self._mark = label, self.http.mark()
        try:
            result = await awaitable
        except aiohttp.ClientResponseError as exc:
            if status is not None and exc.status != status:
                self.fail(f"expected HTTP {status} (as the reference answers), got {exc.status}")
            elif not 400 <= exc.status < 500:
                self.differ(f"failed with HTTP {exc.status} (retried by the client); a 4xx fails at once")
            return exc
        except Exception as exc:
            self.fail(f"expected an HTTP error status (aiohttp.ClientResponseError), got {type(exc).__name__}: {exc}")
            return exc
        if lenient is not None:
            self.differ(lenient)
        else:
            self.fail(f"expected an HTTP error status (as the reference answers), got {short(result)}")
        return None

    def _slow_check(self, seconds: float) -> None:
        retried = [e for e in self.http.since(self._mark) if e["status"] is None or e["status"] >= 500]
        if retried:
            self.differ(f"took {seconds:.2f}s: the client retried after {len(retried)} failed exchange(s)")

    def expect(self, condition: bool, expected: str, got: Any) -> bool:
        if not condition:
            self.fail(f"expected {expected}; got {short(got)}")
        return condition

    def require(self, condition: bool, expected: str, got: Any) -> None:
        """Like :meth:`expect`, but the rest of the step depends on it."""
        if not self.expect(condition, expected, got):
            raise CheckFailed

    def fail(self, message: str) -> None:
        exchanges = describe(self.http.since(self._mark))
        self.failures.append(f"[{self._step}] {self._call}: {message}\n{exchanges}")

    def differ(self, message: str) -> None:
        exchanges = describe(self.http.since(self._mark))
        self.differences.append(f"[{self._step}] {self._call}: {message}\n{exchanges}")

    async def step(self, name: str, body: Any) -> None:
        self._step, self._call, self._mark = name, "(setup)", self.http.mark()
        try:
            await body()
        except CheckFailed:
            pass
        except KeyError as exc:
            self.failures.append(f"[{name}] skipped: it needs {exc} from an earlier step that failed")
        except Exception as exc:
            self.failures.append(f"[{name}] driver error in {self._call}: {exc!r}\n{traceback.format_exc()}")

    # Steps ---------------------------------------------------------------------------------------------------

    async def health(self) -> None:
        self._call = "GET /v1/agl/health"
        status, body = await asyncio.to_thread(_get_json, f"{self.url}/v1/agl/health")
        # Agent Lightning's client reads only the status code; the store adds the database's state.
        healthy = status == 200 and body == {"status": "ok", "database": "ok"}
        self.expect(healthy, '200 {"status": "ok", "database": "ok"}', [status, body])
        capabilities = self.client.capabilities
        self.expect(capabilities.get("otlp_traces") is True, "capabilities with otlp_traces", capabilities)
        self.calls["capabilities"] = 1
        endpoint = self.client.otlp_traces_endpoint()
        self.calls["otlp_traces_endpoint"] = 1
        self.expect(endpoint == f"{self.url}/v1/traces", f"{self.url}/v1/traces", endpoint)

    async def resources(self) -> None:
        first = {
            "main_llm": LLM(endpoint="http://llm:8000/v1", model="qwen", sampling_parameters={"temperature": 0.7}),
            "prompt": PromptTemplate(template="Solve {task}", engine="f-string"),
        }
        added = await self.call("add_resources(llm+prompt)", self.client.add_resources(first))
        self.require(isinstance(added, ResourcesUpdate), "a ResourcesUpdate", added)
        self.expect(added.version == 1, "version 1", added)
        self.expect(added.create_time == added.update_time, "create_time == update_time", added)
        self.expect(dump(added.resources) == dump(first), f"resources {short(first)}", added.resources)
        rid = self.state["resources_id"] = added.resources_id
        latest = await self.call("get_latest_resources()", self.client.get_latest_resources())
        self.expect(latest is not None and latest.resources_id == rid, f"the latest to be {rid}", latest)
        await self.resources_update(rid)
        await self.resources_query(rid)

    async def resources_update(self, rid: str) -> None:
        second = {"main_llm": LLM(endpoint="http://llm:8001/v1", model="qwen-2")}
        updated = await self.call(f"update_resources({rid})", self.client.update_resources(rid, second))
        self.expect(updated.resources_id == rid and updated.version == 2, f"{rid} at version 2", updated)
        self.expect(dump(updated.resources) == dump(second), "the resources replaced wholesale", updated.resources)
        self.expect(updated.update_time >= updated.create_time, "update_time >= create_time", updated)
        upsert = await self.call(
            f"update_resources({UPSERT_RESOURCES_ID}) (upsert)",
            self.client.update_resources(UPSERT_RESOURCES_ID, {"p": PromptTemplate(template="x", engine="jinja")}),
        )
        self.expect(upsert.resources_id == UPSERT_RESOURCES_ID and upsert.version == 1, "a new id, version 1", upsert)
        latest = await self.call("get_latest_resources() after upsert", self.client.get_latest_resources())
        self.expect(
            latest is not None and latest.resources_id == UPSERT_RESOURCES_ID, "the upserted id to be latest", latest
        )
        by_id = await self.call(f"get_resources_by_id({rid})", self.client.get_resources_by_id(rid))
        self.expect(by_id is not None and by_id.version == 2, f"{rid} at version 2", by_id)
        missing = await self.call("get_resources_by_id(unknown)", self.client.get_resources_by_id("rs-nope"))
        self.expect(missing is None, "None", missing)
        self.state["resources"] = {rid: 2, UPSERT_RESOURCES_ID: 1}

    async def resources_query(self, rid: str) -> None:
        page = await self.call("query_resources()", self.client.query_resources())
        ids = [r.resources_id for r in page]
        self.expect(ids == [rid, UPSERT_RESOURCES_ID], f"[{rid}, {UPSERT_RESOURCES_ID}] in insertion order", ids)
        self.expect((page.limit, page.offset, page.total) == (-1, 0, 2), "limit -1, offset 0, total 2", page)
        one = await self.call("query_resources(resources_id=)", self.client.query_resources(resources_id=rid))
        self.expect([r.resources_id for r in one] == [rid] and one.total == 1, f"only {rid}", one)
        part = await self.call(
            "query_resources(resources_id_contains='compat')",
            self.client.query_resources(resources_id_contains="compat"),
        )
        self.expect([r.resources_id for r in part] == [UPSERT_RESOURCES_ID], "only the upserted id", part)
        top = await self.call(
            "query_resources(sort_by=version, desc, limit=1)",
            self.client.query_resources(sort_by="version", sort_order="desc", limit=1),
        )
        self.expect([r.resources_id for r in top] == [rid], f"{rid} (version 2) first", top)
        self.expect((top.limit, top.offset, top.total) == (1, 0, 2), "limit 1, offset 0, total 2", top)
        skipped = await self.call(
            "query_resources(sort_by=version, limit=1, offset=1)",
            self.client.query_resources(sort_by="version", limit=1, offset=1),
        )
        self.expect([r.resources_id for r in skipped] == [rid], f"{rid} second in ascending version", skipped)

    async def enqueue(self) -> None:
        config = RolloutConfig(max_attempts=2, retry_condition=["failed"])
        rid = self.state["resources_id"]
        first = await self.call(
            "enqueue_rollout(full)",
            self.client.enqueue_rollout(
                {"task": "retry"}, mode="train", resources_id=rid, config=config, metadata={"origin": "agl"}
            ),
        )
        self.require(type(first) is Rollout, "a Rollout (no attempt)", first)
        self.expect(first.status == "queuing" and first.end_time is None, "status queuing, no end_time", first)
        self.expect(
            (first.input, first.mode, first.resources_id) == ({"task": "retry"}, "train", rid), "fields echoed", first
        )
        self.expect(first.config == config and first.metadata == {"origin": "agl"}, "config/metadata echoed", first)
        plain = await self.call("enqueue_rollout(nulls)", self.client.enqueue_rollout("plain"))
        self.expect(plain.config == RolloutConfig(), "the default config for config=null", plain)
        self.expect(plain.metadata in ({}, None), "metadata {} (reference) or null", plain)
        latest = UPSERT_RESOURCES_ID
        self.expect(
            plain.resources_id == latest, f"resources_id=null filled with the latest resources ({latest})", plain
        )
        if plain.metadata is None:
            self.differ("metadata=null is stored as null; the reference stores {}")
        many = await self.call(
            "enqueue_many_rollouts(3)",
            self.client.enqueue_many_rollouts([EnqueueRolloutRequest(input=i, mode="val") for i in range(3)]),
        )
        self.require(len(many) == 3, "3 rollouts", many)
        self.expect([r.input for r in many] == [0, 1, 2], "request order", many)
        self.expect(all(r.status == "queuing" and r.mode == "val" for r in many), "all queuing, mode val", many)
        empty = await self.call("enqueue_many_rollouts([])", self.client.enqueue_many_rollouts([]))
        self.expect(list(empty) == [], "[]", empty)
        self.state["order"] = [first.rollout_id, plain.rollout_id, *(r.rollout_id for r in many)]
        self.state["rA"], self.state["rB"] = first.rollout_id, plain.rollout_id
        self.state["rC"] = [r.rollout_id for r in many]

    async def dequeue(self) -> None:
        claimed = await self.call("dequeue_rollout(worker_id=agl-w1)", self.client.dequeue_rollout(worker_id="agl-w1"))
        self.require(isinstance(claimed, AttemptedRollout), "an AttemptedRollout", claimed)
        self.expect(claimed.rollout_id == self.state["rA"], f"the first enqueued ({self.state['rA']})", claimed)
        self.expect(claimed.status == "preparing", "rollout status preparing", claimed)
        attempt = claimed.attempt
        self.expect(attempt.sequence_id == 1 and attempt.status == "preparing", "attempt 1, preparing", attempt)
        self.expect(attempt.worker_id == "agl-w1", "attempt worker_id agl-w1", attempt)
        self.state["a1"] = attempt.attempt_id
        worker = await self.call("get_worker_by_id(agl-w1)", self.client.get_worker_by_id("agl-w1"))
        self.require(isinstance(worker, Worker), "a Worker", worker)
        self.expect(worker.status == "busy", "status busy", worker)
        self.expect(worker.current_rollout_id == self.state["rA"], "current_rollout_id = the claimed rollout", worker)
        self.expect(worker.current_attempt_id == attempt.attempt_id, "current_attempt_id = the new attempt", worker)
        self.expect(worker.last_dequeue_time is not None, "last_dequeue_time set", worker)
        two = await self.call(
            "dequeue_many_rollouts(limit=2, worker_id=agl-w2)",
            self.client.dequeue_many_rollouts(limit=2, worker_id="agl-w2"),
        )
        expected = [self.state["rB"], self.state["rC"][0]]
        self.expect([r.rollout_id for r in two] == expected, f"{expected} in queue order", two)

    async def start(self) -> None:
        started = await self.call(
            "start_rollout(worker_id=agl-w3)",
            self.client.start_rollout({"direct": True}, mode="test", metadata={"k": 1}, worker_id="agl-w3"),
        )
        self.require(isinstance(started, AttemptedRollout), "an AttemptedRollout", started)
        self.expect(started.status == "preparing" and started.mode == "test", "preparing, mode test", started)
        self.expect(started.attempt.sequence_id == 1 and started.attempt.worker_id == "agl-w3", "attempt 1", started)
        latest = UPSERT_RESOURCES_ID
        self.expect(started.resources_id == latest, f"resources_id filled with the latest ({latest})", started)
        rid = self.state["rD"] = started.rollout_id
        second = await self.call("start_attempt(worker_id=agl-w3)", self.client.start_attempt(rid, "agl-w3"))
        self.require(isinstance(second, AttemptedRollout), "an AttemptedRollout", second)
        self.expect(second.attempt.sequence_id == 2 and second.status == "preparing", "attempt 2, preparing", second)
        third = await self.call("start_attempt() (no body)", self.client.start_attempt(rid))
        self.expect(third.attempt.sequence_id == 3 and third.attempt.worker_id is None, "attempt 3, no worker", third)
        self.state["rD_attempts"] = [started.attempt.attempt_id, second.attempt.attempt_id, third.attempt.attempt_id]
        await self.call_raises("start_attempt(unknown)", self.client.start_attempt(UNKNOWN))

    async def attempts(self) -> None:
        rid, ids = self.state["rD"], self.state["rD_attempts"]
        page = await self.call("query_attempts(rD)", self.client.query_attempts(rid))
        self.expect([a.attempt_id for a in page] == ids, f"{ids} by sequence_id", page)
        self.expect(all(isinstance(a, Attempt) for a in page) and page.total == 3, "3 Attempts", page)
        last = await self.call(
            "query_attempts(desc, limit=1)", self.client.query_attempts(rid, sort_order="desc", limit=1)
        )
        self.expect([a.sequence_id for a in last] == [3], "[3]", last)
        self.expect((last.limit, last.offset, last.total) == (1, 0, 3), "limit 1, offset 0, total 3", last)
        middle = await self.call(
            "query_attempts(limit=1, offset=1)", self.client.query_attempts(rid, limit=1, offset=1)
        )
        self.expect([a.sequence_id for a in middle] == [2], "[2]", middle)
        latest = await self.call("get_latest_attempt(rD)", self.client.get_latest_attempt(rid))
        self.expect(latest is not None and latest.attempt_id == ids[-1], f"attempt {ids[-1]}", latest)
        unattempted = self.state["rC"][1]
        nothing = await self.call("get_latest_attempt(no attempts)", self.client.get_latest_attempt(unattempted))
        self.expect(nothing is None, "None", nothing)
        unknown = await self.call("get_latest_attempt(unknown)", self.client.get_latest_attempt(UNKNOWN))
        self.expect(unknown is None, "None", unknown)
        old = await self.call(
            "update_attempt(rD, first attempt, status=failed)", self.client.update_attempt(rid, ids[0], status="failed")
        )
        self.expect(old.status == "failed" and old.end_time is not None, "failed with end_time", old)
        rollout = await self.call(
            "get_rollout_by_id(rD) after an old attempt failed", self.client.get_rollout_by_id(rid)
        )
        self.expect(rollout is not None and rollout.status == "preparing", "still preparing (not the latest)", rollout)
        await self.call_raises("query_attempts(sort_by=bogus)", self.client.query_attempts(rid, sort_by="bogus"))
        none = await self.call("query_attempts(unknown rollout)", self.client.query_attempts(UNKNOWN))
        self.expect(len(none) == 0 and none.total == 0, "an empty page (200)", none)

    # Spans ---------------------------------------------------------------------------------------------------

    def otel_spans(self) -> list[ReadableSpan]:
        """Real SDK spans (a parent and a child), as a tracer hands them to ``add_otel_span``."""
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "agl-driver"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("agl-driver")
        with tracer.start_as_current_span("agent.run", attributes={"agent.name": "calc"}) as parent:
            with tracer.start_as_current_span("llm.call", attributes={"gen_ai.request.model": "qwen", "n": 3}):
                pass
            parent.add_event("tool", {"tool.name": "calculator"})
        provider.shutdown()
        return list(exporter.get_finished_spans())

    def hand_span(self, sequence_id: int, span_id: str, name: str) -> Span:
        rid, aid = self.state["rA"], self.state["a1"]
        trace_id = "0" * 31 + "1"
        return Span(
            rollout_id=rid,
            attempt_id=aid,
            sequence_id=sequence_id,
            trace_id=trace_id,
            span_id=span_id,
            parent_id=None,
            name=name,
            status=TraceStatus(status_code="OK"),
            attributes={"k": "v", "n": 1, "list": [1, 2]},
            events=[],
            links=[],
            start_time=1_700_000_000.0 + sequence_id,
            end_time=1_700_000_000.5 + sequence_id,
            context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_state={}),
            parent=None,
            resource=OtelResource(attributes={"service.name": "agl-driver"}, schema_url=""),
            custom_extra={"kept": True},
        )

    def same_span(self, got: Any, sent: Span) -> bool:
        return isinstance(got, Span) and got.model_dump(mode="json") == sent.model_dump(mode="json")

    async def spans(self) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        first_id = await self.call("get_next_span_sequence_id()", self.client.get_next_span_sequence_id(rid, aid))
        self.expect(first_id == 1, "1 for a rollout without spans", first_id)
        s1 = self.hand_span(first_id, "00000000000000a1", "hand.span")
        added = await self.call("add_span(hand-built, with an extra key)", self.client.add_span(s1))
        self.expect(self.same_span(added, s1), f"the span echoed with its extras: {short(s1)}", added)
        attempt = await self.call("get_latest_attempt(rA) after a span", self.client.get_latest_attempt(rid))
        self.expect(attempt is not None and attempt.status == "running", "the attempt running after a span", attempt)
        beat = None if attempt is None else attempt.last_heartbeat_time
        self.expect(beat is not None, "last_heartbeat_time set by a span", attempt)
        rollout = await self.call("get_rollout_by_id(rA) after a span", self.client.get_rollout_by_id(rid))
        self.expect(rollout is not None and rollout.status == "running", "the rollout running after a span", rollout)
        await self.spans_many(s1)
        await self.spans_otel()

    async def spans_many(self, s1: Span) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        numbers = await self.call(
            "get_many_span_sequence_ids(2)", self.client.get_many_span_sequence_ids([(rid, aid), (rid, aid)])
        )
        self.expect(list(numbers) == [2, 3], "[2, 3]", numbers)
        batch = [self.hand_span(n, f"00000000000000b{n}", f"batch.{n}") for n in numbers]
        added = await self.call("add_many_spans(2 new + 1 duplicate)", self.client.add_many_spans([*batch, s1]))
        self.expect(
            [s.span_id for s in added] == [s.span_id for s in batch], "only the 2 new spans (duplicate -> null)", added
        )
        if not self.http.since(self._mark) or self.http.since(self._mark)[-1]["status"] != 201:
            self.differ("a duplicate span is not answered 201 null, as the reference does")
        jump = self.hand_span(50, "00000000000000c5", "jump.span")
        await self.call("add_span(sequence_id=50)", self.client.add_span(jump))
        after = await self.call("get_next_span_sequence_id() after 50", self.client.get_next_span_sequence_id(rid, aid))
        self.expect(after == 51, "51: the counter is raised to the largest stored sequence_id", after)
        latest = await self.call(
            "get_next_span_sequence_id(latest)", self.client.get_next_span_sequence_id(rid, "latest")
        )
        self.expect(latest == 52, "52: the same counter, for the rollout's latest attempt", latest)
        self.state["hand_spans"] = 4

    async def spans_otel(self) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        child, parent = self.otel_spans()  # the child ends (and is exported) first
        explicit = await self.call(
            "add_otel_span(sequence_id=60)", self.client.add_otel_span(rid, aid, child, sequence_id=60)
        )
        self.require(isinstance(explicit, Span), "a Span", explicit)
        self.expect(explicit.sequence_id == 60 and explicit.name == "llm.call", "sequence 60, name llm.call", explicit)
        sent = Span.from_opentelemetry(child, rollout_id=rid, attempt_id=aid, sequence_id=60)
        self.expect(self.same_span(explicit, sent), f"the span echoed with its extras: {short(sent)}", explicit)
        allocated = await self.call("add_otel_span(allocated)", self.client.add_otel_span(rid, aid, parent))
        self.expect(allocated is not None and allocated.sequence_id == 61, "sequence 61 from the counter", allocated)
        self.expect(
            allocated is not None and [e.name for e in allocated.events] == ["tool"], "the event kept", allocated
        )
        self.state["otel_spans"] = 2

    def export_otlp(self, rollout_id: str, attempt_id: str) -> list[SpanExportResult]:
        """Through real OTLP/HTTP exporters, each span exported as it ends: a parent and a child; one span gzipped;
        one span whose resource has no rollout or attempt id (the server drops it and still answers 200)."""
        ids = {"agentlightning.rollout_id": rollout_id, "agentlightning.attempt_id": attempt_id}
        results: list[SpanExportResult] = []
        with self.tracer(ids, results) as tracer, tracer.start_as_current_span("otlp.parent", attributes={"step": 1}):
            child_attributes = {"agentlightning.span_sequence_id": str(OTLP_CHILD_SEQUENCE_ID), "x": 1.5}
            with tracer.start_as_current_span("otlp.child", attributes=child_attributes):
                pass
        with self.tracer(ids, results, compression=Compression.Gzip) as tracer:
            tracer.start_span("otlp.gzip").end()
        with self.tracer({"service.name": "no-ids"}, results) as tracer:
            tracer.start_span("orphan.span").end()
        return results

    @contextlib.contextmanager
    def tracer(self, resource: dict[str, Any], results: list[SpanExportResult], **options: Any) -> Iterator[Any]:
        exporter = OTLPSpanExporter(endpoint=self.client.otlp_traces_endpoint(), timeout=10, **options)
        provider = TracerProvider(resource=Resource.create(resource))
        provider.add_span_processor(_Recording(exporter, results))
        try:
            yield provider.get_tracer("agl-driver-otlp")
        finally:
            provider.shutdown()

    async def otlp(self) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        self._call, self._mark = "OTLPSpanExporter.export -> /v1/traces", self.http.mark()
        results = await asyncio.to_thread(self.export_otlp, rid, aid)
        self.expect(results == [SpanExportResult.SUCCESS] * 4, "four successful exports", [r.name for r in results])
        page = await self.call(
            "query_spans(rA, name_contains=otlp.)", self.client.query_spans(rid, name_contains="otlp.")
        )
        by_name = {s.name: s for s in page}
        expected = {"otlp.parent", "otlp.child", "otlp.gzip"}
        self.require(set(by_name) == expected, f"the OTLP spans {sorted(expected)} stored", page)
        child, parent = by_name["otlp.child"], by_name["otlp.parent"]
        self.expect(child.sequence_id == OTLP_CHILD_SEQUENCE_ID, "the child's span_sequence_id attribute", child)
        self.expect(parent.sequence_id > OTLP_CHILD_SEQUENCE_ID, f"the parent after {OTLP_CHILD_SEQUENCE_ID}", parent)
        self.expect(child.parent_id == parent.span_id, "child.parent_id = parent.span_id", child)
        self.expect(child.resource.attributes.get("agentlightning.rollout_id") == rid, "resource kept", child)
        self.expect(child.attributes.get("x") == 1.5, "span attributes kept", child)
        self.expect(parent.status.status_code == "UNSET", "status UNSET", parent)
        self.state["otlp_spans"] = 3

    async def span_queries(self) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        total = self.state["hand_spans"] + self.state["otel_spans"] + self.state.get("otlp_spans", 0)
        page = await self.call("query_spans(rA)", self.client.query_spans(rid))
        numbers = [s.sequence_id for s in page]
        self.expect(len(page) == total and page.total == total, f"{total} spans", page)
        self.expect(numbers == sorted(numbers), "ascending sequence_id", numbers)
        latest = await self.call("query_spans(rA, 'latest')", self.client.query_spans(rid, "latest"))
        self.expect(len(latest) == total, f"{total} spans on the latest attempt", latest)
        exact = await self.call(
            "query_spans(attempt, name='batch.2')", self.client.query_spans(rid, aid, name="batch.2")
        )
        self.expect([s.name for s in exact] == ["batch.2"], "['batch.2']", exact)
        either = await self.call(
            "query_spans(name=, span_id=, filter_logic=or)",
            self.client.query_spans(rid, name="hand.span", span_id="00000000000000b3", filter_logic="or"),
        )
        self.expect({s.name for s in either} == {"hand.span", "batch.3"}, "hand.span and batch.3", either)
        both = await self.call(
            "query_spans(name=, span_id=, filter_logic=and)",
            self.client.query_spans(rid, name="hand.span", span_id="00000000000000b3"),
        )
        self.expect(len(both) == 0, "no span (both must match)", both)
        await self.span_queries_more(rid, total)

    async def span_queries_more(self, rid: str, total: int) -> None:
        trace = await self.call("query_spans(trace_id=)", self.client.query_spans(rid, trace_id="0" * 31 + "1"))
        self.expect(len(trace) == self.state["hand_spans"], "the hand-built spans", trace)
        contains = await self.call(
            "query_spans(span_id_contains=b)", self.client.query_spans(rid, span_id_contains="00000000000000b")
        )
        self.expect(len(contains) == 2, "2 batch spans", contains)
        no_parent = await self.call("query_spans(parent_id=zz)", self.client.query_spans(rid, parent_id="zz"))
        self.expect(len(no_parent) == 0, "no span", no_parent)
        window = await self.call("query_spans(limit=2, offset=1)", self.client.query_spans(rid, limit=2, offset=1))
        self.expect([s.sequence_id for s in window] == [2, 3], "sequence ids [2, 3]", window)
        self.expect((window.limit, window.offset, window.total) == (2, 1, total), f"2, 1, {total}", window)
        newest = await self.call(
            "query_spans(sort_by=start_time, desc)",
            self.client.query_spans(rid, sort_by="start_time", sort_order="desc", limit=1),
        )
        self.expect(len(newest) == 1, "one span", newest)
        await self.call_raises("query_spans(sort_by=bogus)", self.client.query_spans(rid, sort_by="bogus"), status=400)
        none = await self.call("query_spans(unknown rollout)", self.client.query_spans(UNKNOWN))
        self.expect(len(none) == 0 and none.total == 0, "an empty page (200)", none)

    async def span_unknown_attempt(self) -> None:
        rid = self.state["rA"]
        none = await self.call("query_spans(rA, unknown attempt)", self.client.query_spans(rid, "at-nope"))
        self.expect(len(none) == 0 and none.total == 0, "an empty page (200)", none)

    async def span_unknown_sequence(self) -> None:
        # A deliberate difference: the reference allocates 1 for ids it never checks; store serve answers 404,
        # since a sequence id for an attempt that does not exist is a caller's mistake. Either passes here.
        await self.call_raises(
            "get_next_span_sequence_id(unknown rollout, unknown attempt)",
            self.client.get_next_span_sequence_id(UNKNOWN, "at-nope"),
            lenient="allocated a number for unknown ids (the reference's behaviour; store serve answers 404)",
        )

    # Updates ---------------------------------------------------------------------------------------------------

    async def update_attempts(self) -> None:
        rid, aid = self.state["rA"], self.state["a1"]
        beat = time.time()
        updated = await self.call(
            "update_attempt(status=running, worker_id, last_heartbeat_time, metadata)",
            self.client.update_attempt(
                rid, aid, status="running", worker_id="agl-w1", last_heartbeat_time=beat, metadata={"step": 1}
            ),
        )
        self.require(isinstance(updated, Attempt), "an Attempt", updated)
        self.expect(updated.status == "running" and updated.metadata == {"step": 1}, "running, metadata", updated)
        self.expect(abs((updated.last_heartbeat_time or 0) - beat) < 1e-3, f"last_heartbeat_time {beat}", updated)
        failed = await self.call(
            "update_attempt(latest, status=failed)", self.client.update_attempt(rid, "latest", status="failed")
        )
        self.expect(failed.status == "failed" and failed.end_time is not None, "failed with end_time", failed)
        rollout = await self.call("get_rollout_by_id(rA) after a retryable failure", self.client.get_rollout_by_id(rid))
        self.expect(rollout is not None and rollout.status == "requeuing", "requeuing (1 of 2 attempts)", rollout)
        worker = await self.call("get_worker_by_id(agl-w1) after failure", self.client.get_worker_by_id("agl-w1"))
        self.expect(worker is not None and worker.status == "idle", "idle after its attempt failed", worker)
        await self.retry(rid)

    async def retry(self, rid: str) -> None:
        claimed = await self.call(
            "dequeue_many_rollouts(limit=10, worker_id=agl-w1)",
            self.client.dequeue_many_rollouts(limit=10, worker_id="agl-w1"),
        )
        expected = {*self.state["rC"][1:], rid}
        self.expect({r.rollout_id for r in claimed} == expected, f"{sorted(expected)}", claimed)
        again = next((r for r in claimed if r.rollout_id == rid), None)
        self.require(again is not None, f"{rid} requeued", claimed)
        self.expect(again.attempt.sequence_id == 2, "attempt 2", again)
        final = await self.call(
            "update_attempt(latest, status=failed) at max_attempts",
            self.client.update_attempt(rid, "latest", status="failed"),
        )
        self.expect(final.sequence_id == 2, "attempt 2", final)
        rollout = await self.call("get_rollout_by_id(rA) after the last attempt", self.client.get_rollout_by_id(rid))
        self.expect(rollout is not None and rollout.status == "failed", "failed (no attempts left)", rollout)
        self.expect(rollout is not None and rollout.end_time is not None, "end_time set", rollout)
        done = await self.call(
            "update_attempt(rD, latest, succeeded)", self.client.update_attempt(self.state["rD"], "latest", "succeeded")
        )
        self.expect(done.status == "succeeded" and done.end_time is not None, "succeeded with end_time", done)
        await self.update_attempt_errors(rid)

    async def update_attempt_errors(self, rid: str) -> None:
        await self.call_raises(
            "update_attempt(metadata=None)", self.client.update_attempt(rid, "latest", metadata=None), status=400
        )
        await self.call_raises(
            "update_attempt(unknown attempt)", self.client.update_attempt(rid, "at-nope", status="running")
        )

    async def update_rollouts(self) -> None:
        rb, rc = self.state["rB"], self.state["rC"][0]
        cancelled = await self.call(
            "update_rollout(status=cancelled)", self.client.update_rollout(rb, status="cancelled")
        )
        self.require(type(cancelled) is Rollout, "a Rollout", cancelled)
        self.expect(
            cancelled.status == "cancelled" and cancelled.end_time is not None, "cancelled, end_time", cancelled
        )
        last = self.http.since(self._mark)[-1]
        if '"attempt"' in last["response"]:
            self.differ("the answer has an 'attempt' key; the reference answers a plain Rollout")
        cleared = await self.call("update_rollout(metadata=None)", self.client.update_rollout(rc, metadata=None))
        self.expect(cleared.metadata is None, "metadata None", cleared)
        config = RolloutConfig(timeout_seconds=30.0, max_attempts=3, retry_condition=["timeout"])
        configured = await self.call("update_rollout(config=)", self.client.update_rollout(rc, config=config))
        self.expect(configured.config == config, f"config {short(config)}", configured)
        changed = await self.call(
            "update_rollout(input=, mode=None, resources_id=None)",
            self.client.update_rollout(rc, input={"new": 1}, mode=None, resources_id=None),
        )
        self.expect(changed.input == {"new": 1} and changed.mode is None, "input replaced, mode None", changed)
        self.expect(changed.config == config and changed.metadata is None, "other fields kept", changed)
        same = await self.call("update_rollout() (empty body)", self.client.update_rollout(rc))
        self.expect(same.input == {"new": 1} and same.config == config, "nothing changed", same)
        await self.call_raises("update_rollout(unknown)", self.client.update_rollout(UNKNOWN, status="failed"))

    async def get_rollouts(self) -> None:
        fresh = await self.call("enqueue_rollout(rE)", self.client.enqueue_rollout({"late": True}))
        self.state["rE"] = fresh.rollout_id
        plain = await self.call("get_rollout_by_id(no attempt)", self.client.get_rollout_by_id(fresh.rollout_id))
        self.expect(type(plain) is Rollout, "a Rollout (no 'attempt' key)", plain)
        rid = self.state["rD"]
        attempted = await self.call("get_rollout_by_id(attempted)", self.client.get_rollout_by_id(rid))
        self.require(isinstance(attempted, AttemptedRollout), "an AttemptedRollout", attempted)
        self.expect(attempted.attempt.sequence_id == 3, "the latest attempt (3)", attempted)
        self.expect(attempted.status == "succeeded", "succeeded", attempted)
        unknown = await self.call("get_rollout_by_id(unknown)", self.client.get_rollout_by_id(UNKNOWN))
        self.expect(unknown is None, "None", unknown)

    async def query_rollouts(self) -> None:
        order = [*self.state["order"], self.state["rD"], self.state["rE"]]
        page = await self.call("query_rollouts()", self.client.query_rollouts())
        self.expect([r.rollout_id for r in page] == order, f"{order} (insertion order)", page)
        self.expect((page.limit, page.offset, page.total) == (-1, 0, len(order)), f"-1, 0, {len(order)}", page)
        kinds = {r.rollout_id: type(r).__name__ for r in page}
        expected_kinds = {rid: "AttemptedRollout" for rid in order} | {self.state["rE"]: "Rollout"}
        self.expect(kinds == expected_kinds, f"{expected_kinds}", kinds)
        direct = next((r for r in page if r.rollout_id == self.state["rD"]), None)
        latest = None if direct is None else getattr(direct, "attempt", None)
        self.expect(latest is not None and latest.sequence_id == 3, "rD with its latest attempt (3)", direct)
        finished = [self.state["rA"], self.state["rD"]]
        by_status = await self.call(
            "query_rollouts(status_in=[failed, succeeded])",
            self.client.query_rollouts(status_in=["failed", "succeeded"]),
        )
        self.expect([r.rollout_id for r in by_status] == finished, f"{finished}", by_status)
        legacy = await self.call(
            "query_rollouts(status=[...]) (deprecated)", self.client.query_rollouts(status=["failed", "succeeded"])
        )
        self.expect([r.rollout_id for r in legacy] == finished, f"{finished}", legacy)
        await self.query_rollouts_more(order)

    async def query_rollouts_more(self, order: list[str]) -> None:
        two = [self.state["rA"], self.state["rE"]]
        by_id = await self.call("query_rollouts(rollout_id_in=)", self.client.query_rollouts(rollout_id_in=two))
        self.expect([r.rollout_id for r in by_id] == two, f"{two}", by_id)
        legacy = await self.call(
            "query_rollouts(rollout_ids=) (deprecated)", self.client.query_rollouts(rollout_ids=two)
        )
        self.expect([r.rollout_id for r in legacy] == two, f"{two}", legacy)
        part = self.state["rA"][-6:]
        contains = await self.call(
            "query_rollouts(rollout_id_contains=)", self.client.query_rollouts(rollout_id_contains=part)
        )
        self.expect(self.state["rA"] in [r.rollout_id for r in contains], f"{self.state['rA']} included", contains)
        either = await self.call(
            "query_rollouts(status_in=[cancelled], rollout_id_in=[rE], filter_logic=or)",
            self.client.query_rollouts(status_in=["cancelled"], rollout_id_in=[self.state["rE"]], filter_logic="or"),
        )
        expected = [self.state["rB"], self.state["rE"]]
        self.expect([r.rollout_id for r in either] == expected, f"{expected}", either)
        window = await self.call(
            "query_rollouts(sort_by=start_time, desc, limit=3, offset=1)",
            self.client.query_rollouts(sort_by="start_time", sort_order="desc", limit=3, offset=1),
        )
        times = [r.start_time for r in window]
        self.expect(len(window) == 3 and times == sorted(times, reverse=True), "3 rollouts, newest first", window)
        self.expect((window.limit, window.offset, window.total) == (3, 1, len(order)), f"3, 1, {len(order)}", window)
        await self.call_raises("query_rollouts(sort_by=bogus)", self.client.query_rollouts(sort_by="bogus"), status=400)
        await self.call_raises("query_rollouts(limit=0)", self.client.query_rollouts(limit=0), status=400)
        await self.call_raises("query_rollouts(offset=-1)", self.client.query_rollouts(offset=-1), status=400)
        await self.call_raises("query_workers(sort_by=bogus)", self.client.query_workers(sort_by="bogus"), status=400)
        await self.call_raises(
            "query_resources(sort_by=bogus)", self.client.query_resources(sort_by="bogus"), status=400
        )

    async def workers(self) -> None:
        page = await self.call("query_workers()", self.client.query_workers())
        ids = {w.worker_id for w in page}
        self.expect({"agl-w1", "agl-w2", "agl-w3"} <= ids, "agl-w1, agl-w2 and agl-w3", page)
        self.expect((page.limit, page.offset, page.total) == (-1, 0, len(page)), "limit -1, offset 0, total", page)
        busy = await self.call("query_workers(status_in=[busy])", self.client.query_workers(status_in=["busy"]))
        self.expect(len(busy) > 0 and all(w.status == "busy" for w in busy), "only busy workers", busy)
        named = await self.call(
            "query_workers(worker_id_contains=w, sort_by=worker_id, desc)",
            self.client.query_workers(worker_id_contains="agl-w", sort_by="worker_id", sort_order="desc"),
        )
        self.expect([w.worker_id for w in named] == ["agl-w3", "agl-w2", "agl-w1"], "w3, w2, w1", named)
        beat = await self.call(
            "update_worker(agl-hb, heartbeat_stats=) (upsert)",
            self.client.update_worker("agl-hb", heartbeat_stats={"gpu": 0.5}),
        )
        self.require(isinstance(beat, Worker), "a Worker", beat)
        self.expect(beat.heartbeat_stats == {"gpu": 0.5} and beat.last_heartbeat_time, "stats and heartbeat", beat)
        again = await self.call("update_worker(agl-hb) (no body)", self.client.update_worker("agl-hb"))
        self.expect(again.heartbeat_stats == {"gpu": 0.5}, "stats kept", again)
        self.expect((again.last_heartbeat_time or 0) >= (beat.last_heartbeat_time or 0), "heartbeat refreshed", again)
        found = await self.call("get_worker_by_id(agl-hb)", self.client.get_worker_by_id("agl-hb"))
        self.expect(found is not None and found.heartbeat_stats == {"gpu": 0.5}, "the upserted worker", found)
        unknown = await self.call("get_worker_by_id(unknown)", self.client.get_worker_by_id("agl-nobody"))
        self.expect(unknown is None, "None", unknown)
        self.state["workers"] = ["agl-w1", "agl-w2", "agl-w3", "agl-hb"]

    async def waits(self) -> None:
        ids = [self.state["rA"], self.state["rD"], self.state["rE"]]
        finished = [self.state["rA"], self.state["rD"]]
        started = time.monotonic()
        done = await self.call(
            "wait_for_rollouts(timeout=0.1)", self.client.wait_for_rollouts(rollout_ids=ids, timeout=0.1)
        )
        self.expect([r.rollout_id for r in done] == finished, f"{finished} (finished only, in order)", done)
        self.expect(time.monotonic() - started < 5, "an answer within about 0.1 s", time.monotonic() - started)
        self.expect(all(type(r) is Rollout for r in done), "plain Rollouts", done)
        now = await self.call("wait_for_rollouts(timeout=0)", self.client.wait_for_rollouts(rollout_ids=ids, timeout=0))
        self.expect([r.rollout_id for r in now] == finished, f"{finished}", now)
        try:
            await self.client.wait_for_rollouts(rollout_ids=ids, timeout=1.0)
            self.fail("timeout=1.0 was not refused by the client")
        except ValueError:
            pass
        rid = self.state["rA"]
        known = await self.call(
            "wait_for_rollouts([rA, unknown], timeout=0)",
            self.client.wait_for_rollouts(rollout_ids=[rid, UNKNOWN], timeout=0),
        )
        self.expect([r.rollout_id for r in known] == [rid], f"[{rid}] (unknown ids skipped)", known)

    async def dequeue_empty(self) -> None:
        rE = self.state["rE"]
        claimed = await self.call("dequeue_rollout() (rE left)", self.client.dequeue_rollout())
        self.expect(claimed is not None and claimed.rollout_id == rE, f"{rE}", claimed)
        self.expect(claimed is not None and claimed.attempt.worker_id is None, "no worker", claimed)
        before = time.time()
        empty = await self.call("dequeue_rollout() (empty queue)", self.client.dequeue_rollout(worker_id="agl-w2"))
        self.expect(empty is None, "None", empty)
        worker = await self.call(
            "get_worker_by_id(agl-w2) after an empty dequeue", self.client.get_worker_by_id("agl-w2")
        )
        self.expect(worker is not None and worker.status == "idle", "idle (nothing to run)", worker)
        dequeued = None if worker is None else worker.last_dequeue_time
        self.expect(dequeued is not None and dequeued >= before - 1, "last_dequeue_time refreshed", worker)
        none = await self.call("dequeue_many_rollouts(limit=3) (empty)", self.client.dequeue_many_rollouts(limit=3))
        self.expect(list(none) == [], "[]", none)
        self.state["rE_attempts"] = 1

    async def enqueue_unknown_resources(self) -> None:
        """Agent Lightning does not check that a rollout's resources_id exists (nor do the next two steps)."""
        created = await self.call(
            "enqueue_rollout(resources_id=unknown)", self.client.enqueue_rollout("x", resources_id="rs-unknown")
        )
        self.state["created"] += 1
        self.expect(created.resources_id == "rs-unknown", "the rollout, with resources_id rs-unknown", created)

    async def update_unknown_resources(self) -> None:
        changed = await self.call(
            "update_rollout(rE, resources_id=unknown)",
            self.client.update_rollout(self.state["rE"], resources_id="rs-unknown-2"),
        )
        self.expect(changed.resources_id == "rs-unknown-2", "resources_id rs-unknown-2", changed)

    async def start_unknown_resources(self) -> None:
        started = await self.call(
            "start_rollout(resources_id=unknown)", self.client.start_rollout("y", resources_id="rs-unknown-3")
        )
        self.state["created"] += 1
        self.state["created_attempts"] += 1
        self.expect(started.resources_id == "rs-unknown-3", "resources_id rs-unknown-3", started)

    async def statistics(self) -> None:
        stats = await self.call("statistics()", self.client.statistics())
        self.require(isinstance(stats, dict), "a JSON object", stats)
        expected = {
            "total_rollouts": self.state["created"],
            "total_attempts": self.state["created_attempts"],
            "total_resources": 2,
            "total_workers": 4,
        }
        for key, value in expected.items():
            if key not in stats:
                self.differ(f"no '{key}' key (the reference has total_rollouts/attempts/spans/resources/workers)")
            else:
                self.expect(stats[key] == value, f"{key} = {value}", stats)
        self.state["statistics"] = stats

    # Run -----------------------------------------------------------------------------------------------------

    def uncovered(self) -> list[str]:
        methods = {
            name
            for name, fn in inspect.getmembers(LightningStoreClient)
            if inspect.iscoroutinefunction(fn) and not name.startswith("_") and name not in NOT_SENT
        }
        return sorted(methods - set(self.calls))

    def final_state(self) -> dict[str, Any]:
        s = self.state
        rollouts = {
            s.get("rA"): {"status": "failed", "attempts": 2},
            s.get("rB"): {"status": "cancelled", "attempts": 1},
            s.get("rD"): {"status": "succeeded", "attempts": 3},
            s.get("rE"): {"status": "preparing", "attempts": 1},
        }
        spans = s.get("hand_spans", 0) + s.get("otel_spans", 0) + s.get("otlp_spans", 0)
        return {
            "rollouts": {k: v for k, v in rollouts.items() if k},
            "rollout_count": s.get("created"),
            "spans": {"rollout_id": s.get("rA"), "attempt_id": s.get("a1"), "count": spans},
            "resources": s.get("resources", {}),
            "workers": s.get("workers", []),
        }

    async def run(self) -> bool:
        await self.install_tracing()
        steps = [
            ("health", self.health),
            ("resources", self.resources),
            ("enqueue", self.enqueue),
            ("dequeue", self.dequeue),
            ("start_rollout/start_attempt", self.start),
            ("attempts", self.attempts),
            ("spans", self.spans),
            ("otlp", self.otlp),
            ("query_spans", self.span_queries),
            ("query_spans, unknown attempt", self.span_unknown_attempt),
            ("spans/next, unknown ids", self.span_unknown_sequence),
            ("update_attempt", self.update_attempts),
            ("update_rollout", self.update_rollouts),
            ("get_rollout_by_id", self.get_rollouts),
            ("query_rollouts", self.query_rollouts),
            ("workers", self.workers),
            ("wait_for_rollouts", self.waits),
            ("dequeue (drain)", self.dequeue_empty),
            ("enqueue, unknown resources", self.enqueue_unknown_resources),
            ("update_rollout, unknown resources", self.update_unknown_resources),
            ("start_rollout, unknown resources", self.start_unknown_resources),
            ("statistics", self.statistics),
        ]
        for name, body in steps:
            await self.step(name, body)
        for name in self.uncovered():
            self.failures.append(f"[coverage] client method {name} was never called")
        await self.client.close()
        return not self.failures


def _get_json(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, json.loads(response.read())


class _Recording(SimpleSpanProcessor):
    """Exports each span as it ends (so the child goes first) and records the exporter's result."""

    def __init__(self, exporter: OTLPSpanExporter, results: list[SpanExportResult]) -> None:
        super().__init__(exporter)
        self._exporter = exporter
        self._results = results

    def on_end(self, span: ReadableSpan) -> None:
        self._results.append(self._exporter.export([span]))


def main(argv: list[str]) -> int:
    # The client logs each swallowed error with a traceback; the driver reports them itself, more precisely.
    logging.getLogger("agentlightning").setLevel(logging.CRITICAL)
    if len(argv) != 2:
        print("usage: agl_driver.py SERVER_ROOT_URL", file=sys.stderr)
        return 2
    driver = Driver(argv[1])
    ok = asyncio.run(driver.run())
    for failure in driver.failures:
        print(f"FAIL {failure}", file=sys.stderr)
    for difference in driver.differences:
        print(f"DIFF {difference}", file=sys.stderr)
    summary = {
        "ok": ok,
        "failures": driver.failures,
        "differences": driver.differences,
        "calls": driver.calls,
        "state": driver.final_state(),
    }
    print(json.dumps(summary, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
