"""The transcript rules (``lightning_store.transcript``) on spans and LLM-call records made by hand: the cases a
real run of the acceptance test does not produce."""

from __future__ import annotations

from typing import Any

from lightning_store.llm_calls import LlmCall
from lightning_store.models import Attempt
from lightning_store.spans import Span
from lightning_store.transcript import attempt_error, build_transcript, first_line, last_reward, reward_of


def span(name: str, seq: int, at: float, attempt: str = "at-1", **fields: Any) -> Span:
    return Span(
        rollout_id="ro-1",
        attempt_id=attempt,
        sequence_id=seq,
        trace_id="t",
        span_id=f"s{seq}",
        name=name,
        start_time=at,
        end_time=at,
        **fields,
    )


def call(seq: int, at: float, messages: list[dict[str, Any]], reply: str) -> LlmCall:
    return LlmCall(
        rollout_id="ro-1",
        attempt_id="at-1",
        span_id=f"c{seq}",
        sequence_id=seq,
        prompt_token_ids=list(range(seq + 2)),
        response_token_ids=[7],
        request={"messages": messages},
        response={"choices": [{"message": {"role": "assistant", "content": reply}}]},
        start_time=at,
    )


def attempt(status: str, metadata: dict[str, Any] | None = None) -> Attempt:
    return Attempt(rollout_id="ro-1", attempt_id="at-1", sequence_id=1, start_time=0, status=status, metadata=metadata)


def test_rewards_are_read_as_the_views_read_them() -> None:
    assert reward_of(span("agentlightning.annotation", 1, 0, attributes={"agentlightning.reward.0.value": 2})) == 2.0
    assert reward_of(span("agentlightning.reward", 1, 0, attributes={"reward": 0.5})) == 0.5  # legacy emitters
    assert reward_of(span("other", 1, 0, attributes={"reward": 0.5})) is None
    assert (
        reward_of(span("agentlightning.annotation", 1, 0, attributes={"agentlightning.reward.0.value": True})) is None
    )
    rewards = [span("agentlightning.annotation", s, 0, attributes={"agentlightning.reward.0.value": s}) for s in (3, 1)]
    assert last_reward(rewards) == 3.0 and last_reward([]) is None


def test_why_an_attempt_failed() -> None:
    raised = span("agentlightning.exception", 2, 0, status={"status_code": "ERROR", "description": "ValueError: x\ny"})
    assert attempt_error(attempt("failed"), [raised]) == "ValueError: x\ny"
    assert first_line("ValueError: x\ny") == "ValueError: x" and first_line("abcdef", 4) == "abc…"
    assert attempt_error(attempt("succeeded"), [raised]) is None
    assert attempt_error(attempt("failed", {"released": "worker stopped"}), []) == "released: worker stopped"
    assert attempt_error(attempt("timeout"), []) == "the attempt timed out"
    assert attempt_error(attempt("failed"), []) is None
    other_attempt = span("agentlightning.exception", 3, 0, attempt="at-2", status={"description": "E: other"})
    assert attempt_error(attempt("failed"), [other_attempt]) is None


def test_events_in_time_order_with_only_new_messages() -> None:
    system, user = {"role": "system", "content": "sys"}, {"role": "user", "content": "q"}
    first = call(1, 1.0, [system, user], "plan")
    second = call(
        2, 3.0, [system, user, {"role": "assistant", "content": "plan"}, {"role": "user", "content": "r"}], "ok"
    )
    again = call(3, 4.0, [system, user], "plan")  # the same prompt again: nothing is new, everything is shown
    tool = span("execute_tool search", 9, 2.0, attributes={"gen_ai.tool.name": "search", "input.value": '{"q": 1}'})
    hidden = span("chat scripted", 1, 1.0, attributes={"lightning_store.llm_call": True})
    hidden.span_id = "c1"  # the proxy's span of the first call
    failed_call = span("chat m", 4, 5.0, attributes={"lightning_store.llm_call": True}, status={"status_code": "ERROR"})

    events = build_transcript([tool, hidden, failed_call], [first, second, again])

    assert [e["event"] for e in events] == ["llm_call", "tool", "llm_call", "llm_call", "llm_error", "totals"]
    assert [e["earlier_messages"] for e in events if e["event"] == "llm_call"] == [0, 3, 0]
    assert events[2]["messages"] == [{"role": "user", "content": "r"}] and events[2]["response"] == "ok"
    assert len(events[3]["messages"]) == 2
    assert events[1]["name"] == "search" and events[1]["input"] == {"q": 1}
    totals = events[-1]
    assert (totals["llm_calls"], totals["prompt_tokens"], totals["completion_tokens"]) == (3, 3 + 4 + 5, 3)
    full = build_transcript([], [first, second], full=True, tokens=True)
    assert len(full[1]["messages"]) == 4 and full[1]["prompt_token_ids"] == [0, 1, 2, 3]


def test_rewards_messages_objects_and_other_errors() -> None:
    reward = span(
        "agentlightning.annotation",
        1,
        1.0,
        attributes={
            "agentlightning.reward.0.name": "task",
            "agentlightning.reward.0.value": 1,
            "agentlightning.reward.1.name": "speed",
            "agentlightning.reward.1.value": 0.5,
            "agentlightning.rollout_id": "ro-1",
            "feedback": "good",
        },
    )
    message = span("agentlightning.message", 2, 2.0, attributes={"agentlightning.message.body": "hello"})
    obj = span("agentlightning.object", 3, 3.0, attributes={"agentlightning.object.json": '{"a": 1}'})
    chain = span("LangGraph", 4, 4.0, status={"status_code": "ERROR", "description": "boom"})
    quiet = span("invoke_agent planner", 5, 5.0)

    events = build_transcript([reward, message, obj, chain, quiet], [])

    assert events[0] | {"time": 0} == {
        "event": "reward",
        "time": 0,
        "sequence_id": 1,
        "value": 1.0,
        "name": "task",
        "dimensions": {"task": 1, "speed": 0.5},
        "attributes": {"feedback": "good"},
    }
    assert events[1]["text"] == "hello" and events[2]["value"] == {"a": 1}
    assert events[3] | {"time": 0} == {
        "event": "error",
        "time": 0,
        "sequence_id": 4,
        "name": "LangGraph",
        "error": "boom",
    }
    assert [e["event"] for e in events] == ["reward", "message", "object", "error", "totals"]
    assert events[-1]["reward"] == 1.0
