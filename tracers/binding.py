"""Which rollout attempt the code running now works for, carried in a context variable.

A binding travels with the context: into asyncio tasks created under it, and into threads started with
``asyncio.to_thread`` or ``contextvars.copy_context().run``. Spans started under a binding belong to its attempt
and go to its sink; spans started outside any binding are not exported by the tracers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.sdk.trace import SpanProcessor


@dataclass(frozen=True)
class AttemptBinding:
    rollout_id: str
    attempt_id: str
    sink: SpanProcessor | None
    """Where the attempt's finished spans go (a batching processor over a store); None keeps the ids only."""


_current: contextvars.ContextVar[AttemptBinding | None] = contextvars.ContextVar("lightning_attempt", default=None)


def current_binding() -> AttemptBinding | None:
    return _current.get()


@contextlib.contextmanager
def bind_attempt(rollout_id: str, attempt_id: str, sink: SpanProcessor | None = None) -> Iterator[AttemptBinding]:
    """Bind the code in the block (and the tasks and threads it starts) to one rollout attempt."""
    binding = AttemptBinding(rollout_id, attempt_id, sink)
    token = _current.set(binding)
    try:
        yield binding
    finally:
        _current.reset(token)
