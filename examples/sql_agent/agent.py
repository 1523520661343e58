"""A text-to-SQL agent written with LangGraph, as LangGraph's own docs write one: a ``StateGraph`` whose nodes write
a query, run it with a tool, check the result and rewrite the query, one ``ChatOpenAI`` model playing every role.

    START -> write_query -> execute_query -> check_query -> END (the checker says CORRECT)
                                 ^                |
                                 +-- rewrite_query <+ (otherwise, while turns are left)

Only :func:`sql_agent` (the entry point) and ``reward.py`` know about lightning-store: the graph is plain LangGraph
and LangChain, pointed at ``llm.endpoint``. The store's LLM proxy records every call with its token ids; the
OpenInference LangChain instrumentation, which ``store run`` turns on for an imported LangChain, records each node
as a span named after it (so ``agents: "write_query|rewrite_query"`` trains the writer and the rewriter and not the
checker) and ``run_sql`` as a tool span with its input and output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.example_selectors import BaseExampleSelector
from langchain_core.prompts import ChatPromptTemplate, FewShotChatMessagePromptTemplate
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from examples.sql_agent.databases import run_query, schema

WRITE_SYSTEM = (
    "You are a SQLite expert. Given the database schema below and a question, write one SQLite query that "
    "answers it. Reply with the query only.\n\n{schema}"
)


class SimilarQuestions(BaseExampleSelector):
    """The worked examples shown for a question: the ``k`` training questions on its database that share the most
    words with it, most similar last (nearest the question), never the question itself. LangChain's way to choose
    few-shot examples per input (its ``SemanticSimilarityExampleSelector`` does the same with embeddings, which
    this offline example has none of); a small model imitates a worked example's form far better than it follows a
    schema, so the closest examples decide most of what it can write."""

    def __init__(self, examples: Sequence[dict[str, str]], k: int = 3) -> None:
        self.examples, self.k = list(examples), k

    def add_example(self, example: dict[str, str]) -> None:
        self.examples.append(example)

    def select_examples(self, input_variables: dict[str, str]) -> list[dict[str, str]]:
        asked = set(re.findall(r"\w+", input_variables["question"].lower()))
        same_db = [
            e
            for e in self.examples
            if e["db_id"] == input_variables["db_id"] and e["question"] != input_variables["question"]
        ]
        ranked = sorted(same_db, key=lambda e: len(asked & set(re.findall(r"\w+", e["question"].lower()))))
        return ranked[-self.k :] if self.k else []


@cache
def training_examples() -> tuple[dict[str, str], ...]:
    """The training split's questions with their gold queries, as worked examples (read once per process, not
    once per rollout)."""
    lines = Path(__file__).with_name("train.jsonl").read_text().splitlines()
    return tuple(
        {"db_id": t["db_id"], "question": t["question"], "query": t["gold_sql"]} for t in map(json.loads, lines)
    )


CHECK_SYSTEM = (
    "You check SQLite queries. Given a question, a query and its result, reply CORRECT if the query answers the "
    "question; otherwise say in one sentence what is wrong.\n\n{schema}"
)
REWRITE_ASK = "It gave:\n{result}\n{feedback}\nWrite a corrected query. Reply with the query only."


class SqlState(TypedDict, total=False):
    db_id: str
    question: str
    query: str
    result: str
    feedback: str
    turns: int


@tool
def run_sql(db_id: str, query: str) -> str:
    """Run a read-only SQLite query on database ``db_id`` and return its rows, or the error it raised."""
    try:
        rows = run_query(db_id, query)
    except Exception as error:  # the model's query: any SQLite error is an answer to show it, not a crash
        return f"Error: {error}"
    return "\n".join(", ".join(str(value) for value in row) for row in rows) or "(no rows)"


def extract_sql(text: str) -> str:
    """The query in a model's reply: a fenced code block's content if there is one, else the text from the first
    ``SELECT`` or ``WITH``; cut at the first semicolon or blank line (what a small model writes after its query)."""
    fenced = re.search(r"```(?:sql|sqlite)?\s*(.*?)(?:```|$)", text, flags=re.DOTALL | re.IGNORECASE)
    if fenced:
        text = fenced.group(1)
    start = re.search(r"\b(SELECT|WITH)\b", text, flags=re.IGNORECASE)
    if start:
        text = text[start.start() :]
    return re.split(r";|\n\s*\n", text)[0].strip()


def build_graph(model: ChatOpenAI, *, write_system: str = WRITE_SYSTEM, max_turns: int = 2) -> Any:
    """The compiled graph; ``max_turns`` queries at most (the first and its rewrites)."""
    shots = FewShotChatMessagePromptTemplate(
        example_selector=SimilarQuestions(training_examples()),
        input_variables=["db_id", "question"],
        example_prompt=ChatPromptTemplate.from_messages([("user", "{question}"), ("ai", "{query}")]),
    )
    write = ChatPromptTemplate.from_messages([("system", write_system), shots, ("user", "{question}")]) | model
    check = (
        ChatPromptTemplate.from_messages(
            [("system", CHECK_SYSTEM), ("user", "Question: {question}\nQuery: {query}\nResult:\n{result}")]
        )
        | model
    )
    rewrite = (
        ChatPromptTemplate.from_messages(
            [("system", write_system), shots, ("user", "{question}"), ("ai", "{query}"), ("user", REWRITE_ASK)]
        )
        | model
    )

    async def write_query(state: SqlState) -> SqlState:
        reply = await write.ainvoke({"schema": schema(state["db_id"]), **state})
        return {"query": extract_sql(str(reply.content)), "turns": 1}

    async def execute_query(state: SqlState) -> SqlState:
        result = await run_sql.ainvoke({"db_id": state["db_id"], "query": state["query"]})
        return {"result": result[:1000]}

    async def check_query(state: SqlState) -> SqlState:
        reply = await check.ainvoke({"schema": schema(state["db_id"]), **state})
        return {"feedback": str(reply.content)}

    async def rewrite_query(state: SqlState) -> SqlState:
        reply = await rewrite.ainvoke({"schema": schema(state["db_id"]), **state})
        return {"query": extract_sql(str(reply.content)), "turns": state["turns"] + 1}

    def after_execute(state: SqlState) -> str:
        return "check_query" if state["turns"] < max_turns else END  # no turn left to act on a check

    def after_check(state: SqlState) -> str:
        return END if re.match(r"\W*CORRECT\b", state["feedback"].upper()) else "rewrite_query"  # not INCORRECT

    graph = StateGraph(SqlState)
    for node in (write_query, execute_query, check_query, rewrite_query):
        graph.add_node(node.__name__, node)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_conditional_edges("execute_query", after_execute)
    graph.add_conditional_edges("check_query", after_check)
    graph.add_edge("rewrite_query", "execute_query")
    return graph.compile()


# --- lightning-store: the entry point and the reward ---------------------------------------------------------
from examples.sql_agent.reward import execution_reward  # noqa: E402
from lightning_store.resources import LLM  # noqa: E402
from runners import prompt, rollout  # noqa: E402


@rollout
async def sql_agent(task: dict[str, Any], llm: LLM) -> float:
    """One question: the graph on the policy behind ``llm``; the reward is the final query's execution match.
    APO rewrites the writer's system prompt through the ``write_system`` prompt template (the default without
    one); a task's ``max_turns`` (default 2) bounds the rewrites."""
    model = ChatOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", model=llm.model, temperature=0.7)
    graph = build_graph(model, write_system=prompt("write_system", WRITE_SYSTEM), max_turns=task.get("max_turns", 2))
    final = await graph.ainvoke({"db_id": task["db_id"], "question": task["question"]})
    return execution_reward(task["db_id"], final.get("query"), task["gold_sql"])
