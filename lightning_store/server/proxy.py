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

import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError, NotFoundError
from lightning_store.resources import LLM, ResourcesUpdate
from lightning_store.server.answers import answer_from
from lightning_store.server.json_body import CheckedJsonRoute
from lightning_store.server.proxied_call import ProxiedCall
from lightning_store.server.routes_rollouts import Store
from lightning_store.server.stream_answer import StreamAssembler
from lightning_store.settings import ServerSettings

logger = logging.getLogger(__name__)
router = APIRouter(route_class=CheckedJsonRoute)
MAIN_LLM = "main_llm"
"""The llm resource a call goes to when it names none of the snapshot's (as an agent's ``llm`` parameter gets it)."""
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError)
"""What a failed upstream call raises (aiohttp's own errors, and its timeouts)."""


@router.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/{kind:path}")
async def proxy_bound(rollout_id: str, attempt_id: str, kind: str, request: Request, store: Store) -> Response:
    return await forward(request, store, rollout_id, attempt_id, kind)


@router.post("/worker/{worker_id}/v1/{kind:path}")
async def proxy_worker(worker_id: str, kind: str, request: Request, store: Store) -> Response:
    """The proxy of the attempt the worker runs when the call arrives (its ``current_attempt_id``): where runners
    point the OpenAI SDK's defaults (``runners.openai_defaults``). The call goes to the attempt's ``llm``
    resource under that resource's model name, whatever model the agent named; a worker that runs no attempt
    answers 409."""
    worker = await store.get_worker_by_id(worker_id)
    if worker is None:
        raise NotFoundError(f"worker {worker_id} not found", field="worker_id")
    if not worker.current_rollout_id or not worker.current_attempt_id:
        return no_attempt(worker_id)
    return await forward(request, store, worker.current_rollout_id, worker.current_attempt_id, kind, any_model=True)


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
    request: Request,
    store: LightningStore,
    rollout_id: str | None,
    attempt_id: str | None,
    kind: str,
    *,
    any_model: bool = False,
) -> Response:
    """Answer one proxied call of ``kind`` (``chat/completions`` or ``completions``) bound to the given attempt:
    the FastAPI routes above, and :mod:`~lightning_store.server.direct_proxy` ahead of FastAPI, both call this.
    With ``any_model`` the upstream gets the chosen resource's model name whatever the call named."""
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
    name, llm = choose_llm(resources, body.get("model"), request.app.state.llm_fallback)
    if llm is None:
        return no_upstream(rollout_id)
    by_name = any_model or (name is not None and body.get("model") == name)
    upstream_body = _with_token_ids(body, kind, llm, by_name=by_name)
    call = ProxiedCall(
        request.app.state.recorder, rollout_id, attempt_id, kind, body, resources, upstream_body, llm_resource=name
    )
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
    answer = answer_from(content)  # what the record keeps; the agent gets the bytes as sent
    if answer is None:
        call.record_error(502, f"not JSON: {content[:200].decode(errors='replace')}")
        return JSONResponse({"detail": "the upstream's answer is not JSON", "error_type": "UpstreamError"}, 502)
    call.record(answer)
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


def no_attempt(worker_id: str) -> JSONResponse:
    """The answer to a call on the route of a worker that runs no attempt: a 409 that the OpenAI SDK does not
    retry, in the store's error shape and OpenAI's."""
    detail = f"worker {worker_id} is running no attempt: a call on its route belongs to the attempt it runs"
    openai_error = {"message": detail, "type": "invalid_request_error", "param": "worker_id", "code": "no_attempt"}
    return JSONResponse(
        {"detail": detail, "field": "worker_id", "error_type": "NoAttempt", "error": openai_error},
        status_code=409,
        headers={"x-should-retry": "false"},
    )


def _unreachable(call: ProxiedCall, exc: BaseException) -> Response:
    reason = str(exc) or type(exc).__name__
    call.record_error(502, reason)
    return JSONResponse({"detail": f"upstream unreachable: {reason}", "error_type": "UpstreamError"}, status_code=502)


def choose_llm(
    resources: ResourcesUpdate | None, requested: Any, fallback: LLM | None
) -> tuple[str | None, LLM | None]:
    """The llm resource that serves a call naming the model ``requested``, and its name (None for the
    fallback): the resource *named* ``requested`` (an agent reaches a second LLM of its rollout, a judge, by
    its resource name), else the first serving a model of that name, else ``main_llm``, else the first llm
    resource; with none, the server's fallback upstream. "First" puts ``main_llm`` first, then the snapshot's
    order (which Postgres's jsonb does not keep as written: it orders keys by length)."""
    llms = sorted(
        (
            (name, resource)
            for name, resource in (resources.resources.items() if resources is not None else ())
            if isinstance(resource, LLM)  # a proxy_llm resource is the proxy itself, never an upstream
        ),
        key=lambda named: named[0] != MAIN_LLM,
    )
    by_name = next((named for named in llms if named[0] == requested), None)
    by_model = next((named for named in llms if named[1].model == requested), None)
    chosen = by_name or by_model or (llms[0] if llms else None)
    return chosen if chosen is not None else (None, fallback)


def _with_token_ids(body: dict[str, Any], kind: str, llm: LLM, *, by_name: bool = False) -> dict[str, Any]:
    """The request as the upstream should get it: token ids and logprobs on, the model named (the resource's,
    where the request named none or named the resource), ``max_tokens`` within the resource's ``max_tokens_cap``,
    the resource's ``forced_parameters`` over the request's."""
    upstream = {**llm.sampling_parameters, **body, **(llm.forced_parameters or {}), "return_token_ids": True}
    if (by_name or not upstream.get("model")) and llm.model:  # a resource's name is not its upstream's model
        upstream["model"] = llm.model
    if llm.max_tokens_cap is not None:
        asked = [key for key in ("max_tokens", "max_completion_tokens") if upstream.get(key) is not None]
        for key in asked or ["max_tokens"]:
            value = upstream.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value > llm.max_tokens_cap:
                upstream[key] = llm.max_tokens_cap
    if kind == "chat/completions":
        upstream.setdefault("logprobs", True)
    else:
        upstream.setdefault("logprobs", 1)
    if body.get("stream"):
        upstream.setdefault("stream_options", {"include_usage": True})
    return upstream


async def _stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], call: ProxiedCall
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
        assembled, pending = StreamAssembler(), b""
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
            call.record(assembled.answer())

    return StreamingResponse(relay(), media_type="text/event-stream")
