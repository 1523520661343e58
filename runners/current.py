"""The resources of the attempt running in this context, for agent code that cannot take them as parameters.

An agent written the way its framework's docs write it defines its prompt where the framework wants it: an
OpenAI Agents SDK ``Agent(instructions=…)``, a LangChain ``ChatPromptTemplate``, an AutoGen ``AssistantAgent(
system_message=…)``, often at module level. :func:`prompt` gives that code the text of the attempt's prompt
template resource, the one APO rewrites, wherever it runs:

    INSTRUCTIONS = "You are a careful researcher."
    agent = Agent(name="rag", instructions=lambda ctx, agent: prompt("instructions", INSTRUCTIONS), tools=[search])

Safe under concurrent attempts, unlike a module global rewritten per attempt: the resources are a context variable
that the worker sets around each agent call, so each attempt's task (an async agent, and the tasks it starts) and
its thread (a sync agent) sees its own attempt's, even while other attempts run the same module's code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from lightning_store.resources import PromptTemplate

_RESOURCES: ContextVar[Mapping[str, Any] | None] = ContextVar("lightning_store_attempt_resources", default=None)


@contextlib.contextmanager
def attempt_resources(resources: Mapping[str, Any]) -> Iterator[None]:
    """Make ``resources`` (an attempt's, bound to it) the current ones within the block; what an agent call
    started in the block (a task, a copied context for a thread) keeps them after it."""
    token = _RESOURCES.set(resources)
    try:
        yield
    finally:
        _RESOURCES.reset(token)


def current_resources() -> Mapping[str, Any]:
    """The running attempt's named resources; ``LookupError`` outside an attempt (code not run by a runner)."""
    resources = _RESOURCES.get()
    if resources is None:
        raise LookupError("no attempt is running in this context (runners.current works inside a runner's agent)")
    return resources


def prompt(name: str, default: str | None = None, **values: Any) -> str:
    """The text of the running attempt's prompt template resource ``name``, filled with ``values`` when given
    (as :meth:`PromptTemplate.format` fills an f-string template); ``default`` (filled the same way) when the
    attempt has no such resource or no attempt runs, so the agent also runs outside training. ``KeyError`` with
    neither."""
    resources = _RESOURCES.get() or {}
    template = resources.get(name)
    if isinstance(template, PromptTemplate):
        return template.format(**values) if values else template.template
    if default is None:
        raise KeyError(f"the attempt has no prompt template named {name!r} and no default was given")
    return default.format(**values) if values else default
