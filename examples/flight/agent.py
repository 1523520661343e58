"""The cancelled-flight agent of the reference walk-through, written with the plain OpenAI SDK.

Three tools (memory, search, calculator); the reward is 1 when the first tool called is memory. Nothing in it
knows about the store: its LLM calls are captured by the proxy behind ``llm.endpoint``, its tool calls are
``operation(tool=True)`` spans and its return value is the reward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openai import DefaultHttpxClient, OpenAI

from lightning_store.resources import LLM
from runners import rollout
from tracers import emit_object, operation

TOOLS: dict[str, Callable[[str], str]] = {
    "memory": lambda question: "Itinerary: Lisbon to Paris, budget 300 EUR, must arrive by 09:00, passport valid.",
    "search": lambda question: "Options: TAP 06:05 arrives 09:40 (210 EUR); Air France 07:00 arrives 10:35.",
    "calculator": lambda question: "210 EUR is 90 EUR under budget.",
}
NAMES = tuple(TOOLS)
HTTP = DefaultHttpxClient()
"""One connection pool for every rollout of this worker process: a new ``OpenAI()`` builds its own HTTP client
(an SSL context and all), about 20 ms each time, which would be most of this agent's own CPU time."""
SYSTEM = "You are a travel assistant. Tools: memory, search, calculator. Reply with the name of the tool to call next."


def choose_tool(reply: str) -> str:
    """The first tool the reply names. A tiny untrained model seldom names one; its reply then still decides,
    through its length, so that the choice depends only on what the model said."""
    named = [(reply.lower().find(name), name) for name in NAMES if name in reply.lower()]
    return min(named)[1] if named else NAMES[len(reply) % len(NAMES)]


def opening(task: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation the agent starts from: its system prompt, the task's demonstrations (``shots``, a list
    of ``[question, tool]`` pairs shown as earlier turns, which a small instruct model imitates) and the
    question; ``ask`` (a format with ``{question}``) words every user turn."""
    ask = task.get("ask", "{question}")
    messages = [{"role": "system", "content": SYSTEM}]
    for question, tool in task.get("shots", []):
        messages += [{"role": "user", "content": ask.format(question=question)}, {"role": "assistant", "content": tool}]
    return [*messages, {"role": "user", "content": ask.format(question=task["question"])}]


@rollout
def flight_agent(task: dict[str, Any], llm: LLM) -> float:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0, http_client=HTTP)
    messages: list[Any] = opening(task)
    first_tool = None
    for step in range(task.get("steps", 3)):
        completion = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=task.get("max_tokens", 6), temperature=1.0
        )
        reply = completion.choices[0].message.content or ""
        extra = (completion.model_extra or {}, completion.choices[0].model_extra or {})
        emit_object(
            {"step": step, "prompt_token_ids": extra[0].get("prompt_token_ids"), "token_ids": extra[1].get("token_ids")}
        )
        tool = choose_tool(reply)
        first_tool = first_tool or tool
        with operation(tool, tool=True, call_id=f"call-{step}") as call:
            call.record_input({"question": task["question"]})
            result = TOOLS[tool](task["question"])
            call.record_output(result)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"[{tool}] {result}"}]
    return 1.0 if first_tool == "memory" else 0.0
