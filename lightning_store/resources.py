"""Training resources (LLM endpoints, prompt templates) and their versioned snapshots."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, Field, ValidationInfo
from pydantic.json_schema import SkipJsonSchema

WRITING = {"writing": True}
"""The validation context of a snapshot the store is about to write: only then are endpoints checked, so that a
snapshot stored before the check existed still reads back."""


def _http_url(value: str, info: ValidationInfo) -> str:
    """An endpoint the proxy and agents can call: an http(s) URL with a host (an empty or ``javascript:`` endpoint
    was once stored, and every call of its rollouts then failed with a 502). Checked when writing."""
    if not (info.context or {}).get("writing"):
        return value
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1")
    return value


Endpoint = Annotated[str, AfterValidator(_http_url)]


class LLM(BaseModel):
    """An OpenAI-compatible endpoint serving a model under a name."""

    resource_type: Literal["llm"] = "llm"
    endpoint: Endpoint
    model: str
    api_key: str | None = None
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    # Left out of the OpenAPI document (accepted and returned all the same): schemathesis could not generate the
    # negative cases of the resources routes with it there (`not` without a spelled-out complement).
    max_tokens_cap: SkipJsonSchema[int | None] = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="The most tokens a call through the store's proxy may ask of this LLM: a larger `max_tokens` "
        "(or `max_completion_tokens`) is lowered to it, and a call that asks for none gets it. For agents that ask "
        "for thousands of tokens where a small model on a CPU should write a few dozen.",
    )
    forced_parameters: SkipJsonSchema[dict[str, Any] | None] = Field(
        default=None,
        description="Request fields the store's proxy sets on every call to this LLM, replacing what the agent "
        'asked: `{"tool_choice": "required"}` for a framework that always asks `auto` (AutoGen), where a small '
        "model left to choose never calls its tool.",
    )

    def get_base_url(self, *args: Any, **kwargs: Any) -> str:
        """The endpoint (Agent Lightning's ``LLM.get_base_url``: an LLM a runner gives an agent is bound to its
        attempt already, so the rollout and attempt ids change nothing)."""
        return self.endpoint


class ProxyLLM(BaseModel):
    """An LLM reached through the store's proxy, which binds each call to a rollout attempt."""

    resource_type: Literal["proxy_llm"] = "proxy_llm"
    endpoint: Endpoint
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
