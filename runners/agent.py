"""Agents as plain functions: ``@rollout def agent(task, llm, resources) -> float | None``.

The first parameter receives the rollout's input (the task). Other parameters are filled by name:

* ``llm`` - the :class:`~lightning_store.resources.LLM` to call, its endpoint bound to this attempt (through the
  store's proxy when there is one). With no LLM in the resources: through a server, its proxy with an empty model
  name (the server's ``--llm-upstream`` and ``--llm-model`` answer); without one, None when the parameter has a
  default, else the attempt fails before the agent is called (:mod:`runners.endpoint`);
* ``resources`` - every named resource (LLMs bound the same way);
* ``rollout`` - the :class:`~lightning_store.models.Rollout` being run;
* any other name - the resource of that name (``prompt_template``, say), or the parameter's default.

Returning a number emits it as the final reward; returning None emits nothing (the agent may have called
``emit_reward`` itself); raising marks the attempt failed and records the exception as a span.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_store.models import Rollout

_SPECIAL = ("llm", "resources", "rollout")


class AgentSignatureError(TypeError):
    """The agent's parameters cannot be filled for a rollout."""


@dataclass(frozen=True)
class RolloutAgent:
    """A function that runs one rollout, with what the runner needs to know to call it."""

    fn: Callable[..., Any]
    name: str
    is_async: bool

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @functools.cached_property
    def parameters(self) -> tuple[inspect.Parameter, ...]:
        """The function's parameters, read once (not per attempt: ``inspect.signature`` is not free)."""
        return tuple(inspect.signature(self.fn).parameters.values())

    def requires(self, name: str) -> bool:
        """Whether the agent has a parameter ``name`` (after the task) without a default."""
        return any(p.name == name and p.default is inspect.Parameter.empty for p in self.parameters[1:])

    def arguments(
        self, task: Any, *, llm: Any, resources: Mapping[str, Any], rollout: Rollout
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments for one call."""
        parameters = self.parameters
        if not parameters or parameters[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise AgentSignatureError(f"agent {self.name} must take the task as its first parameter")
        available = {"llm": llm, "resources": dict(resources), "rollout": rollout}
        kwargs: dict[str, Any] = {}
        for parameter in parameters[1:]:
            if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            if parameter.name in available:
                kwargs[parameter.name] = available[parameter.name]
            elif parameter.name in resources:
                kwargs[parameter.name] = resources[parameter.name]
            elif parameter.default is inspect.Parameter.empty:
                known = ", ".join([*_SPECIAL, *resources])
                raise AgentSignatureError(f"agent {self.name}: nothing to pass as {parameter.name!r} (known: {known})")
        return (task,), kwargs


def rollout(fn: Callable[..., Any]) -> RolloutAgent:
    """Mark a function (sync or async) as an agent the runner can run."""
    if isinstance(fn, RolloutAgent):
        return fn
    return RolloutAgent(fn=fn, name=getattr(fn, "__qualname__", repr(fn)), is_async=inspect.iscoroutinefunction(fn))


class AgentNotLoadable(RuntimeError):
    """The agent named on the command line cannot be loaded (its module does not import, it has no such name, it
    is not callable): no worker can ever run it, so the runner stops at once with this one line."""


def agent_problem(spec: str, error: BaseException) -> str:
    """One line on why ``spec`` did not load, with what to check."""
    if isinstance(error, ModuleNotFoundError) and error.name and spec.partition(":")[0].startswith(error.name):
        return (
            f"cannot import {spec.partition(':')[0]!r} (no module named {error.name!r}; run from the directory "
            "that holds it, and give it as module:function without .py)"
        )
    return f"cannot load the agent {spec!r}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def load_agent(spec: str) -> RolloutAgent:
    """The agent at ``package.module:name``: a ``@rollout`` function, any plain function, or an object (or a class
    made without arguments) with ``as_rollout_agent()`` (an Agent Lightning ``LitAgent``,
    :mod:`runners.agentlightning`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"an agent is given as module:name, not {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if isinstance(target, type) and hasattr(target, "as_rollout_agent"):
        target = target()  # an agent class made without arguments (Agent Lightning's LitAgent)
    convert = getattr(target, "as_rollout_agent", None)
    if callable(convert):  # an agent object that says how to run it (runners.agentlightning.LitAgent)
        agent: RolloutAgent = convert()
        return agent
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return rollout(target)
