"""Tracers: capture what an agent does, as OpenTelemetry spans written into a store.

``Tracer(store)`` batches the spans of the attempts it is bound to (``with tracer.attempt(r, a): …``) into the
store; the emitters add rewards, messages, objects, exceptions and operations. Spans from any OpenTelemetry
instrumentation (OpenInference for LangChain or the OpenAI Agents SDK, say) started inside an attempt land on it
too, because they share the process's tracer provider; ``instrument()`` installs those two (the ``openinference``
extra), and the runner's workers call it at start-up.
"""

from tracers.binding import AttemptBinding, bind_attempt, current_binding
from tracers.emit import emit_exception, emit_message, emit_object, emit_reward
from tracers.exporter import StoreSpanExporter
from tracers.openinference import instrument
from tracers.operation import Operation, operation
from tracers.tracer import Tracer

__all__ = [
    "AttemptBinding",
    "Operation",
    "StoreSpanExporter",
    "Tracer",
    "bind_attempt",
    "current_binding",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "instrument",
    "operation",
]
