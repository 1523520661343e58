"""``operation``: trace a block or a function (input, output, duration, error) as one span.

With ``tool=True`` the span follows the OpenTelemetry GenAI convention for tool execution (name
``execute_tool {name}``, ``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``), and its status is
the tool call's status: OK when it returned, ERROR when it raised or was marked failed. Rewards can be derived
from these statuses later (see the adapters' AIR credit assignment).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, overload

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from lightning_store import semconv
from tracers.emit import to_json
from tracers.provider import get_tracer

F = TypeVar("F", bound=Callable[..., Any])


class Operation:
    """A context manager (sync or async) and a decorator. Inside the block, :meth:`record_input`,
    :meth:`record_output` and :meth:`fail` annotate the span; a decorated function's arguments and return value
    are recorded for it."""

    def __init__(self, name: str, *, tool: bool = False, call_id: str | None = None) -> None:
        self.name = name
        self.tool = tool
        self.call_id = call_id
        self._span: trace.Span | None = None
        self._failed: str | None = None
        self._scope: Any = None

    def record_input(self, value: Any) -> None:
        self._require().set_attribute(semconv.OPERATION_INPUT, to_json(value))

    def record_output(self, value: Any) -> None:
        self._require().set_attribute(semconv.OPERATION_OUTPUT, to_json(value))

    def fail(self, reason: str) -> None:
        """Mark the operation failed without raising (a tool that answered with an error)."""
        self._failed = reason

    # Context manager ---------------------------------------------------------------------------------

    def __enter__(self) -> Operation:
        attributes: dict[str, str] = {semconv.OPERATION_NAME: self.name}
        span_name = semconv.OPERATION
        if self.tool:
            span_name = f"execute_tool {self.name}"
            attributes |= {semconv.OPERATION_KIND: "execute_tool", semconv.TOOL_NAME: self.name}
            if self.call_id:
                attributes[semconv.TOOL_CALL_ID] = self.call_id
        self._span = get_tracer().start_span(span_name, attributes=attributes)
        self._scope = trace.use_span(self._span, end_on_exit=False)
        self._scope.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        span = self._require()
        if error is not None:
            span.record_exception(error)
            span.set_attribute(semconv.ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif self._failed is not None:
            span.set_attribute(semconv.ERROR_TYPE, "failed")
            span.set_status(Status(StatusCode.ERROR, self._failed))
        else:
            span.set_status(Status(StatusCode.OK))
        self._scope.__exit__(kind, error, traceback)
        span.end()

    async def __aenter__(self) -> Operation:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.__exit__(kind, error, traceback)

    def _require(self) -> trace.Span:
        if self._span is None:
            raise RuntimeError("the operation has not started; use it in a with block")
        return self._span


@overload
def operation(name: F, /) -> F: ...
@overload
def operation(name: str, /, *, tool: bool = False, call_id: str | None = None) -> NamedOperation: ...
@overload
def operation(*, tool: bool = False) -> Callable[[F], F]: ...


def operation(name: Any = None, /, *, tool: bool = False, call_id: str | None = None) -> Any:
    """``with operation("plan") as op: …``, ``@operation`` or ``@operation("search", tool=True)``.

    As a decorator, each call is one span named after the function (or ``name``), with the bound arguments as
    input and the return value as output; sync and async functions alike."""
    if callable(name):
        return _decorate(name, name.__name__, tool=tool)
    if name is None:
        return lambda fn: _decorate(fn, fn.__name__, tool=tool)
    return NamedOperation(name, tool=tool, call_id=call_id)


class NamedOperation(Operation):
    """An operation that can also decorate a function (each call then gets a fresh span)."""

    def __call__(self, fn: F) -> F:
        return _decorate(fn, self.name, tool=self.tool)


def _decorate(fn: F, name: str, *, tool: bool) -> F:
    signature = inspect.signature(fn)

    def arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = signature.bind_partial(*args, **kwargs)
        return dict(bound.arguments)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            async with Operation(name, tool=tool) as op:
                op.record_input(arguments(args, kwargs))
                result = await fn(*args, **kwargs)
                op.record_output(result)
                return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with Operation(name, tool=tool) as op:
            op.record_input(arguments(args, kwargs))
            result = fn(*args, **kwargs)
            op.record_output(result)
            return result

    return run  # type: ignore[return-value]
