"""Typed records of LLM calls: exactly the token ids the policy saw and produced, for training without
re-tokenizing. The proxy writes one per call; adapters read them back as transitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from lightning_store.limits import MAX_ID_LENGTH, MAX_INT32, Id, OtelId, SequenceId

TokenId = Annotated[int, Field(ge=0, le=MAX_INT32)]
"""A vocabulary index."""
Logprob = Annotated[float, Field(allow_inf_nan=False)]
"""A finite log-probability (NaN and infinities are not JSON, and no backend stores them as numbers)."""

if TYPE_CHECKING:
    from lightning_store.spans import Span


class LlmCall(BaseModel):
    """One LLM call of an attempt. ``(rollout_id, attempt_id, span_id)`` identifies it when ``span_id`` is set
    (the proxy sets it to the call's span), which makes recording it twice harmless."""

    rollout_id: Id
    attempt_id: Id
    span_id: OtelId | None = None
    sequence_id: SequenceId | None = Field(
        default=None, description="Order within the rollout (the span's sequence id)."
    )
    agent_name: str | None = None
    model: str | None = None
    resources_id: Id | None = None
    resources_version: int | None = Field(default=None, ge=0, le=MAX_INT32)
    llm_resource: str | None = Field(
        default=None,
        max_length=MAX_ID_LENGTH,
        description="The name of the llm resource that served the call (the proxy routes a call naming a "
        "resource, or its model, to it); None for the server's fallback upstream or a call recorded otherwise.",
    )
    prompt_token_ids: list[TokenId]
    response_token_ids: list[TokenId]
    response_logprobs: list[Logprob] | None = None
    request: dict[str, Any] | None = Field(default=None, description="The request as the agent sent it.")
    response: dict[str, Any] | None = Field(default=None, description="The response as the agent received it.")
    sampling_parameters: dict[str, Any] | None = None
    finish_reason: str | None = Field(default=None, max_length=32)
    error: str | None = Field(
        default=None,
        description="Why this call is not a training transition: its answer could not be read as one (token ids or "
        "logprobs malformed, the answer not storable as JSON). Its token ids are then empty and ``response`` keeps "
        'what came back (``{"raw": …}`` when it was not a storable JSON object). None for a trainable call.',
    )
    start_time: float
    end_time: float | None = None
    latency_seconds: float | None = None


def numbered_calls(records: Sequence[tuple[Span, LlmCall | None]], added: Sequence[Span]) -> list[LlmCall]:
    """The LLM calls of a batch of proxied-call ``records`` whose spans were stored as new (``added``, numbered
    by the store), each with its span's sequence id. A failed call has none; a call whose span was a duplicate
    was recorded with it the first time."""
    numbers = {(span.attempt_id, span.span_id): span.sequence_id for span in added}
    return [
        call.model_copy(update={"sequence_id": numbers[key]})
        for _, call in records
        if call is not None and (key := (call.attempt_id, call.span_id)) in numbers
    ]
