"""A travel agent written twice, with the OpenAI Agents SDK and with LangChain, and nothing else: for the tests
of OpenInference capture (``tests.openinference_agent:travel_agent`` is the runner's entry point).

Neither knows about the store or the tracers: their agent, tool and LLM spans come from the OpenInference
instrumentors (which the runner's worker installs at start-up), and their LLM calls go through the proxy behind
the base URL they are given. Two tools: ``lookup_flight`` answers, ``book_flight`` fails; the question decides
which one the (scripted) model calls.
"""

from __future__ import annotations

from typing import Any

import httpx
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from lightning_store.resources import LLM

AGENT_NAME = "travel_agent"


def lookup_flight(city: str) -> str:
    """Find the first flight to a city."""
    return f"TAP 06:05 to {city}, 210 EUR"


def book_flight(city: str) -> str:
    """Book the first flight to a city."""
    raise RuntimeError(f"no seats left to {city}")


def agents_sdk_agent(client: AsyncOpenAI, model: str = "scripted") -> Agent[Any]:
    return Agent(
        name=AGENT_NAME,
        instructions="You book travel. Use the tools.",
        tools=[function_tool(lookup_flight), function_tool(book_flight)],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
    )


async def travel_agent(task: dict[str, Any], llm: LLM) -> float:
    """The Agents SDK agent as a rollout: reward 1 when the answer quotes a flight (the tool worked), else 0."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "unused", max_retries=0) as client:
        result = await Runner.run(agents_sdk_agent(client, llm.model), task["question"])
    return 1.0 if "EUR" in str(result.final_output) else 0.0


async def langchain_agent(base_url: str, question: str, http: httpx.AsyncClient) -> str:
    """A tool loop written with LangChain only: the model's tool calls are run, failures answered as errors."""
    tools = {t.name: t for t in (tool(lookup_flight), tool(book_flight))}
    model = ChatOpenAI(base_url=base_url, api_key="unused", model="scripted", max_retries=0, http_async_client=http)
    llm = model.bind_tools(list(tools.values()))

    async def loop(question: str) -> str:
        messages: list[BaseMessage] = [HumanMessage(question)]
        while True:
            reply = await llm.ainvoke(messages)
            messages.append(reply)
            if not getattr(reply, "tool_calls", None):
                return str(reply.content)
            for call in reply.tool_calls:
                try:
                    messages.append(await tools[call["name"]].ainvoke(call))  # sync tools: in LangChain's threads
                except RuntimeError as error:
                    messages.append(ToolMessage(str(error), tool_call_id=call["id"], status="error"))

    # A run whose name contains "agent" is what OpenInference marks as an AGENT span in LangChain.
    return str(await RunnableLambda(loop).with_config(run_name=AGENT_NAME).ainvoke(question))
