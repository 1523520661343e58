"""Zero-code-change capture of LangChain, OpenAI Agents SDK and AutoGen agents with OpenInference (the
``openinference`` extra).

Contract of :func:`instrument`:

* Each requested framework is instrumented with its OpenInference instrumentor on the process's tracer provider
  (:func:`tracers.provider.install`). Its spans are then ordinary spans of that provider: one started inside a
  :meth:`tracers.Tracer.attempt` block, or in a task or thread the framework starts from there with the context
  copied (asyncio tasks, ``asyncio.to_thread``, LangChain's executor for sync callbacks), is stamped with the
  attempt's ids and written to its store; one started outside any attempt is not written.
* ``frameworks=None`` means every framework whose library and instrumentor are both installed (none: ``[]``); one
  that cannot be instrumented (its instrumentor refuses the installed version) is skipped with a warning. Naming
  one that is not installed raises ``ModuleNotFoundError`` naming the extra to install, one that cannot be
  instrumented ``ImportError`` or ``RuntimeError``, an unknown name ``ValueError``.
* Idempotent and thread-safe: a framework already instrumented (here, or by the application through the same
  instrumentor) is left as it is and still returned. The return value lists the frameworks instrumented, in
  :data:`FRAMEWORKS` order.
* The OpenAI Agents SDK instrumentor replaces the SDK's own trace processors, so nothing is sent to OpenAI's trace
  backend. Disabling the SDK's tracing (``OPENAI_AGENTS_DISABLE_TRACING``, ``set_tracing_disabled``) disables its
  spans here too.

How these spans name agents and record tool status is in ``docs/reference/spans.md``.
:func:`instrument_from_settings` is what the runner's worker processes call at start-up
(``LIGHTNING_STORE_INSTRUMENT``: ``auto``, ``none`` or a comma list).
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

from lightning_store.settings import RunnerSettings
from tracers import provider


@dataclass(frozen=True)
class Framework:
    """A framework OpenInference can instrument: its distribution and its instrumentor's."""

    library: str
    """The framework's distribution (what must be installed for it to be instrumented)."""
    instrumentor: str
    """The OpenInference instrumentor's distribution."""
    target: str
    """``module:Class`` of the instrumentor."""
    module: str
    """The framework's top-level import name (``auto`` instruments frameworks already imported)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``instrument()`` besides the tracer provider."""
    duplicate: Callable[[ReadableSpan], bool] | None = None
    """The framework's own spans that the instrumentation records again: not written once it is instrumented."""


def autogen_tool_span(span: ReadableSpan) -> bool:
    """AutoGen's own ``execute_tool`` span (its GenAI telemetry): no input, no output, status UNSET; the
    OpenInference instrumentation's tool span for the same call has all three."""
    scope = span.instrumentation_scope
    attributes = span.attributes or {}
    return (
        scope is not None and scope.name == "autogen-core" and attributes.get("gen_ai.operation.name") == "execute_tool"
    )


FRAMEWORKS: dict[str, Framework] = {
    "langchain": Framework(
        "langchain-core",
        "openinference-instrumentation-langchain",
        "openinference.instrumentation.langchain:LangChainInstrumentor",
        "langchain_core",
    ),
    "openai-agents": Framework(
        "openai-agents",
        "openinference-instrumentation-openai-agents",
        "openinference.instrumentation.openai_agents:OpenAIAgentsInstrumentor",
        "agents",
        {"exclusive_processor": True},
    ),
    "autogen": Framework(
        "autogen-agentchat",
        "openinference-instrumentation-autogen-agentchat",
        "openinference.instrumentation.autogen_agentchat:AutogenAgentChatInstrumentor",
        "autogen_agentchat",
        duplicate=autogen_tool_span,
    ),
}

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def installed(name: str) -> bool:
    """Whether the framework and its instrumentor are both installed."""
    framework = FRAMEWORKS[name]
    return all(_has(distribution) for distribution in (framework.library, framework.instrumentor))


def instrument(frameworks: Iterable[str] | None = None, *, loaded_only: bool = False) -> list[str]:
    """Instrument the frameworks (default: every one installed; with ``loaded_only``, every one installed that
    the process has already imported) on the process's tracer provider; see the module docstring for the
    contract. Returns the names instrumented."""
    if frameworks is None:
        names = [
            name
            for name in FRAMEWORKS
            if installed(name) and (not loaded_only or FRAMEWORKS[name].module in sys.modules)
        ]
    else:
        requested = {name.strip().lower() for name in frameworks}
        if unknown := sorted(requested - FRAMEWORKS.keys()):
            raise ValueError(f"unknown framework(s) {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")
        names = [name for name in FRAMEWORKS if name in requested]
        for name in names:
            _require(name)
    if not names:
        return []
    provider.install()
    tracer_provider = trace.get_tracer_provider()
    with _lock:
        done = [name for name in names if _instrument_one(name, tracer_provider, strict=frameworks is not None)]
    return done


def instrument_from_settings(setting: str | None = None) -> list[str]:
    """Instrument what ``setting`` (default: ``LIGHTNING_STORE_INSTRUMENT``) asks for: ``auto`` for every
    installed framework that is already imported (the worker calls this after importing the agent's module, so
    an agent that uses neither framework pays nothing), ``none`` (or empty) for none, or a comma list of
    framework names (imported here if need be)."""
    value = (RunnerSettings().instrument if setting is None else setting).strip().lower()
    if value == "auto":
        return instrument(loaded_only=True)
    if value in ("", "none"):
        return []
    return instrument([name for name in value.split(",") if name.strip()])


def _instrument_one(name: str, tracer_provider: trace.TracerProvider, *, strict: bool) -> bool:
    """Instrument one framework; when it cannot be, raise (``strict``) or log a warning and return False."""
    framework = FRAMEWORKS[name]
    module, _, cls = framework.target.partition(":")
    try:
        instrumentor = getattr(importlib.import_module(module), cls)()  # a singleton per class
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=tracer_provider, **framework.options)
            if not instrumentor.is_instrumented_by_opentelemetry:
                # BaseInstrumentor logs and skips when the installed framework is older than it supports.
                raise RuntimeError(
                    f"{framework.instrumentor} refused to instrument {framework.library} "
                    f"{metadata.version(framework.library)} (too old for it?)"
                )
            logger.info("instrumented %s with OpenInference", name)
        if framework.duplicate is not None:
            provider.install().skip(framework.duplicate)
    except (ImportError, RuntimeError) as error:
        if strict:
            raise
        logger.warning("not instrumenting %s: %s", name, error)
        return False
    return True


def _require(name: str) -> None:
    framework = FRAMEWORKS[name]
    missing = [d for d in (framework.library, framework.instrumentor) if not _has(d)]
    if missing:
        raise ModuleNotFoundError(
            f"instrumenting {name} needs {' and '.join(missing)}, which is not installed: install "
            f"{framework.library} and pip install 'lightning-store[openinference]'"
        )


def _has(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
