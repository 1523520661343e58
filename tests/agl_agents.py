"""Agents written for Agent Lightning 0.3 the way its docs and examples write them, with one line changed so that
``store run`` runs them: ``import agentlightning as agl`` became ``import runners.agentlightning as agl``.

* ``room_selector``: the shape of its APO example (``examples/apo/room_selector.py``): ``@rollout`` with
  ``(task, prompt_template)``, an ``OpenAI()`` client from the environment, one tool round, the reward returned.
  The store's resources name the template ``main_prompt``, as that example does; the agent gets it all the same.
* ``capital_agent``: ``@rollout async def (task, llm, rollout)`` calling ``llm.endpoint`` and ``emit_reward``.
* ``sql_agent``: a ``LitAgent`` as its SQL example writes one: ``training_rollout`` and ``validation_rollout``,
  the LLM from ``resources["main_llm"].get_base_url(rollout_id, attempt_id)``, ``self.tracer.get_langchain_handler()``.

The replies come from the scripted stand-in upstream (``tests.scripted_upstream``), not a model; each reward says
which path the agent took, for the test to check.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI, OpenAI

import runners.agentlightning as agl  # was: import agentlightning as agl

ROOMS = {"Orion": {"capacity": 4, "free": True}, "Lyra": {"capacity": 10, "free": False}}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_rooms_and_availability",
            "description": "Return meeting rooms with capacity and whether they are free.",
            "parameters": {
                "type": "object",
                "properties": {"date": {"type": "string"}, "time": {"type": "string"}},
                "required": ["date", "time"],
            },
        },
    }
]


@agl.rollout
def room_selector(task: dict[str, Any], prompt_template: agl.PromptTemplate) -> float:
    client = OpenAI()
    messages: list[Any] = [
        {"role": "system", "content": "You are a scheduling assistant."},
        {"role": "user", "content": prompt_template.format(**task["task_input"])},
    ]
    resp = client.chat.completions.create(
        model="gpt-4.1-nano", messages=messages, tools=TOOLS, tool_choice="auto", temperature=0.0
    )
    tool_calls = [c for c in resp.choices[0].message.tool_calls or [] if c.type == "function"]
    if tool_calls:
        messages.append(
            {
                "role": "assistant",
                "content": resp.choices[0].message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in tool_calls
                ],
            }
        )
        messages += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps(ROOMS)} for c in tool_calls]
        resp = client.chat.completions.create(model="gpt-4.1-nano", messages=messages, temperature=0.0)
    final_message = resp.choices[0].message.content or ""
    return 1.0 if task["expected_choice"] in final_message else 0.0


@agl.rollout
async def capital_agent(task: dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> None:
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "dummy")
    resp = await client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": f"What is the capital of {task['country']}?"}]
    )
    agl.emit_message(f"rollout {rollout.rollout_id} asked about {task['country']}")
    agl.emit_reward(0.25 if (resp.choices[0].message.content or "").startswith("Answer") else 0.0)


class SqlAgent(agl.LitAgent):
    def __init__(self) -> None:
        super().__init__(trained_agents=r"write")

    def _ask(self, question: str, resources: agl.NamedResources, rollout: agl.Rollout) -> str:
        llm = resources["main_llm"]
        assert isinstance(llm, agl.LLM)
        client = OpenAI(
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),  # type: ignore[attr-defined]
            api_key=llm.api_key or "dummy",
        )
        handler = self.tracer.get_langchain_handler()
        assert handler is None  # its callbacks would be [handler] if handler else []
        resp = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": question}])
        return resp.choices[0].message.content or ""

    def training_rollout(self, task: Any, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        return 0.75 if self._ask(task["question"], resources, rollout).startswith("Answer") else 0.0

    def validation_rollout(self, task: Any, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        return 0.5 if self._ask(task["question"], resources, rollout).startswith("Answer") else 0.0


sql_agent = SqlAgent()
