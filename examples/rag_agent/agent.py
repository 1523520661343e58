"""A retrieval agent written with the OpenAI Agents SDK, as its docs write one: an ``Agent`` with instructions and a
``function_tool`` that searches a knowledge base, run by ``Runner.run``.

The knowledge base is ``corpus.jsonl`` beside this file: invented facts no model knows (``corpus.py``), so a
question is answered only by searching. The first turn must call the tool (``tool_choice="required"``; the SDK
resets it to ``auto`` after a tool call, so the model then answers or searches again), as a small model left to
choose seldom searches at all.

Only :func:`rag_agent` (the entry point) and the reward know about lightning-store: the agent is plain Agents SDK,
its model an ``OpenAIChatCompletionsModel`` on ``llm.endpoint``. The store's LLM proxy records every call with its
token ids (the tool-calling ones included); the OpenInference instrumentation of the Agents SDK, which
``store run`` turns on when the SDK is imported, records the agent, each model call and each ``search`` call with
its input and output as spans.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

CORPUS = Path(__file__).with_name("corpus.jsonl")
INSTRUCTIONS = (
    "You answer questions about people, companies, cities and countries with the search tool's documents only. "
    "Search, then answer with the few words that answer the question, nothing else."
)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@cache
def documents() -> list[dict[str, str]]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines()]


@cache
def idf() -> dict[str, float]:
    counts = Counter(word for document in documents() for word in set(words(document["text"])))
    return {word: math.log(len(documents()) / count) for word, count in counts.items()}


@function_tool
def search(query: str) -> str:
    """Search the knowledge base. Returns the two documents that best match the query.

    Args:
        query: The words to look for, e.g. a name.
    """
    asked = set(words(query))
    scored = sorted(documents(), key=lambda d: -sum(idf().get(w, 0.0) for w in asked.intersection(words(d["text"]))))
    return "\n".join(document["text"] for document in scored[:2])


def research_agent(model: OpenAIChatCompletionsModel, instructions: Any = INSTRUCTIONS) -> Agent[Any]:
    return Agent(
        name="researcher",
        instructions=instructions,
        tools=[search],
        model=model,
        model_settings=ModelSettings(tool_choice="required", temperature=0.7),
    )


# --- lightning-store: the entry point and the reward ---------------------------------------------------------
from examples.rag_agent.reward import f1  # noqa: E402
from lightning_store.resources import LLM  # noqa: E402
from runners import prompt, rollout  # noqa: E402


@rollout
async def rag_agent(task: dict[str, Any], llm: LLM) -> float:
    """One question; the reward is the token F1 of the final answer against the task's. APO rewrites the
    instructions through the ``instructions`` prompt template (the default without one)."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        agent = research_agent(model, instructions=lambda context, agent: prompt("instructions", INSTRUCTIONS))
        try:
            result = await Runner.run(agent, task["question"], max_turns=task.get("max_turns", 4))
        except MaxTurnsExceeded:
            return 0.0  # searched until out of turns without answering
    return f1(str(result.final_output), task["answer"])
