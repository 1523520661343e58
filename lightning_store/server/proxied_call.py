"""One call through the LLM proxy, as the store records it: a span and, when an answer came, an
:class:`~lightning_store.llm_calls.LlmCall`.

Building the record never raises (the recorder writes records in batches, and one record's failure must not cost
the others): the answer is read by :mod:`~lightning_store.server.answers`, and an answer that cannot be a
training transition is recorded all the same, with its ``error`` saying why, and its span marked ``ERROR``.
"""

from __future__ import annotations

import functools
import secrets
import time
from typing import Any

from lightning_store.limits import MAX_SPAN_NAME_LENGTH, storable_text
from lightning_store.llm_calls import LlmCall
from lightning_store.resources import ResourcesUpdate
from lightning_store.server.answers import Answer
from lightning_store.server.recorder import CallRecord, CallRecorder
from lightning_store.spans import Span

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
UNTRAINABLE = "untrainable_answer"
"""The ``error.type`` of a call's span when its answer could not be read as a transition."""


class ProxiedCall:
    """One proxied call (``request`` as the agent sent it, ``sent`` as the upstream got it: the record's
    ``sampling_parameters`` are those that applied); ``record``/``record_error`` queue its span and LLM-call
    record with the server's :class:`~lightning_store.server.recorder.CallRecorder`, without waiting for the
    write."""

    def __init__(
        self,
        recorder: CallRecorder,
        rollout_id: str,
        attempt_id: str,
        kind: str,
        request: dict[str, Any],
        resources: ResourcesUpdate | None,
        sent: dict[str, Any] | None = None,
        *,
        llm_resource: str | None = None,
    ) -> None:
        self.recorder = recorder
        self.rollout_id, self.attempt_id, self.kind, self.request = rollout_id, attempt_id, kind, request
        self.resources = resources
        self.sent = request if sent is None else sent
        """The request as the upstream got it (the resource's sampling defaults and cap applied)."""
        self.llm_resource = llm_resource
        """The name of the llm resource that served the call (None: the server's fallback upstream)."""
        self.started = time.time()
        self.span_id = secrets.token_hex(8)

    def record(self, answer: Answer) -> None:
        """Queue the record of a call that got ``answer``."""
        self._queue(answer, None)

    def record_error(self, status: int, detail: str) -> None:
        """Queue the record of a call that got no answer (an upstream error or an unreachable upstream)."""
        self._queue(None, f"upstream answered {status}: {detail[:2000]}")

    def _queue(self, answer: Answer | None, error: str | None) -> None:
        ended = time.time()
        error = None if error is None else storable_text(error)  # an upstream's error page may hold a NUL
        build = functools.partial(self._build, answer=answer, error=error, ended=ended)
        self.recorder.add(CallRecord(self.rollout_id, self.attempt_id, build))

    def _build(
        self, sequence_id: int, *, answer: Answer | None, error: str | None, ended: float
    ) -> tuple[Span, LlmCall | None]:
        requested = self.request.get("model")
        requested = requested if isinstance(requested, str) else None
        model = (answer.model if answer else None) or requested
        operation = "chat" if self.kind == "chat/completions" else "text_completion"
        problem = answer.problem if answer else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": requested,
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": len(answer.prompt_token_ids) if answer else 0,
            "gen_ai.usage.output_tokens": len(answer.response_token_ids) if answer else 0,
            "lightning_store.llm_call": True,
            "lightning_store.llm_resource": self.llm_resource,
        }
        if answer and answer.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [answer.finish_reason]
        if error:
            attributes["error.type"] = "upstream_error"
        elif problem:
            attributes["error.type"] = UNTRAINABLE
        description = error or (f"not trainable: {problem}" if problem else None)
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            sequence_id=sequence_id,
            trace_id=secrets.token_hex(16),
            span_id=self.span_id,
            # Named after the operation and the model, which an upstream may name at any length.
            name=f"{operation} {model or ''}".strip()[:MAX_SPAN_NAME_LENGTH],
            status={"status_code": "ERROR" if description else "OK", "description": description},
            attributes={k: v for k, v in attributes.items() if v is not None},
            start_time=self.started,
            end_time=ended,
        )
        if answer is None:
            return span, None
        metadata = self.request.get("metadata")
        agent_name = metadata.get("agent_name") if isinstance(metadata, dict) else None
        call = LlmCall(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            span_id=self.span_id,
            sequence_id=sequence_id,
            model=model,
            agent_name=agent_name if isinstance(agent_name, str) else None,
            resources_id=self.resources.resources_id if self.resources else None,
            resources_version=self.resources.version if self.resources else None,
            llm_resource=self.llm_resource,
            prompt_token_ids=answer.prompt_token_ids,
            response_token_ids=answer.response_token_ids,
            response_logprobs=answer.logprobs or None,
            request=self.request,
            response=answer.response,
            sampling_parameters={k: self.sent[k] for k in SAMPLING_KEYS if k in self.sent},
            finish_reason=answer.finish_reason,
            error=problem,
            start_time=self.started,
            end_time=ended,
            latency_seconds=ended - self.started,
        )
        return span, call
