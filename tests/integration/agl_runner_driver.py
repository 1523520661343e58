# mypy: ignore-errors
"""Agent Lightning 0.3's own runner against a store server: ``LitAgentRunner`` with its ``OtelTracer`` and its
``LightningStoreClient``, running a ``@rollout`` agent written as its docs write one.

Runs in an interpreter that has ``agentlightning`` installed (never the project's)::

    python tests/integration/agl_runner_driver.py http://127.0.0.1:4747 4 [agent|classifier]

It claims and runs ``count`` rollouts (the caller enqueued them) and exits; with 0, it runs until it is stopped.
``agent`` reads the prompt template (whatever its name, as Agent Lightning gives it), emits a message and an
object, and returns a reward: the length of the formatted prompt over 100; a task with ``"fail": true`` raises.
``classifier``, a ``LitAgent``, asks the ``main_llm`` resource to classify ``task["text"]`` with the
``prompt_template`` resource and returns 1.0 for the task's one-word ``label``, else 0.0 (the APO test's agent).

One note on Agent Lightning 0.3 itself: with the OpenTelemetry exporter this interpreter has (1.4x), its tracer's
exporter ignores the store's address and sends to ``localhost:4318``, so the agent's spans would be lost (against
its own server too); the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set to the store's ``/v1/traces`` puts
them where they belong.
"""

from __future__ import annotations

import asyncio
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # agentlightning imports litellm, which else stalls

import agentlightning as agl


@agl.rollout
def agent(task: dict, prompt_template: agl.PromptTemplate) -> float:
    if task.get("fail"):
        raise ValueError(f"task {task['city']} fails on purpose")
    prompt = prompt_template.format(**task)
    agl.emit_message(f"prompt: {prompt}")
    agl.emit_object({"city": task["city"], "length": len(prompt)})
    return len(prompt) / 100


class Classifier(agl.LitAgent):
    def rollout(self, task, resources, rollout):
        from openai import OpenAI

        llm, template = resources["main_llm"], resources["prompt_template"]
        client = OpenAI(base_url=llm.get_base_url(), api_key=llm.api_key or "none", max_retries=0)
        prompt = template.format(**{k: v for k, v in task.items() if k != "label"})
        reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": prompt}])
        answer = (reply.choices[0].message.content or "").strip().rstrip(".").strip().lower()
        return 1.0 if answer == task["label"] else 0.0


AGENTS = {"agent": agent, "classifier": Classifier()}


async def main(url: str, count: int, name: str) -> None:
    os.environ.setdefault("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{url}/v1/traces")
    store = agl.LightningStoreClient(url)
    runner = agl.LitAgentRunner(tracer=agl.OtelTracer(), max_rollouts=count or None, poll_interval=0.2)
    runner.init(AGENTS[name])
    runner.init_worker(0, store)
    try:
        await (asyncio.wait_for(runner.iter(), timeout=120) if count else runner.iter())
    finally:
        runner.teardown_worker(0)
        runner.teardown()
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "agent"))
