"""Agent Lightning 0.3's agent API, so that an agent written for it runs under ``store run`` with one import changed::

    import agentlightning as agl              →   import runners.agentlightning as agl
    from agentlightning import LitAgent, …    →   from runners.agentlightning import LitAgent, …

What it covers, with Agent Lightning's semantics:

* ``@rollout`` (and ``@llm_rollout``, ``@prompt_rollout``) on ``[async] def agent(task, llm[, rollout])`` or
  ``(task, prompt_template[, rollout])``: ``llm`` is the rollout's LLM (the resource named ``main_llm``, else the
  first; bound to the attempt, so calls go through the store's proxy), ``prompt_template`` the first prompt
  template of the resources, whatever its name. A returned number is the rollout's reward; ``None`` leaves it to
  ``emit_reward``.
* ``LitAgent`` subclasses overriding ``rollout`` / ``rollout_async`` (or ``training_rollout`` and
  ``validation_rollout``, chosen by the rollout's mode) with ``(task, resources, rollout)``; ``store run --agent
  module:instance`` (or the class, made without arguments). ``self.tracer.get_langchain_handler()`` answers None:
  ``store run`` captures LangChain through OpenInference, with no callback to pass.
* ``LLM.get_base_url(rollout_id, attempt_id)`` (the LLM is bound already: its endpoint), ``ProxyLLM``,
  ``PromptTemplate.format``, ``emit_reward(reward, primary_key=…)``, ``emit_message``, ``emit_object``,
  ``emit_exception``, ``operation``, and the store's types (``Rollout``, ``Attempt``, ``NamedResources``).

Not covered: Agent Lightning's ``Trainer``, runners, tracers and algorithms (``store run`` and ``store train``
replace them: see docs/how-to/switch-from-agent-lightning.md), and ``LitAgent(trained_agents=…)``, which this
store reads from the algorithm's configuration (``agents:``) instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from lightning_store.models import Attempt, AttemptedRollout, Rollout
from lightning_store.resources import LLM, NamedResources, PromptTemplate, ProxyLLM
from runners.agent import AgentSignatureError, RolloutAgent
from tracers import emit_exception, emit_message, emit_object, operation
from tracers import emit_reward as _emit_reward

__all__ = [
    "LLM",
    "Attempt",
    "AttemptedRollout",
    "LitAgent",
    "NamedResources",
    "PromptTemplate",
    "ProxyLLM",
    "Rollout",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "llm_rollout",
    "operation",
    "prompt_rollout",
    "rollout",
]

_ARGUMENTS = ("llm", "prompt_template")


def emit_reward(
    reward: float | Mapping[str, float],
    *,
    primary_key: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    propagate: bool = True,
) -> None:
    """Agent Lightning's ``emit_reward``: a reward span on the current attempt (``propagate=False``: none)."""
    if propagate:
        _emit_reward(reward, primary=primary_key, attributes=attributes)


def rollout(fn: Callable[..., Any]) -> RolloutAgent:
    """Agent Lightning's ``@rollout``: ``fn(task, llm[, rollout])`` or ``fn(task, prompt_template[, rollout])``."""
    names = [p.name for p in inspect.signature(fn).parameters.values()]
    wanted = [name for name in names[1:] if name in _ARGUMENTS]
    if len(wanted) != 1 or set(names[1:]) - {*wanted, "rollout"}:
        raise AgentSignatureError(
            f"{getattr(fn, '__qualname__', fn)!r}: an Agent Lightning rollout takes (task, llm[, rollout]) or "
            f"(task, prompt_template[, rollout]), not ({', '.join(names)})"
        )
    takes_rollout = "rollout" in names

    def arguments(resources: Mapping[str, Any], llm: LLM | None, attempted: Rollout) -> dict[str, Any]:
        value = llm if wanted[0] == "llm" else _first_prompt_template(resources)
        return {wanted[0]: value, **({"rollout": attempted} if takes_rollout else {})}

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(task: Any, resources: Any, rollout: Rollout, llm: LLM | None = None) -> Any:
            return await fn(task, **arguments(resources, llm, rollout))

        return RolloutAgent(fn=_unwrapped(run_async), name=fn.__qualname__, is_async=True)

    @functools.wraps(fn)
    def run(task: Any, resources: Any, rollout: Rollout, llm: LLM | None = None) -> Any:
        return fn(task, **arguments(resources, llm, rollout))

    return RolloutAgent(fn=_unwrapped(run), name=fn.__qualname__, is_async=False)


llm_rollout = rollout
prompt_rollout = rollout


def _unwrapped(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``functools.wraps`` copies the agent's ``__wrapped__``, through which ``inspect.signature`` would read the
    agent's parameters instead of the wrapper's (the ones the runner must fill)."""
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    return wrapper


def _first_prompt_template(resources: Mapping[str, Any]) -> PromptTemplate | None:
    return next((r for r in resources.values() if isinstance(r, PromptTemplate)), None)


class _Tracer:
    """What an agent reaches through ``self.tracer``."""

    def get_langchain_handler(self, tags: list[str] | None = None) -> Any:
        """None: LangChain is traced by OpenInference in ``store run``'s workers, with no callback to pass."""
        return None

    get_langchain_callback_handler = get_langchain_handler


class LitAgent:
    """Agent Lightning's agent class. Override ``rollout`` (or ``rollout_async``), or ``training_rollout`` and
    ``validation_rollout`` (or their ``_async`` forms), each ``(task, resources, rollout) -> float | None``."""

    def __init__(self, *, trained_agents: str | None = None) -> None:
        self.trained_agents = trained_agents
        self.tracer = _Tracer()

    def rollout(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        raise NotImplementedError(f"{type(self).__name__} overrides neither rollout nor rollout_async")

    async def rollout_async(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        raise NotImplementedError(f"{type(self).__name__} overrides neither rollout nor rollout_async")

    def training_rollout(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        return self.rollout(task, resources, rollout)

    def validation_rollout(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        return self.rollout(task, resources, rollout)

    async def training_rollout_async(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        return await self.rollout_async(task, resources, rollout)

    async def validation_rollout_async(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        return await self.rollout_async(task, resources, rollout)

    def is_async(self) -> bool:
        """Whether the subclass overrides an async method (then the async ones are called, as Agent Lightning
        does)."""
        names = ("rollout_async", "training_rollout_async", "validation_rollout_async")
        return any(getattr(type(self), name) is not getattr(LitAgent, name) for name in names)

    def as_rollout_agent(self) -> RolloutAgent:
        """The agent as ``store run`` runs it: the training or validation method by the rollout's mode."""
        name = type(self).__qualname__
        if self.is_async():

            async def run_async(task: Any, resources: Any, rollout: Rollout) -> Any:
                method = self.training_rollout_async if rollout.mode == "train" else self.validation_rollout_async
                return await method(task, resources, rollout)

            return RolloutAgent(fn=run_async, name=name, is_async=True)

        def run(task: Any, resources: Any, rollout: Rollout) -> Any:
            method = self.training_rollout if rollout.mode == "train" else self.validation_rollout
            return method(task, resources, rollout)

        return RolloutAgent(fn=run, name=name, is_async=False)
