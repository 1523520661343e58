"""The LLM an agent is given: the policy endpoint from the resources, bound to one attempt.

Through the store's LLM proxy (``{server}/rollout/{rollout_id}/attempt/{attempt_id}/v1``) every call is
recorded with its token ids; without a server (a store opened in process) the agent calls the endpoint in the
resources directly and only its own spans are captured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_store.resources import LLM, ProxyLLM


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
                    "endpoint": f"{server_url.rstrip('/')}/rollout/{rollout_id}/attempt/{attempt_id}/v1",
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
