"""``HttpStore``: the store contract over HTTP, so that code takes "a store" and cannot tell which.

Transport rules: one request per call (batch calls included); connection failures and 503 answers are retried
with backoff — every request when the connection could not be opened (nothing was sent) or the 503 says nothing
was written, and idempotent ones (reads, updates, span writes and sequence numbers, enqueues) also when the answer
was lost or the 503 says the write may have been done (``maybe_written``: the database went away during its
commit). A non-idempotent request (start a rollout or an attempt, claim, add resources) is then not sent again:
its 503 is raised, as ``httpx.HTTPStatusError``, and the caller looks before it acts again. An enqueue is made
idempotent by naming each rollout the caller did not name (:func:`retry_safe_id`). Long waits are split into
long-polls of at most ``MAX_LONG_POLL_SECONDS``. Errors come back typed: 404 → ``NotFoundError``, 409 →
``ConflictError``, other 4xx → ``InvalidRequestError`` (401 → ``UnauthorizedError``), each with the server's
``field``. Failures to reach the server are httpx's (``httpx.TransportError``; a 5xx ``httpx.HTTPStatusError``).
The requests go straight to aiohttp's connection pool (:mod:`lightning_store.client.transport`), with httpx's errors.

Over 400 lines on purpose: one class, the contract's methods in the contract's order, each a few lines mapping one
call to one route; split, a reader would have to look in several files for one contract.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from json import loads as json_loads
from typing import Any
from urllib.parse import quote

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from pydantic import TypeAdapter

from lightning_store.client.transport import JsonTransport, encode_json
from lightning_store.contract import UNSET, StoreStatistics, Unset
from lightning_store.errors import ConflictError, InvalidRequestError, NotFoundError, StoreError, UnauthorizedError
from lightning_store.llm_calls import LlmCall
from lightning_store.models import (
    Attempt,
    AttemptedRollout,
    AttemptEnd,
    AttemptStatus,
    Claim,
    EnqueueRolloutRequest,
    FilterLogic,
    PaginatedResult,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    SortOrder,
    TaskInput,
    Worker,
    WorkerStatus,
)
from lightning_store.resources import NamedResources, ResourcesUpdate
from lightning_store.server.wire import MAX_LONG_POLL_SECONDS
from lightning_store.spans import Span

RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Backoff before each retry: about 15 s in all, so that a server restarting on a loaded machine (stop, start,
migration check) is found again; a runner's stop does not wait on them (``runners.attempts.RELEASE_SECONDS``)."""
_SPANS: TypeAdapter[list[Span]] = TypeAdapter(list[Span])
NOT_SENT = (httpx.ConnectError,)
"""The connection could not be opened: the request never left, so any request may be sent again."""
ANSWER_LOST = (httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError)
"""The request may have reached the server: only an idempotent one is sent again."""


def _maybe_written(answer: bytes) -> bool:
    """Whether a 503 says the request's write may have been done (the database went away while it committed:
    :mod:`lightning_store.sql.commit_mark`). A 503 without the key (a proxy in front of the server) did nothing."""
    try:
        body = json_loads(answer)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("maybe_written") is True


def retry_safe_id() -> str:
    """The id the client gives a rollout enqueued without one, so that sending the enqueue again is safe (an
    existing rollout of that id is returned unchanged). Longer than the server's ids (80 random bits against 48):
    two clients must never pick the same one, since the second would be handed the first one's rollout."""
    return f"ro-{secrets.token_hex(10)}"


def _rollout(data: dict[str, Any]) -> Rollout:
    return AttemptedRollout.model_validate(data) if "attempt" in data else Rollout.model_validate(data)


def _id(value: str, field: str) -> str:
    """An id as one URL path segment; an empty id is refused here (it would name another route)."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field} must be a non-empty string", field=field)
    return quote(value, safe="")


def _set(**fields: Any) -> dict[str, Any]:
    """Only the fields that are not UNSET: an absent key leaves the stored value alone."""
    return {name: value for name, value in fields.items() if value is not UNSET}


class HttpStore:
    """A client of ``store serve``. ``base_url`` is the server root, e.g. ``http://127.0.0.1:4747``."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = JsonTransport(
            base_url, headers=headers, read_timeout=timeout + MAX_LONG_POLL_SECONDS, connect_timeout=5.0
        )

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool = False,
    ) -> Any:
        """``content``: a body already encoded as JSON."""
        body = content if content is not None or json is None else encode_json(json)
        for attempt, delay in enumerate((0.0, *RETRY_DELAYS)):
            if delay:
                await asyncio.sleep(delay)
            last = attempt == len(RETRY_DELAYS)
            try:
                status, answer = await self._http.send(method, path, body=body, params=params)
            except NOT_SENT:
                if last:
                    raise
                continue
            except ANSWER_LOST:
                if last or not idempotent:
                    raise
                continue
            if status == 503 and not last and (idempotent or not _maybe_written(answer)):
                continue
            if status < 300:
                return json_loads(answer)
            raise self._error(method, path, status, answer)
        raise AssertionError("unreachable")

    def _error(self, method: str, path: str, status: int, answer: bytes) -> Exception:
        """The error an answer of ``status`` (300 or more) means: typed for a 4xx, httpx's for a 5xx."""
        if status >= 500:
            return self._http.status_error(method, path, status, answer)
        try:
            body = json_loads(answer)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"detail": answer.decode(errors="replace")}
        detail, field = str(body.get("detail")), body.get("field")
        if status == 404:
            return NotFoundError(detail, field=field)
        if status == 401:
            return UnauthorizedError(detail, field=field)
        if status == 409:
            return ConflictError(detail, field=field)
        return InvalidRequestError(detail, field=field)

    async def close(self) -> None:
        await self._http.close()

    async def health(self) -> bool:
        try:
            status, _ = await self._http.send("GET", "/v1/agl/health")
            return status == 200
        except httpx.HTTPError:
            return False

    async def run_sql(self, query: str, *, timeout: float = 30.0, max_rows: int = 10_000) -> dict[str, Any]:
        """``POST /v1/sql`` (an addition; not in the store contract): one read-only statement, answered as
        ``{"columns", "rows", "truncated", "warnings"}`` (docs/reference/http.md). A statement that fails is an
        :class:`InvalidRequestError` with the database's message (field ``query``)."""
        body = {"query": query, "timeout": timeout, "max_rows": max_rows}
        data: dict[str, Any] = await self._call("POST", "/v1/sql", json=body, idempotent=True)
        return data

    async def statistics(self) -> StoreStatistics:
        data: StoreStatistics = await self._call("GET", "/v1/agl/statistics", idempotent=True)
        return data

    # Rollouts --------------------------------------------------------------------------------------------

    async def start_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> AttemptedRollout:
        body = {
            "input": input,
            "mode": mode,
            "resources_id": resources_id,
            "metadata": metadata,
            "config": None if config is None else RolloutConfig.model_validate(config).model_dump(mode="json"),
            "worker_id": worker_id,
        }
        return AttemptedRollout.model_validate(await self._call("POST", "/v1/agl/rollouts", json=body))

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Rollout:
        request = {
            "input": input,
            "mode": mode,
            "resources_id": resources_id,
            "metadata": metadata,
            "config": config.model_dump(mode="json") if isinstance(config, RolloutConfig) else config,
        }
        request["rollout_id"] = rollout_id if rollout_id is not None else retry_safe_id()
        try:
            return (await self._enqueue([request]))[0]
        except StoreError as exc:
            # One rollout: name its fields as the arguments of this method, not as items of a batch.
            exc.field = exc.field.removeprefix("rollouts.0.") if exc.field else exc.field
            raise

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        if not rollouts:
            return []
        requests = [
            r.model_dump(mode="json", exclude_none=True) if isinstance(r, EnqueueRolloutRequest) else r
            for r in rollouts
        ]
        named = [
            {**r, "rollout_id": retry_safe_id()} if isinstance(r, dict) and r.get("rollout_id") is None else r
            for r in requests
        ]
        return await self._enqueue(named)

    async def _enqueue(self, requests: list[Any]) -> list[Rollout]:
        # Every rollout is named (by the caller, else by retry_safe_id): sent again, the request returns what
        # the first one wrote, so an answer lost or a 503 from a database that committed late costs nothing.
        data = await self._call("POST", "/v1/agl/queues/rollouts/enqueue", json={"rollouts": requests}, idempotent=True)
        return [Rollout.model_validate(item) for item in data]

    async def dequeue_rollout(
        self, worker_id: str | None = None, *, timeout: float | None = None
    ) -> AttemptedRollout | None:
        claimed = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id, timeout=timeout)
        return claimed[0] if claimed else None

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> Sequence[AttemptedRollout]:
        data = await self._dequeue_loop("/v1/agl/queues/rollouts/dequeue", limit, worker_id, timeout)
        return [AttemptedRollout.model_validate(item) for item in data]

    async def _dequeue_loop(self, path: str, limit: int, worker_id: str | None, timeout: float | None) -> Any:
        """POST a dequeue-like request, long-polling in pieces of at most MAX_LONG_POLL_SECONDS until something
        is claimed or ``timeout`` has passed; the claimed items as JSON."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            body: dict[str, Any] = {"limit": limit, "worker_id": worker_id}
            if deadline is not None:
                body["timeout"] = max(0.0, min(deadline - time.monotonic(), MAX_LONG_POLL_SECONDS))
            data = await self._call("POST", path, json=body)
            if data or deadline is None or time.monotonic() >= deadline:
                return data

    async def claim_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> Sequence[Claim]:
        data = await self._dequeue_loop("/v1/agl/queues/rollouts/claim", limit, worker_id, timeout)
        return [Claim.model_validate(item) for item in data]

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        data = await self._call(
            "POST", f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}/attempts", json={"worker_id": worker_id}
        )
        return AttemptedRollout.model_validate(data)

    async def query_rollouts(
        self,
        *,
        status_in: Sequence[RolloutStatus] | None = None,
        rollout_id_in: Sequence[str] | None = None,
        rollout_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
        status: Sequence[RolloutStatus] | None = None,
        rollout_ids: Sequence[str] | None = None,
        mode_in: Sequence[RolloutMode] | None = None,
        metadata_match: dict[str, Any] | None = None,
        start_time_from: float | None = None,
        start_time_to: float | None = None,
    ) -> PaginatedResult[Rollout]:
        body = {
            "status_in": status_in if status_in is not None else status,
            "rollout_id_in": rollout_id_in if rollout_id_in is not None else rollout_ids,
            "rollout_id_contains": rollout_id_contains,
            "filter_logic": filter_logic,
            "sort_by": sort_by,
            "sort_order": sort_order,
            "limit": limit,
            "offset": offset,
            "mode_in": mode_in,
            "metadata_match": metadata_match,
            "start_time_from": start_time_from,
            "start_time_to": start_time_to,
        }
        data = await self._call("POST", "/v1/agl/rollouts/search", json=body, idempotent=True)
        return self._page(data, _rollout)

    @staticmethod
    def _page(data: dict[str, Any], parse: Any) -> PaginatedResult[Any]:
        return PaginatedResult(
            items=[parse(item) for item in data["items"]],
            limit=data["limit"],
            offset=data["offset"],
            total=data["total"],
        )

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None:
        data = await self._call("GET", f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}", idempotent=True)
        return None if data is None else _rollout(data)

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput | Unset = UNSET,
        mode: RolloutMode | None | Unset = UNSET,
        resources_id: str | None | Unset = UNSET,
        status: RolloutStatus | Unset = UNSET,
        config: RolloutConfig | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
    ) -> Rollout:
        if isinstance(config, RolloutConfig):
            config = config.model_dump(mode="json")  # type: ignore[assignment]
        body = _set(input=input, mode=mode, resources_id=resources_id, status=status, config=config, metadata=metadata)
        data = await self._call("POST", f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}", json=body, idempotent=True)
        return _rollout(data)

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        while True:
            step = MAX_LONG_POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            body = {"rollout_ids": rollout_ids, "timeout": min(step, MAX_LONG_POLL_SECONDS)}
            data = await self._call("POST", "/v1/agl/waits/rollouts", json=body, idempotent=True)
            done = [Rollout.model_validate(item) for item in data]
            if len({r.rollout_id for r in done}) >= len(set(rollout_ids)) or (
                deadline is not None and time.monotonic() >= deadline
            ):
                return done

    # Attempts --------------------------------------------------------------------------------------------

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Attempt]:
        body = {"sort_by": sort_by, "sort_order": sort_order, "limit": limit, "offset": offset}
        data = await self._call(
            "POST", f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}/attempts/search", json=body, idempotent=True
        )
        return self._page(data, Attempt.model_validate)

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        data = await self._call(
            "GET", f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}/attempts/latest", idempotent=True
        )
        return None if data is None else Attempt.model_validate(data)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | Unset = UNSET,
        worker_id: str | Unset = UNSET,
        last_heartbeat_time: float | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
        *,
        if_current: bool = False,
    ) -> Attempt:
        body = _set(status=status, worker_id=worker_id, last_heartbeat_time=last_heartbeat_time, metadata=metadata)
        if if_current:
            body["if_current"] = True
        data = await self._call(
            "POST",
            f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}/attempts/{_id(attempt_id, 'attempt_id')}",
            json=body,
            idempotent=True,
        )
        return Attempt.model_validate(data)

    async def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Attempt | None]:
        body = {"ends": [e.model_dump(mode="json") if isinstance(e, AttemptEnd) else e for e in ends]}
        data = await self._call("POST", "/v1/agl/attempts/end", json=body, idempotent=True)
        return [None if item is None else Attempt.model_validate(item) for item in data]

    async def scan_unhealthy(self) -> int:
        marked: int = (await self._call("POST", "/v1/agl/watchdog/scan", idempotent=True))["marked"]
        return marked

    # Spans -----------------------------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Span | None:
        added = await self.add_many_spans([span])
        return added[0] if added else None

    async def add_many_spans(self, spans: Sequence[Span], *, allocate_sequence_ids: bool = False) -> Sequence[Span]:
        if not spans:
            return []
        if all(type(span) is Span for span in spans):
            return await self._add_own_spans(list(spans), allocate_sequence_ids)
        body: dict[str, Any] = {"spans": [s.model_dump(mode="json") if isinstance(s, Span) else s for s in spans]}
        if allocate_sequence_ids:
            body["allocate_sequence_ids"] = True
        data = await self._call("POST", "/v1/agl/spans/batch", json=body, idempotent=True)
        return [Span.model_validate(item) for item in data["spans"]]

    async def _add_own_spans(self, spans: list[Span], allocate_sequence_ids: bool) -> list[Span]:
        """:meth:`add_many_spans` of spans this client holds as models: encoded in one call, and answered with the
        positions of the new ones and their sequence ids (``return_spans: false``), which picks them from
        ``spans``; the server encoding them and this client decoding them again cost more than storing them."""
        flag = b"true" if allocate_sequence_ids else b"false"
        content = b'{"spans":%s,"allocate_sequence_ids":%s,"return_spans":false}' % (_SPANS.dump_json(spans), flag)
        data = await self._call("POST", "/v1/agl/spans/batch", content=content, idempotent=True)
        added = [spans[index] for index in data["added"]]
        return [
            span if span.sequence_id == number else span.model_copy(update={"sequence_id": number})
            for span, number in zip(added, data["sequence_ids"], strict=True)
        ]

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Span | None:
        if sequence_id is None:
            sequence_id = await self.get_next_span_sequence_id(rollout_id, attempt_id)
        return await self.add_span(Span.from_opentelemetry(readable_span, rollout_id, attempt_id, sequence_id))

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        # Safe to send again: a number taken twice leaves a gap in a counter that is increasing, not dense.
        body = {"rollout_id": rollout_id, "attempt_id": attempt_id}
        data = await self._call("POST", "/v1/agl/spans/next", json=body, idempotent=True)
        return int(data["sequence_id"])

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]:
        if not rollout_attempt_ids:
            return []
        pairs = [{"rollout_id": r, "attempt_id": a} for r, a in rollout_attempt_ids]
        data = await self._call("POST", "/v1/agl/spans/next/batch", json={"pairs": pairs}, idempotent=True)
        return [int(n) for n in data["sequence_ids"]]

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        *,
        trace_id: str | None = None,
        trace_id_contains: str | None = None,
        span_id: str | None = None,
        span_id_contains: str | None = None,
        parent_id: str | None = None,
        parent_id_contains: str | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
    ) -> PaginatedResult[Span]:
        body = {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "trace_id": trace_id,
            "trace_id_contains": trace_id_contains,
            "span_id": span_id,
            "span_id_contains": span_id_contains,
            "parent_id": parent_id,
            "parent_id_contains": parent_id_contains,
            "name": name,
            "name_contains": name_contains,
            "filter_logic": filter_logic,
            "limit": limit,
            "offset": offset,
            "sort_by": sort_by,
            "sort_order": sort_order,
        }
        data = await self._call("POST", "/v1/agl/spans/search", json=body, idempotent=True)
        return self._page(data, Span.model_validate)

    async def search_spans(
        self,
        *,
        rollout_ids: Sequence[str] | None = None,
        attempt_ids: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        name_prefix: str | None = None,
        mode_in: Sequence[RolloutMode] | None = None,
        status_code: str | None = None,
        attributes_match: dict[str, Any] | None = None,
        start_time_from: float | None = None,
        start_time_to: float | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = 1000,
        offset: int = 0,
    ) -> PaginatedResult[Span]:
        body = {
            "rollout_ids": rollout_ids,
            "attempt_ids": attempt_ids,
            "names": names,
            "name_prefix": name_prefix,
            "mode_in": mode_in,
            "status_code": status_code,
            "attributes_match": attributes_match,
            "start_time_from": start_time_from,
            "start_time_to": start_time_to,
            "sort_by": sort_by,
            "sort_order": sort_order,
            "limit": limit,
            "offset": offset,
        }
        data = await self._call("POST", "/v1/agl/spans/query", json=body, idempotent=True)
        return self._page(data, Span.model_validate)

    async def add_llm_calls(self, calls: Sequence[LlmCall]) -> None:
        if not calls:
            return
        body = {"calls": [c.model_dump(mode="json") if isinstance(c, LlmCall) else c for c in calls]}
        await self._call("POST", "/v1/agl/llm_calls/batch", json=body, idempotent=True)

    async def query_llm_calls(self, rollout_ids: Sequence[str], *, attempt_id: str | None = None) -> list[LlmCall]:
        body = {"rollout_ids": list(rollout_ids), "attempt_id": attempt_id}
        data = await self._call("POST", "/v1/agl/llm_calls/search", json=body, idempotent=True)
        return [LlmCall.model_validate(item) for item in data["items"]]

    # Resources -------------------------------------------------------------------------------------------

    @staticmethod
    def _resources_json(resources: NamedResources) -> Any:
        if not isinstance(resources, dict):
            return resources
        return {k: v.model_dump(mode="json") if hasattr(v, "model_dump") else v for k, v in resources.items()}

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        data = await self._call("POST", "/v1/agl/resources", json=self._resources_json(resources))
        return ResourcesUpdate.model_validate(data)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        data = await self._call(
            "POST", f"/v1/agl/resources/{_id(resources_id, 'resources_id')}", json=self._resources_json(resources)
        )
        return ResourcesUpdate.model_validate(data)

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        data = await self._call("GET", f"/v1/agl/resources/{_id(resources_id, 'resources_id')}", idempotent=True)
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def get_attempt_resources(self, rollout_id: str, attempt_id: str) -> ResourcesUpdate | None:
        path = f"/v1/agl/rollouts/{_id(rollout_id, 'rollout_id')}/attempts/{_id(attempt_id, 'attempt_id')}/resources"
        data = await self._call("GET", path, idempotent=True)
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        data = await self._call("GET", "/v1/agl/resources/latest", idempotent=True)
        return None if data is None else ResourcesUpdate.model_validate(data)

    async def query_resources(
        self,
        *,
        resources_id: str | None = None,
        resources_id_contains: str | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[ResourcesUpdate]:
        params = {
            k: v
            for k, v in {
                "resources_id": resources_id,
                "resources_id_contains": resources_id_contains,
                "sort_by": sort_by,
                "sort_order": sort_order,
                "limit": limit,
                "offset": offset,
            }.items()
            if v is not None
        }
        data = await self._call("GET", "/v1/agl/resources", params=params, idempotent=True)
        return self._page(data, ResourcesUpdate.model_validate)

    # Workers ---------------------------------------------------------------------------------------------

    async def query_workers(
        self,
        *,
        status_in: Sequence[WorkerStatus] | None = None,
        worker_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Worker]:
        body = {
            "status_in": status_in,
            "worker_id_contains": worker_id_contains,
            "filter_logic": filter_logic,
            "sort_by": sort_by,
            "sort_order": sort_order,
            "limit": limit,
            "offset": offset,
        }
        data = await self._call("POST", "/v1/agl/workers/search", json=body, idempotent=True)
        return self._page(data, Worker.model_validate)

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        data = await self._call("GET", f"/v1/agl/workers/{_id(worker_id, 'worker_id')}", idempotent=True)
        return None if data is None else Worker.model_validate(data)

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] | Unset = UNSET) -> Worker:
        body = _set(heartbeat_stats=heartbeat_stats)
        data = await self._call("POST", f"/v1/agl/workers/{_id(worker_id, 'worker_id')}", json=body, idempotent=True)
        return Worker.model_validate(data)
