"""The RULER-style judge reward (``algorithms.ruler``, issue 40): each group's trajectories go to the judge in one
request, read from the store's transcripts; its scores become the rollouts' last rewards, with the explanation;
its call is recorded on the training run's rollout; a group it cannot score keeps the agents' rewards.

Real parts: a SQL store on each backend, its transcripts, the adapter that reads the rewards back, an HTTP judge
on 127.0.0.1. The judge LLM itself is a STAND-IN (no hosted LLM offline): it scores a trajectory 0.9 when it
holds the word ``memory`` (its explanation says so) and 0.1 otherwise, and answers a group whose task says
``garble`` with prose."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request

from adapters import TransitionAdapter
from algorithms.ruler import EXPLANATION, JudgeConfig, judge_groups
from lightning_store import LlmCall, semconv
from lightning_store.models import AttemptedRollout
from lightning_store.spans import Span
from lightning_store.sql import SqlStore
from tests.conftest import SQL_BACKENDS, serve_app


def stand_in_judge(seen: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append(body)
        user = body["messages"][-1]["content"]
        trajectories = re.split(r"\n\nTrajectory \d+:\n", user)[1:]
        scores = [
            {"trajectory": n, "explanation": f"names memory: {'memory' in t}", "score": 0.9 if "memory" in t else 0.1}
            for n, t in enumerate(trajectories, 1)
        ]
        content = "I cannot judge this." if "garble" in user else json.dumps({"scores": scores})
        message = {"role": "assistant", "content": content}
        return {"model": body["model"], "choices": [{"message": message, "finish_reason": "stop", "token_ids": [5, 6]}]}

    return app


async def finished_rollout(store: SqlStore, task: dict[str, Any], reply: str, reward: float) -> AttemptedRollout:
    """A rollout as a runner leaves it: one LLM call answered ``reply``, the agent's reward, succeeded."""
    rollout = await store.start_rollout(task, metadata={"task_id": task["id"]})
    now = time.time()
    span_id = uuid.uuid4().hex[:16]
    ids = {"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id}
    call = LlmCall(
        **ids,
        span_id=span_id,
        model="policy",
        prompt_token_ids=[1, 2],
        response_token_ids=[3, 4],
        request={"messages": [{"role": "user", "content": task["question"]}]},
        response={"choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]},
        start_time=now,
        end_time=now,
    )
    await store.add_llm_calls([call])
    rewarded = {semconv.reward_name(0): "primary", semconv.reward_value(0): reward}
    annotation = Span(
        **ids,
        sequence_id=0,
        trace_id=uuid.uuid4().hex,
        span_id=uuid.uuid4().hex[:16],
        name=semconv.ANNOTATION,
        attributes=rewarded,
    )
    await store.add_many_spans([annotation], allocate_sequence_ids=True)
    await store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")
    return rollout


@SQL_BACKENDS
async def test_the_judge_ranks_each_group_and_its_scores_become_the_rewards(sql_store: SqlStore) -> None:
    seen: list[dict[str, Any]] = []
    run = await sql_store.start_rollout({"training": "run"})
    groups = {
        "t1": [("Call memory first.", 0.0), ("Call search.", 1.0)],
        "t2": [("memory", 0.0), ("calculator", 0.0), ("memory, then search", 0.0)],
        "t3": [("garble memory", 0.5), ("garble", 0.25)],  # the judge answers prose: the agents' rewards stand
        "t4": [("memory", 0.0)],  # one succeeded rollout: nothing to compare, not judged
    }
    ids: dict[str, list[str]] = {}
    for task_id, members in groups.items():
        question = "garble this" if task_id == "t3" else f"question {task_id}"
        task = {"id": task_id, "question": question}
        ids[task_id] = [(await finished_rollout(sql_store, task, r, w)).rollout_id for r, w in members]
    async with serve_app(stand_in_judge(seen)) as url:
        judge = JudgeConfig(endpoint=f"{url}/v1", model="judge-model")
        every = [rollout_id for group in ids.values() for rollout_id in group]
        metrics = await judge_groups(sql_store, every, judge, run)
    assert (metrics["judged_groups"], metrics["judge_failed_groups"]) == (2.0, 1.0)
    assert len(seen) == 3 and all(body["model"] == "judge-model" for body in seen)
    # The judge read the transcripts: the prompts and replies, not the agents' own rewards.
    assert "Call memory first." in seen[0]["messages"][-1]["content"]
    assert "reward" not in seen[0]["messages"][-1]["content"].lower()

    adapted = await TransitionAdapter().read(sql_store, every)
    final = {t.rollout_id: t.final_reward for t in adapted.transitions}
    assert [final[r] for r in ids["t1"]] == [0.9, 0.1]
    assert [final[r] for r in ids["t2"]] == [0.9, 0.1, 0.9]
    assert [final[r] for r in ids["t3"]] == [0.5, 0.25]
    assert [final[r] for r in ids["t4"]] == [0.0]
    [ruler] = [
        s
        for s in (await sql_store.query_spans(ids["t1"][0])).items
        if s.attributes.get(semconv.reward_name(0)) == "ruler"
    ]
    assert ruler.attributes[EXPLANATION] == "names memory: True"
    # The judge's calls are recorded on the run's rollout, with the token ids its server returned.
    recorded = await sql_store.query_llm_calls([run.rollout_id])
    assert len(recorded) == 3 and {c.agent_name for c in recorded} == {"judge"}
    assert recorded[0].response_token_ids == [5, 6] and recorded[0].request is not None
