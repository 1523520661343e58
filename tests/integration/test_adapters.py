"""Adapters read rollouts back from a real store (in process on SQLite, over HTTP on Postgres) and produce one
transition per LLM call of the attempt that counts, with credit assignment and agent selection."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from adapters import AIR, Discounted, TransitionAdapter, read_episodes, transcripts
from lightning_store import LlmCall, RolloutConfig
from lightning_store import semconv as sc
from lightning_store.contract import LightningStore
from lightning_store.models import Attempt, AttemptedRollout
from lightning_store.spans import Span, TraceStatus

pytestmark = pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("http-postgres", marks=pytest.mark.postgres)], indirect=True
)


def llm_call(claimed: AttemptedRollout, index: int, *, agent: str | None = "planner", start: float) -> LlmCall:
    return LlmCall(
        rollout_id=claimed.rollout_id,
        attempt_id=claimed.attempt.attempt_id,
        span_id=f"call{index}",
        sequence_id=index,
        agent_name=agent,
        resources_id="r1",
        resources_version=2,
        prompt_token_ids=[1, 2, index],
        response_token_ids=[10 + index, 11 + index],
        response_logprobs=[-0.5, -0.25],
        request={"messages": [{"role": "user", "content": f"turn {index}"}], "tools": [{"type": "function"}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"answer {index}", "token_ids": [1]}}]},
        start_time=start,
        end_time=start + 0.5,
    )


def span(claimed: AttemptedRollout, seq: int, name: str, start: float, end: float, **attributes: object) -> Span:
    status = TraceStatus(status_code="ERROR") if attributes.pop("failed", False) else TraceStatus()
    return Span(
        rollout_id=claimed.rollout_id,
        attempt_id=claimed.attempt.attempt_id,
        sequence_id=seq,
        trace_id="a" * 32,
        span_id=f"span{seq}",
        name=name,
        start_time=start,
        end_time=end,
        status=status,
        attributes=attributes,
    )


def reward(claimed: AttemptedRollout, seq: int, value: float) -> Span:
    return span(claimed, seq, sc.ANNOTATION, 50.0, 50.0, **{sc.reward_name(0): "primary", sc.reward_value(0): value})


async def finished(
    store: LightningStore, task: object, calls: int, reward_value: float | None, spans: Sequence[Span] = ()
) -> AttemptedRollout:
    """A rollout run to success: ``calls`` LLM calls 10 s apart from t=10, the reward, and extra spans."""
    await store.enqueue_rollout(task, metadata={"task_id": f"task-{task}"})
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.add_llm_calls([llm_call(claimed, i, start=10.0 * (i + 1)) for i in range(calls)])
    extra = [
        s.model_copy(update={"rollout_id": claimed.rollout_id, "attempt_id": claimed.attempt.attempt_id}) for s in spans
    ]
    if reward_value is not None:
        extra.append(reward(claimed, 99, reward_value))
    if extra:
        await store.add_many_spans(extra)
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    return claimed


async def test_one_transition_per_call_with_the_episode_reward(store: LightningStore) -> None:
    first = await finished(store, 1, calls=3, reward_value=1.0)
    second = await finished(store, 2, calls=1, reward_value=0.0)
    adapted = await TransitionAdapter().read(store, [first.rollout_id, second.rollout_id])
    assert [(t.rollout_id, t.step) for t in adapted.transitions] == [
        (first.rollout_id, 0),
        (first.rollout_id, 1),
        (first.rollout_id, 2),
        (second.rollout_id, 0),
    ]
    head = adapted.transitions[0]
    assert head.prompt_ids == [1, 2, 0] and head.response_ids == [10, 11] and head.logprobs == [-0.5, -0.25]
    assert (head.agent_name, head.resources_id, head.resources_version, head.group) == ("planner", "r1", 2, "task-1")
    assert [t.return_ for t in adapted.transitions] == [1.0, 1.0, 1.0, 0.0]
    assert adapted.episodes == 2 and not adapted.skipped


async def test_only_the_succeeded_latest_attempt_counts(store: LightningStore) -> None:
    await store.enqueue_rollout("t", config=RolloutConfig(max_attempts=2, retry_condition=["failed"]))
    failed = await store.dequeue_rollout()
    assert failed is not None
    await store.add_llm_calls([llm_call(failed, 0, start=1.0)])
    await store.update_attempt(failed.rollout_id, failed.attempt.attempt_id, status="failed")
    retried = await store.dequeue_rollout()
    assert retried is not None
    await store.add_llm_calls([llm_call(retried, 5, start=2.0)])
    await store.add_many_spans([reward(retried, 1, 0.5)])
    await store.update_attempt(retried.rollout_id, retried.attempt.attempt_id, status="succeeded")
    running = await store.start_rollout("still running")
    batch = await read_episodes(store, [failed.rollout_id, running.rollout_id, "no-such-rollout"])
    assert [(e.attempt_id, [c.span_id for c in e.calls], e.reward) for e in batch.episodes] == [
        (retried.attempt.attempt_id, ["call5"], 0.5)
    ]
    assert batch.skipped == {"not_found": 1, "not_succeeded": 1}


async def test_episodes_without_reward_are_left_out_or_given_a_default(store: LightningStore) -> None:
    claimed = await finished(store, 1, calls=2, reward_value=None)
    assert (await TransitionAdapter().read(store, [claimed.rollout_id])).skipped == {"no_reward": 1}
    adapted = await TransitionAdapter(missing_reward=-1.0).read(store, [claimed.rollout_id])
    assert [t.return_ for t in adapted.transitions] == [-1.0, -1.0]


async def test_agent_selection_trains_only_the_named_agents(store: LightningStore) -> None:
    await store.enqueue_rollout("sql")
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    calls = [
        llm_call(claimed, 0, agent="sql_writer", start=1.0),
        llm_call(claimed, 1, agent="checker", start=2.0),
        llm_call(claimed, 2, agent=None, start=3.0),  # named by the agent span around it
        llm_call(claimed, 3, agent="sql_rewriter", start=4.0),
    ]
    await store.add_llm_calls(calls)
    agent_span = span(claimed, 1, "invoke_agent rewriter", 2.9, 3.9, **{"gen_ai.agent.name": "sql_rewriter"})
    await store.add_many_spans([agent_span, reward(claimed, 2, 1.0)])
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    adapted = await TransitionAdapter(agents="sql_(writer|rewriter)").read(store, [claimed.rollout_id])
    assert [(t.step, t.agent_name) for t in adapted.transitions] == [
        (0, "sql_writer"),
        (2, "sql_rewriter"),
        (3, "sql_rewriter"),
    ]
    assert adapted.skipped == {"other_agent_calls": 1}
    assert adapted.others == []
    kept = await TransitionAdapter(agents="sql_(writer|rewriter)", keep_others=True).read(store, [claimed.rollout_id])
    assert [t.step for t in kept.transitions] == [0, 2, 3]
    assert [(t.step, t.agent_name) for t in kept.others] == [(1, "checker")]
    assert kept.skipped == {"other_agent_calls": 1}


async def test_air_rewards_each_call_by_the_status_of_its_tool_calls(store: LightningStore) -> None:
    tools = [
        # Call 0 (t=10) led to a memory lookup that succeeded; call 1 (t=20) to a search that failed and a
        # calculator call that succeeded; call 2 (t=30) answered.
        span(_blank(), 1, "execute_tool memory", 12.0, 13.0, **{sc.TOOL_NAME: "memory"}),
        span(_blank(), 2, "execute_tool search", 22.0, 23.0, failed=True, **{sc.TOOL_NAME: "search"}),
        span(_blank(), 3, "calculator", 24.0, 25.0, **{"openinference.span.kind": "TOOL", "tool.name": "calculator"}),
    ]
    claimed = await finished(store, 1, calls=3, reward_value=1.0, spans=tools)
    air = TransitionAdapter(credit=AIR(alpha=0.5, weights={"memory": 0.3, "search": 0.2}))
    adapted = await air.read(store, [claimed.rollout_id])
    # r0 = .5 * .3 + .5 * 1; r1 = .5 * mean(-.2, +1) + .5 * 1; r2 = final (no tool call).
    assert [t.reward for t in adapted.transitions] == pytest.approx([0.65, 0.7, 1.0])
    assert [t.return_ for t in adapted.transitions] == pytest.approx([0.65, 0.7, 1.0])
    discounted = await TransitionAdapter(credit=Discounted(gamma=0.5)).read(store, [claimed.rollout_id])
    assert [t.return_ for t in discounted.transitions] == pytest.approx([0.25, 0.5, 1.0])


async def test_transcripts_show_each_call_with_its_reply_and_tools(store: LightningStore) -> None:
    claimed = await finished(store, 1, calls=2, reward_value=1.0)
    batch = await read_episodes(store, [claimed.rollout_id])
    every = transcripts(batch.episodes)
    assert [t.messages for t in every] == [
        [{"role": "user", "content": "turn 0"}, {"role": "assistant", "content": "answer 0"}],
        [{"role": "user", "content": "turn 1"}, {"role": "assistant", "content": "answer 1"}],
    ]
    assert every[0].tools == [{"type": "function"}] and every[0].reward == 1.0
    assert [t.step for t in transcripts(batch.episodes, last_only=True)] == [1]


def _blank() -> AttemptedRollout:
    """Placeholder ids for spans that :func:`finished` re-homes onto its rollout."""
    attempt = Attempt(rollout_id="x", attempt_id="x", sequence_id=1, start_time=0.0)
    return AttemptedRollout(rollout_id="x", input=None, start_time=0.0, attempt=attempt)
