"""Training resources (LLM endpoints, prompt templates) and their versioned snapshots."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class LLM(BaseModel):
    """An OpenAI-compatible endpoint serving a model under a name."""

    resource_type: Literal["llm"] = "llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)


class ProxyLLM(BaseModel):
    """An LLM reached through the store's proxy, which binds each call to a rollout attempt."""

    resource_type: Literal["proxy_llm"] = "proxy_llm"
    endpoint: str
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)

    def get_base_url(self, rollout_id: str | None, attempt_id: str | None) -> str:
        """The endpoint with ``/rollout/{rollout_id}/attempt/{attempt_id}`` inserted before ``/v1``."""
        if rollout_id is None and attempt_id is None:
            return self.endpoint
        if rollout_id is None or attempt_id is None:
            raise ValueError("rollout_id and attempt_id must both be given or both be None")
        prefix = self.endpoint.rstrip("/")
        has_v1 = prefix.endswith("/v1")
        if has_v1:
            prefix = prefix[: -len("/v1")]
        prefix += f"/rollout/{rollout_id}/attempt/{attempt_id}"
        return prefix + "/v1" if has_v1 else prefix


class PromptTemplate(BaseModel):
    """A prompt template that prompt optimization may rewrite."""

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["jinja", "f-string", "poml"]

    def format(self, **kwargs: Any) -> str:
        if self.engine != "f-string":
            raise NotImplementedError(f"format() supports the f-string engine only, not {self.engine!r}")
        return self.template.format(**kwargs)


ResourceUnion = Annotated[LLM | ProxyLLM | PromptTemplate, Field(discriminator="resource_type")]
NamedResources = dict[str, ResourceUnion]


class ResourcesUpdate(BaseModel):
    """A named snapshot of resources. ``version`` counts updates of this id, starting at 1."""

    resources_id: str
    create_time: float
    update_time: float
    version: int
    resources: NamedResources
