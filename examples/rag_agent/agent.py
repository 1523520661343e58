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
import sys
from pathlib import Path
from typing import Any

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded
from agents.mcp import MCPServer, MCPServerStdio, MCPServerStdioParams
from openai import AsyncOpenAI

from examples.rag_agent.knowledge import search_documents

ROOT = Path(__file__).parents[2]

INSTRUCTIONS = (
    "You answer questions about people, companies, cities and countries with the search tool's documents only. "
    "Search, then answer with the few words that answer the question, nothing else."
)
PIMM = "Halvard Pimm was born in Tovenby. Halvard Pimm works for Sarvik Works."
SOLLUND = "Ebbe Sollund was born in Fennick. Ebbe Sollund works for Renholt Works."
RENHOLT = "Renholt Works is a company founded in 1931. Renholt Works has its headquarters in Marrow."
SARVIK = "Sarvik Works is a company founded in 1875. Sarvik Works has its headquarters in Kelmouth."
TOVENBY, FENNICK = "Tovenby is a city in Ustria.", "Fennick is a city in Galdoria."
MARROW, KELMOUTH = "Marrow is a city in Galdoria.", "Kelmouth is a city in Ustria."
GALDORIA = "Galdoria is a country. The currency of Galdoria is the Brisk."
EXAMPLES: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Where was Halvard Pimm born?", [("Halvard Pimm", f"{PIMM}\n{TOVENBY}\n{SARVIK}")], "Tovenby"),
    (
        "In which year was the company Ebbe Sollund works for founded?",
        [("Ebbe Sollund", f"{SOLLUND}\n{FENNICK}\n{RENHOLT}")],
        "1931",
    ),
    ("In which country is Marrow?", [("Marrow", f"{MARROW}\n{GALDORIA}\n{RENHOLT}")], "Galdoria"),
    ("In which country was Halvard Pimm born?", [("Halvard Pimm", f"{PIMM}\n{TOVENBY}\n{SARVIK}")], "Ustria"),
    ("Where does Sarvik Works have its headquarters?", [("Sarvik Works", f"{SARVIK}\n{KELMOUTH}\n{PIMM}")], "Kelmouth"),
    (
        "Which company does Ebbe Sollund work for?",
        [("Ebbe Sollund", f"{SOLLUND}\n{FENNICK}\n{RENHOLT}")],
        "Renholt Works",
    ),
]
"""Worked questions about people, companies and places the corpus does not have: (question, the searches and what
they returned, answer). Shown to the model as earlier turns of its conversation, tool calls included: a small
model imitates a search it has seen (for the name the question asks about) far better than it follows
instructions, and without them SmolLM2 searches for a year or a word of the question."""


def conversation(question: str) -> list[Any]:
    """The input of ``Runner.run`` for ``question``: :data:`EXAMPLES` as the Agents SDK's input items they would
    have been (the question, each ``search`` call and its output, the answer), then ``question``."""
    items: list[Any] = []
    for number, (asked, searches, answer) in enumerate(EXAMPLES):
        items.append({"role": "user", "content": asked})
        for hop, (query, documents) in enumerate(searches):
            call_id = f"example-{number}-{hop}"
            arguments = json.dumps({"query": query})
            items.append({"type": "function_call", "call_id": call_id, "name": "search", "arguments": arguments})
            items.append({"type": "function_call_output", "call_id": call_id, "output": documents})
        items.append({"role": "assistant", "content": answer})
    return [*items, {"role": "user", "content": question}]


SEARCH_SERVER = MCPServerStdioParams(command=sys.executable, args=["-m", "examples.rag_agent.search_server"], cwd=ROOT)
"""The same search from an MCP server, over stdio (``search_server.py``)."""


@function_tool
def search(query: str) -> str:
    """Search the knowledge base. Returns the (at most two) documents that best match the query.

    Args:
        query: The words to look for, e.g. a name.
    """
    return search_documents(query)


def research_agent(
    model: OpenAIChatCompletionsModel, instructions: Any = INSTRUCTIONS, mcp_server: MCPServer | None = None
) -> Agent[Any]:
    """The agent, its search a ``function_tool``, or the MCP server's ``search`` tool when one is given."""
    return Agent(
        name="researcher",
        instructions=instructions,
        tools=[] if mcp_server else [search],
        mcp_servers=[mcp_server] if mcp_server else [],
        model=model,
        model_settings=ModelSettings(tool_choice="required", temperature=0.7),
    )


# --- lightning-store: the entry point and the reward ---------------------------------------------------------
from agents import RunResult, ToolCallOutputItem  # noqa: E402

from examples.rag_agent.reward import reward  # noqa: E402
from lightning_store.resources import LLM  # noqa: E402
from runners import prompt, rollout  # noqa: E402


def score(result: RunResult, task: dict[str, Any]) -> float:
    """The reward of a run (``reward.py``): its final answer against the task's, and what its searches returned."""
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    retrieved = [o["text"] if isinstance(o, dict) else str(o) for o in outputs]  # an MCP tool's is {"text": ...}
    return reward(str(result.final_output), task["answer"], retrieved)


@rollout
async def rag_agent(task: dict[str, Any], llm: LLM) -> float:
    """One question; the reward is the token F1 of the final answer against the task's, with a share for a search
    that found the answer's document (``reward.py``). APO rewrites the instructions through the ``instructions``
    prompt template (the default without one)."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        agent = research_agent(model, instructions=lambda context, agent: prompt("instructions", INSTRUCTIONS))
        try:
            result = await Runner.run(agent, conversation(task["question"]), max_turns=task.get("max_turns", 4))
        except MaxTurnsExceeded:
            return 0.0  # searched until out of turns without answering
    return score(result, task)


@rollout
async def rag_agent_mcp(task: dict[str, Any], llm: LLM) -> float:
    """:func:`rag_agent` with its search from the MCP server (a subprocess per rollout)."""
    async with (
        AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client,
        MCPServerStdio(params=SEARCH_SERVER, cache_tools_list=True) as server,
    ):
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        instructions = lambda context, agent: prompt("instructions", INSTRUCTIONS)  # noqa: E731
        try:
            agent = research_agent(model, instructions, server)
            result = await Runner.run(agent, conversation(task["question"]), max_turns=4)
        except MaxTurnsExceeded:
            return 0.0
    return score(result, task)
