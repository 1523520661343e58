"""The process's OpenTelemetry ``TracerProvider`` and the processor that routes spans to their attempt's sink.

OpenTelemetry allows one global provider per process, while a process may serve several stores (a test, a
runner that talks to two servers). So there is one provider, and each span goes where the binding under
which it *started* says: its ids are stamped as attributes at start, and at its end it is handed to that
binding's sink. If the application already installed an SDK provider, the router is added to that one instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from lightning_store import semconv
from tracers.binding import current_binding

INSTRUMENTATION_NAME = "lightning_store.tracers"


class AttemptRouter(SpanProcessor):
    """Stamps ``agentlightning.rollout_id``/``attempt_id`` on spans started under a binding and passes each
    finished span to the sink of the binding it started under."""

    def __init__(self) -> None:
        self._sinks: dict[tuple[int, int], SpanProcessor] = {}
        self._skips: tuple[Callable[[ReadableSpan], bool], ...] = ()  # replaced whole, read without the lock
        self._lock = threading.Lock()

    def skip(self, duplicate: Callable[[ReadableSpan], bool]) -> None:
        """Write no span for which ``duplicate`` is true (a framework's own span that an instrumentation records
        again, better): e.g. AutoGen's ``execute_tool`` spans, which carry no input or output, where the
        OpenInference AutoGen instrumentation records each tool call with both."""
        with self._lock:
            if duplicate not in self._skips:
                self._skips = (*self._skips, duplicate)

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        binding = current_binding()
        if binding is None:
            return
        span.set_attribute(semconv.ROLLOUT_ID, binding.rollout_id)
        span.set_attribute(semconv.ATTEMPT_ID, binding.attempt_id)
        if binding.sink is not None:
            with self._lock:
                self._sinks[_key(span)] = binding.sink

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            sink = self._sinks.pop(_key(span), None)
        if sink is not None and not any(duplicate(span) for duplicate in self._skips):
            sink.on_end(span)

    def shutdown(self) -> None:
        with self._lock:
            self._sinks.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _key(span: ReadableSpan) -> tuple[int, int]:
    # on_end receives a snapshot of the span, not the object on_start saw: key by the span's identity.
    context = span.get_span_context()
    return (context.trace_id, context.span_id) if context else (0, id(span))


_lock = threading.Lock()
_router: AttemptRouter | None = None


def install() -> AttemptRouter:
    """Make sure the process has an SDK provider with the router on it (idempotent, thread-safe)."""
    global _router
    with _lock:
        if _router is not None:
            return _router
        router = AttemptRouter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(resource=Resource.create({"service.name": "lightning-store-agent"}))
            trace.set_tracer_provider(provider)
            provider = trace.get_tracer_provider()  # another library may have won the race to set it
        if isinstance(provider, TracerProvider):
            provider.add_span_processor(router)
        _router = router
        return router


_tracer: tuple[trace.TracerProvider, trace.Tracer] | None = None


def get_tracer() -> trace.Tracer:
    """The tracer the emitters use (after :func:`install`): one per provider, made once (making one per span
    was a fifth of what emitting a reward cost)."""
    global _tracer
    install()
    provider = trace.get_tracer_provider()
    made = _tracer
    if made is None or made[0] is not provider:
        made = _tracer = (provider, trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=provider))
    return made[1]
