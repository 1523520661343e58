"""The LLM an agent is given: the policy endpoint from the resources, bound to one attempt.

Through the store's LLM proxy (``{server}/rollout/{rollout_id}/attempt/{attempt_id}/v1``) every call is
recorded with its token ids; without a server (a store opened in process) the agent calls the endpoint in the
resources directly and only its own spans are captured.

With a server and no LLM in the resources, the agent still gets the proxy's address (:func:`agent_llm`), with an
empty model name: the proxy forwards its calls to the server's fallback upstream (``store serve --llm-upstream
URL --llm-model M``), naming the model ``M`` where the call names none, or answers 422 saying what to register.
Without a server there is nothing to fall back on: an agent that requires ``llm`` fails its attempt with
:class:`MissingLLMError` before it is called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_store.resources import LLM, ProxyLLM
from runners.agent import AgentSignatureError


class MissingLLMError(AgentSignatureError):
    """The agent requires an ``llm`` and neither the resources nor a server provide one."""


def proxy_base_url(server_url: str, rollout_id: str, attempt_id: str) -> str:
    """The base URL (``…/v1``) of the server's LLM proxy bound to one attempt."""
    return f"{server_url.rstrip('/')}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


def bind_resources(
    resources: Mapping[str, Any], *, rollout_id: str, attempt_id: str, server_url: str | None, token: str | None
) -> dict[str, Any]:
    """The resources with every LLM replaced by one whose endpoint is bound to this attempt."""
    bound: dict[str, Any] = {}
    for name, resource in resources.items():
        if isinstance(resource, ProxyLLM):
            bound[name] = LLM(
                endpoint=resource.get_base_url(rollout_id, attempt_id),
                model=resource.model,
                api_key=resource.api_key or token,
                sampling_parameters=resource.sampling_parameters,
            )
        elif isinstance(resource, LLM) and server_url is not None:
            bound[name] = resource.model_copy(
                update={
                    "endpoint": proxy_base_url(server_url, rollout_id, attempt_id),
                    "api_key": token or resource.api_key,
                }
            )
        else:
            bound[name] = resource
    return bound


def main_llm(resources: Mapping[str, Any]) -> LLM | None:
    """The LLM an agent's ``llm`` parameter receives: the one named ``main_llm``, else the first one."""
    llms = [r for r in resources.values() if isinstance(r, LLM)]
    named = resources.get("main_llm")
    return named if isinstance(named, LLM) else (llms[0] if llms else None)


def agent_llm(
    bound: Mapping[str, Any], *, rollout_id: str, attempt_id: str, server_url: str | None, token: str | None
) -> LLM | None:
    """What the agent's ``llm`` parameter receives, given the :func:`bind_resources` of its rollout: their
    :func:`main_llm`; with none, and a server, the server's proxy bound to this attempt with an empty model name
    (the proxy uses its fallback upstream and model); with neither, None."""
    llm = main_llm(bound)
    if llm is not None or server_url is None:
        return llm
    return LLM(endpoint=proxy_base_url(server_url, rollout_id, attempt_id), model="", api_key=token)


def missing_llm_message(rollout_id: str) -> str:
    """Why an agent that requires ``llm`` cannot run without a server, and what to do about it."""
    return (
        f"rollout {rollout_id} has no llm resource and the runner has no LLM proxy (--store is a database URL): "
        "register one with `store resources set-llm URL --model M`, or run with --store http://… against "
        "`store serve --llm-upstream URL --llm-model M`"
    )
