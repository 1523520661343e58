"""The LLM proxy: OpenAI-compatible endpoints bound to a rollout attempt, recording token-exact calls.

``POST /rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions`` (and ``/v1/completions``; or the same
without the prefix and with ``x-rollout-id``/``x-attempt-id`` headers) forwards the request to the upstream named
by the rollout's resources (the first ``llm`` resource; else the latest snapshot's; else the configured
``llm_upstream`` with ``llm_model`` and ``llm_api_key``; with none, a 422 ``NoUpstream`` that says what to
configure), asking it for token ids (``return_token_ids``) and logprobs the way vLLM returns them. The
agent gets the upstream's answer unchanged (streamed when it asked for ``stream``). After the answer has gone
out, a span and a typed :class:`~lightning_store.llm_calls.LlmCall` are recorded in the background, in batches
(:mod:`~lightning_store.server.recorder`), so a slow store never delays the agent. An upstream error goes back to
the agent with its status and is recorded as an error span.
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError, NotFoundError
from lightning_store.limits import storable, storable_text
from lightning_store.llm_calls import LlmCall
from lightning_store.resources import LLM, ProxyLLM, ResourcesUpdate
from lightning_store.server.json_body import CheckedJsonRoute
from lightning_store.server.recorder import CallRecord, CallRecorder
from lightning_store.server.routes_rollouts import Store
from lightning_store.settings import ServerSettings
from lightning_store.spans import Span

logger = logging.getLogger(__name__)
router = APIRouter(route_class=CheckedJsonRoute)
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
"""What a failed upstream call raises (aiohttp's own errors, and its timeouts)."""
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
)


@router.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind:path}")
async def proxy_bound(rollout_id: str, attempt_id: str, kind: str, request: Request, store: Store) -> Response:
    return await forward(request, store, rollout_id, attempt_id, kind)


@router.post("/v1/chat/completions")
async def proxy_chat(request: Request, store: Store) -> Response:
    return await forward(
        request, store, request.headers.get("x-rollout-id"), request.headers.get("x-attempt-id"), "chat/completions"
    )


@router.post("/v1/completions")
async def proxy_completions(request: Request, store: Store) -> Response:
    return await forward(
        request, store, request.headers.get("x-rollout-id"), request.headers.get("x-attempt-id"), "completions"
    )


async def forward(
    request: Request, store: LightningStore, rollout_id: str | None, attempt_id: str | None, kind: str
) -> Response:
    """Answer one proxied call of ``kind`` (``chat/completions`` or ``completions``) bound to the given attempt:
    the FastAPI routes above, and :mod:`~lightning_store.server.direct_proxy` ahead of FastAPI, both call this."""
    if kind not in ("chat/completions", "completions"):
        raise NotFoundError(f"no proxy route for /v1/{kind}", field="path")
    if not rollout_id or not attempt_id:
        raise InvalidRequestError(
            "the call must name its rollout and attempt (path or x-rollout-id/x-attempt-id)",
            field="rollout_id" if not rollout_id else "attempt_id",
        )
    body = await request.json()
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", field="body")
    resources = await store.get_attempt_resources(rollout_id, attempt_id)  # NotFoundError for unknown ids
    llm = _upstream_llm(resources, request.app.state.llm_fallback)
    if llm is None:
        return no_upstream(rollout_id)
    upstream_body = _with_token_ids(body, kind, llm)
    call = _Call(request.app.state.recorder, rollout_id, attempt_id, kind, body, resources)
    http: aiohttp.ClientSession = request.app.state.upstream_http
    url = f"{llm.endpoint.rstrip('/')}/{kind}"
    headers = {"Authorization": f"Bearer {llm.api_key}"} if llm.api_key else {}
    if body.get("stream"):
        return await _stream(http, url, upstream_body, headers, call)
    try:
        async with http.post(url, json=upstream_body, headers=headers) as upstream:
            status, content = upstream.status, await upstream.read()
            content_type = upstream.headers.get("content-type", "application/json")
    except UPSTREAM_ERRORS as exc:
        return _unreachable(call, exc)
    if status >= 400:
        call.record_error(status, content.decode(errors="replace"))
        return Response(content, status_code=status, media_type=content_type)
    try:
        data = storable(json.loads(content), content)  # what the record keeps; the agent gets the bytes as sent
    except ValueError:
        call.record_error(502, f"not JSON: {content[:200].decode(errors='replace')}")
        return JSONResponse({"detail": "the upstream's answer is not JSON", "error_type": "UpstreamError"}, 502)
    call.record(data)
    return Response(content, status_code=status, media_type=content_type)  # the upstream's bytes, unchanged


def fallback_llm(settings: ServerSettings) -> LLM | None:
    """The upstream of calls whose resources name no LLM: ``--llm-upstream`` (with ``--llm-model`` and
    ``--llm-api-key``), or None when it is not configured."""
    if not settings.llm_upstream:
        return None
    return LLM(endpoint=settings.llm_upstream, model=settings.llm_model or "", api_key=settings.llm_api_key)


def no_upstream(rollout_id: str) -> JSONResponse:
    """The answer to a call with no upstream to go to: a 422 (the OpenAI SDK does not retry it) that says what
    to configure, in the store's error shape and in OpenAI's (``error.message``, which OpenAI clients put in the
    exception they raise, and so in the agent's exception span)."""
    detail = (
        f"rollout {rollout_id} has no llm resource and this server has no --llm-upstream: register one with "
        "`store resources set-llm URL --model M` or start `store serve --llm-upstream URL --llm-model M`"
    )
    openai_error = {"message": detail, "type": "invalid_request_error", "param": "resources", "code": "no_upstream"}
    return JSONResponse(
        {"detail": detail, "field": "resources", "error_type": "NoUpstream", "error": openai_error},
        status_code=422,
        headers={"x-should-retry": "false"},
    )


UPSTREAM_KEEP_ALIVE_SECONDS = 4.0
"""How long the proxy keeps an idle connection to an upstream before it opens a new one. Shorter than the 5 s
that uvicorn-based policy servers (vLLM's OpenAI server among them) keep one: a call sent on a connection the
upstream is closing that instant meets a closed socket and, being a POST, cannot be retried safely. aiohttp's
default (15 s) left a window of that race in every idle pause of 5–15 s."""


def upstream_client(timeout: float) -> aiohttp.ClientSession:
    """The proxy's HTTP client for upstreams: ``timeout`` seconds at most between two reads of an answer.

    aiohttp rather than httpx here: forwarding a call cost httpx about 3 ms of CPU with 32 calls in flight
    (its connection pool checks every idle connection on each request) and aiohttp 0.2 ms (docs/benchmarks.md).
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(keepalive_timeout=UPSTREAM_KEEP_ALIVE_SECONDS),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout),
    )


def _unreachable(call: _Call, exc: BaseException) -> Response:
    reason = str(exc) or type(exc).__name__
    call.record_error(502, reason)
    return JSONResponse({"detail": f"upstream unreachable: {reason}", "error_type": "UpstreamError"}, status_code=502)


def _upstream_llm(resources: ResourcesUpdate | None, fallback: LLM | None) -> LLM | None:
    if resources is not None:
        for resource in resources.resources.values():
            if isinstance(resource, LLM | ProxyLLM) and resource.resource_type == "llm":
                return LLM.model_validate(resource.model_dump())
    return fallback


def _with_token_ids(body: dict[str, Any], kind: str, llm: LLM) -> dict[str, Any]:
    """The request as the upstream should get it: token ids and logprobs on, the model named."""
    upstream = {**llm.sampling_parameters, **body, "return_token_ids": True}
    if not upstream.get("model") and llm.model:
        upstream["model"] = llm.model
    if kind == "chat/completions":
        upstream.setdefault("logprobs", True)
    else:
        upstream.setdefault("logprobs", 1)
    if body.get("stream"):
        upstream.setdefault("stream_options", {"include_usage": True})
    return upstream


async def _stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], call: _Call
) -> Response:
    try:
        upstream = await http.post(url, json=body, headers=headers)
    except UPSTREAM_ERRORS as exc:
        return _unreachable(call, exc)
    if upstream.status >= 400:
        try:
            content = await upstream.read()
        except UPSTREAM_ERRORS as exc:
            return _unreachable(call, exc)
        finally:
            upstream.release()
        call.record_error(upstream.status, content.decode(errors="replace"))
        return Response(
            content, status_code=upstream.status, media_type=upstream.headers.get("content-type", "application/json")
        )

    async def relay() -> AsyncIterator[bytes]:
        assembled, pending = _Assembler(), b""
        try:
            async for chunk in upstream.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    assembled.feed(line.decode(errors="replace").rstrip("\r"))
                    yield line + b"\n"
            if pending:
                assembled.feed(pending.decode(errors="replace").rstrip("\r"))
                yield pending + b"\n"
        except UPSTREAM_ERRORS as exc:  # the upstream broke off: the agent has what came, the record says so
            logger.warning("upstream stream of %s broke off: %s", call.attempt_id, exc)
        finally:
            upstream.release()
            call.record(assembled.response())

    return StreamingResponse(relay(), media_type="text/event-stream")


class _Assembler:
    """Rebuilds one response (text, token ids, logprobs) from an OpenAI/vLLM server-sent event stream."""

    def __init__(self) -> None:
        self.prompt_token_ids: list[int] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        payload = line[len("data:") :].strip()
        if not payload or payload == "[DONE]":
            return
        try:
            chunk = storable(json.loads(payload), payload)
        except ValueError:
            return
        self.model = chunk.get("model", self.model)
        self.usage = chunk.get("usage") or self.usage
        self.prompt_token_ids = chunk.get("prompt_token_ids") or self.prompt_token_ids
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            self.prompt_token_ids = choice.get("prompt_token_ids") or self.prompt_token_ids
            self.token_ids.extend(choice.get("token_ids") or [])
            delta = choice.get("delta") or {}
            self.text.append(delta.get("content") or choice.get("text") or "")
            self.logprobs.extend(_logprobs(choice))
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt_token_ids": self.prompt_token_ids,
            "usage": self.usage,
            "choices": [
                {
                    "index": 0,
                    "token_ids": self.token_ids,
                    "finish_reason": self.finish_reason,
                    "message": {"role": "assistant", "content": "".join(self.text)},
                    "logprobs": {"content": [{"logprob": v} for v in self.logprobs]},
                }
            ],
        }


def _logprobs(choice: dict[str, Any]) -> list[float]:
    logprobs = choice.get("logprobs") or {}
    if logprobs.get("content") is not None:  # chat
        return [float(item["logprob"]) for item in logprobs["content"]]
    return [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]  # completions


class _Call:
    """One proxied call; ``record``/``record_error`` queue its span and LLM-call record with the server's
    :class:`~lightning_store.server.recorder.CallRecorder`, without waiting for the write."""

    def __init__(
        self,
        recorder: CallRecorder,
        rollout_id: str,
        attempt_id: str,
        kind: str,
        request: dict[str, Any],
        resources: ResourcesUpdate | None,
    ) -> None:
        self.recorder = recorder
        self.rollout_id, self.attempt_id, self.kind, self.request = rollout_id, attempt_id, kind, request
        self.resources = resources
        self.started = time.time()
        self.span_id = secrets.token_hex(8)

    def record(self, response: dict[str, Any]) -> None:
        self._queue(response, None)

    def record_error(self, status: int, detail: str) -> None:
        self._queue(None, f"upstream answered {status}: {detail[:2000]}")

    def _queue(self, response: dict[str, Any] | None, error: str | None) -> None:
        ended = time.time()
        error = None if error is None else storable_text(error)  # an upstream's error page may hold a NUL
        build = functools.partial(self._build, response=response, error=error, ended=ended)
        self.recorder.add(CallRecord(self.rollout_id, self.attempt_id, build))

    def _build(
        self, sequence_id: int, *, response: dict[str, Any] | None, error: str | None, ended: float
    ) -> tuple[Span, LlmCall | None]:
        choice = ((response or {}).get("choices") or [{}])[0]
        prompt_ids = (response or {}).get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        response_ids = choice.get("token_ids") or []
        model = (response or {}).get("model") or self.request.get("model")
        operation = "chat" if self.kind == "chat/completions" else "text_completion"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": self.request.get("model"),
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": len(prompt_ids),
            "gen_ai.usage.output_tokens": len(response_ids),
            "lightning_store.llm_call": True,
        }
        if choice.get("finish_reason"):
            attributes["gen_ai.response.finish_reasons"] = [choice["finish_reason"]]
        if error:
            attributes["error.type"] = "upstream_error"
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=sequence_id,
            trace_id=secrets.token_hex(16),
            span_id=self.span_id,
            name=f"{operation} {model or ''}".strip(),
            status={"status_code": "ERROR" if error else "OK", "description": error},
            attributes={k: v for k, v in attributes.items() if v is not None},
            start_time=self.started,
            end_time=ended,
        )
        if error is not None:
            return span, None
        metadata = self.request.get("metadata")
        call = LlmCall(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            span_id=self.span_id,
            sequence_id=sequence_id,
            model=model,
            agent_name=metadata.get("agent_name") if isinstance(metadata, dict) else None,
            resources_id=self.resources.resources_id if self.resources else None,
            resources_version=self.resources.version if self.resources else None,
            prompt_token_ids=prompt_ids,
            response_token_ids=response_ids,
            response_logprobs=_logprobs(choice) or None,
            request=self.request,
            response=response,
            sampling_parameters={k: self.request[k] for k in SAMPLING_KEYS if k in self.request},
            finish_reason=choice.get("finish_reason"),
            start_time=self.started,
            end_time=ended,
            latency_seconds=ended - self.started,
        )
        return span, call
