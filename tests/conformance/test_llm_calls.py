"""Typed LLM-call records: stored as given, read back in rollout order, duplicates ignored, bad ones refused."""

from __future__ import annotations

import pytest

from lightning_store import InvalidRequestError, LlmCall, NotFoundError
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptedRollout


def call(rollout: AttemptedRollout, span_id: str | None, sequence_id: int, **changes: object) -> LlmCall:
    fields: dict[str, object] = {
        "rollout_id": rollout.rollout_id,
        "attempt_id": rollout.attempt.attempt_id,
        "span_id": span_id,
        "sequence_id": sequence_id,
        "agent_name": "planner",
        "model": "tiny",
        "resources_id": None,
        "resources_version": 3,
        "prompt_token_ids": [1, 2, 3],
        "response_token_ids": [7, 8],
        "response_logprobs": [-0.5, -0.25],
        "sampling_parameters": {"temperature": 0.7},
        "finish_reason": "stop",
        "start_time": 100.0,
        "end_time": 100.5,
        "latency_seconds": 0.5,
    }
    fields.update(changes)
    return LlmCall.model_validate(fields)


async def test_calls_round_trip_in_sequence_order(store: LightningStore) -> None:
    first = await store.start_rollout(1)
    second = await store.start_rollout(2)
    later, earlier = call(first, "s2", 2, response_token_ids=[9]), call(first, "s1", 1)
    other = call(second, "s1", 1, agent_name="critic")
    await store.add_llm_calls([later, other, earlier])
    assert await store.query_llm_calls([first.rollout_id]) == [earlier, later]
    both = await store.query_llm_calls([first.rollout_id, second.rollout_id])
    assert {c.rollout_id for c in both} == {first.rollout_id, second.rollout_id} and len(both) == 3
    assert await store.query_llm_calls([first.rollout_id], attempt_id="at-none") == []


async def test_absent_parts_and_any_json_round_trip(store: LightningStore) -> None:
    """A call without logprobs, request, response or sampling parameters, and one whose response holds what
    JSON columns must keep (a float with a large exponent, text beyond ASCII, nesting), come back as given."""
    rollout = await store.start_rollout(1)
    bare = call(rollout, "s1", 1, response_logprobs=None, sampling_parameters=None, finish_reason=None)
    rich = call(
        rollout,
        "s2",
        2,
        request={"messages": [{"role": "user", "content": "Größe? 日本"}], "n": None},
        response={"usage": {"big": 1.5e16, "small": -2.5e-12, "int": 2**62}, "choices": [[{}], []]},
    )
    await store.add_llm_calls([bare, rich])
    assert await store.query_llm_calls([rollout.rollout_id]) == [bare, rich]


async def test_a_repeated_call_is_ignored(store: LightningStore) -> None:
    rollout = await store.start_rollout(1)
    await store.add_llm_calls([call(rollout, "s1", 1)])
    await store.add_llm_calls([call(rollout, "s1", 1, response_token_ids=[99])])
    stored = await store.query_llm_calls([rollout.rollout_id])
    assert [c.response_token_ids for c in stored] == [[7, 8]]


async def test_unknown_attempt_writes_nothing(store: LightningStore) -> None:
    rollout = await store.start_rollout(1)
    with pytest.raises(NotFoundError) as error:
        await store.add_llm_calls([call(rollout, "s1", 1), call(rollout, "s2", 2, attempt_id="at-missing")])
    assert error.value.field == "calls.1.attempt_id"
    assert await store.query_llm_calls([rollout.rollout_id]) == []


async def test_malformed_call_is_refused_with_its_field(store: LightningStore) -> None:
    rollout = await store.start_rollout(1)
    bad = call(rollout, "s1", 1).model_dump()
    bad["prompt_token_ids"] = ["a"]
    with pytest.raises(InvalidRequestError) as error:
        await store.add_llm_calls([bad])  # type: ignore[list-item]
    assert error.value.field == "calls.0.prompt_token_ids.0"
    assert await store.query_llm_calls([rollout.rollout_id]) == []
