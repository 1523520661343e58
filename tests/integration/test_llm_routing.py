"""Several LLMs in one rollout (issue 40): the proxy routes each call to the llm resource it names (by resource
name or model), records which one served it, and only the policy's calls become transitions; the trainer's
publishing keeps the other LLMs of the policy's resources.

Both upstreams are STAND-INs (``tests.scripted_upstream``): one plays the policy, one a fixed judge model."""

from __future__ import annotations

import asyncio

from openai import AsyncOpenAI

from adapters import TransitionAdapter
from algorithms.collect import POLICY_LLM, POLICY_RESOURCES_ID, publish_policy
from lightning_store import LLM
from lightning_store.sql import SqlStore
from tests.conftest import SQL_BACKENDS, serve_app, serving
from tests.scripted_upstream import create_app
from tracers import Tracer, emit_reward

pytestmark = SQL_BACKENDS


async def test_calls_go_to_the_llm_they_name_and_only_the_policys_are_trained(sql_store: SqlStore) -> None:
    policy_app, judge_app = create_app(), create_app()
    async with serve_app(policy_app) as policy_url, serve_app(judge_app) as judge_url, serving(sql_store) as url:
        await publish_policy(sql_store, LLM(endpoint=f"{policy_url}/v1", model="policy-model"))
        judge = LLM(endpoint=f"{judge_url}/v1", model="judge-model")
        current = await sql_store.get_resources_by_id(POLICY_RESOURCES_ID)
        assert current is not None
        await sql_store.update_resources(POLICY_RESOURCES_ID, {**current.resources, "judge": judge})
        # A new policy version keeps the judge beside it.
        published = await publish_policy(sql_store, LLM(endpoint=f"{policy_url}/v1", model="policy-model"))
        assert set(published.resources) == {POLICY_LLM, "judge"}

        rollout = await sql_store.start_rollout({"q": 1}, resources_id=POLICY_RESOURCES_ID)
        base = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1"
        tracer = Tracer(sql_store)
        async with AsyncOpenAI(base_url=base, api_key="unused") as client:
            with tracer.attempt(rollout.rollout_id, rollout.attempt.attempt_id):
                for model in ("policy-model", "judge", "judge-model", ""):  # "": the rollout's first LLM
                    await client.chat.completions.create(model=model, messages=[{"role": "user", "content": model}])
                emit_reward(1.0)
        assert await tracer.flush()
        for _ in range(200):
            calls = await sql_store.query_llm_calls([rollout.rollout_id])
            if len(calls) == 4:
                break
            await asyncio.sleep(0.025)
        await sql_store.update_attempt(rollout.rollout_id, rollout.attempt.attempt_id, status="succeeded")

    assert [c.llm_resource for c in calls] == [POLICY_LLM, "judge", "judge", POLICY_LLM]
    # Each upstream got its own calls, each named by its own model (a resource's name is not a model).
    assert [r["model"] for r in policy_app.state.requests] == ["policy-model", "policy-model"]
    assert [r["model"] for r in judge_app.state.requests] == ["judge-model", "judge-model"]
    spans = [s for s in await sql_store.query_spans(rollout.rollout_id) if s.attributes.get("lightning_store.llm_call")]
    assert [s.attributes["lightning_store.llm_resource"] for s in spans] == [POLICY_LLM, "judge", "judge", POLICY_LLM]

    adapted = await TransitionAdapter(llm_resource=POLICY_LLM).read(sql_store, [rollout.rollout_id])
    assert len(adapted.transitions) == 2 and adapted.skipped["other_llm_calls"] == 2
    everything = await TransitionAdapter().read(sql_store, [rollout.rollout_id])
    assert len(everything.transitions) == 4
