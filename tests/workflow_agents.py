"""Two agents built from the cancelled-flight planner, for the selective-optimization and AIR learning tests.

* ``planner_and_checker``: a planner names the tool to call, then a checker (another agent on the same model,
  with its own system prompt) says yes or no. Reward: 0.5 if the planner named memory plus 0.5 if the checker
  said yes. Each LLM call carries its agent's name (``metadata.agent_name``, which the proxy records), so a
  trainer can select the planner's calls only.
* ``sparse_flight``: the planner is asked eight times (the same prompt each time, no history); only memory may
  be called, the other tools fail (an ERROR tool span). The reward is 1 only when all eight calls named memory
  (1/6561 for a model that names each tool a third of the time): a sparse final reward, with the tool statuses
  as the intermediate signal that AIR credit assignment uses. Eight and not fewer: with five (1/243) a lucky
  early success sometimes let identical credit learn as fast as AIR, and the comparison became a coin toss.
"""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from examples.flight.agent import HTTP, SYSTEM, TOOLS, choose_tool
from lightning_store.resources import LLM
from runners import rollout
from tracers import operation

CHECKER_SYSTEM = "You are a careful checker of travel plans. Reply yes or no."
VERDICTS = ("yes", "no")


def ask(llm: LLM, system: str, question: str, *, agent: str, max_tokens: int = 4) -> str:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0, http_client=HTTP)
    completion = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=1.0,
        extra_body={"metadata": {"agent_name": agent}},
    )
    return completion.choices[0].message.content or ""


def choose_verdict(reply: str) -> str:
    """``yes`` when the reply starts with it, else ``no``."""
    return "yes" if reply.strip().lower().startswith("yes") else "no"


@rollout
def planner_and_checker(task: dict[str, Any], llm: LLM) -> float:
    tool = choose_tool(ask(llm, SYSTEM, task["question"], agent="planner"))
    verdict = choose_verdict(ask(llm, CHECKER_SYSTEM, task["question"], agent="checker"))
    return 0.5 * (tool == "memory") + 0.5 * (verdict == "yes")


SPARSE_CALLS = 8


class ToolRefused(RuntimeError):
    """Only memory may be called in the sparse task."""


@rollout
def sparse_flight(task: dict[str, Any], llm: LLM) -> float:
    tools = []
    for step in range(SPARSE_CALLS):
        tool = choose_tool(ask(llm, SYSTEM, task["question"], agent="planner"))
        tools.append(tool)
        try:
            with operation(tool, tool=True, call_id=f"call-{step}") as call:
                if tool != "memory":
                    raise ToolRefused(f"{tool} is not available before memory")
                call.record_output(TOOLS[tool](task["question"]))
        except ToolRefused:
            pass
    return 1.0 if tools == ["memory"] * SPARSE_CALLS else 0.0
