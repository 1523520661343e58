"""Typed records of LLM calls: exactly the token ids the policy saw and produced, for training without
re-tokenizing. The proxy writes one per call; adapters read them back as transitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from lightning_store.limits import MAX_INT32, Id, OtelId, SequenceId

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
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float] | None = None
    request: dict[str, Any] | None = Field(default=None, description="The request as the agent sent it.")
    response: dict[str, Any] | None = Field(default=None, description="The response as the agent received it.")
    sampling_parameters: dict[str, Any] | None = None
    finish_reason: str | None = Field(default=None, max_length=32)
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
