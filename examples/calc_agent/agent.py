"""A calculator agent written with AutoGen, as AutoGen's docs write one: an ``AssistantAgent`` with a tool, on an
``OpenAIChatCompletionClient``, run with ``agent.run(task=...)``.

The agent's one tool evaluates an arithmetic expression; with AutoGen's defaults (one tool iteration, no
reflection) the tool's result is the agent's final message, so what the model must learn is to turn a word
problem into the right expression. AutoGen always offers its tools with ``tool_choice: auto``, which a 135M model
answers with prose; the store's proxy can force ``required`` for the policy (the LLM resource's
``forced_parameters``), which the training configuration does, leaving the agent's code as it is. The agent
starts from four worked problems, given the AutoGen way, as earlier turns of its model context (the problem, the
calculator call, its result): with them SmolLM2-135M-Instruct writes a two-number expression most of the time
and the right one about half the time; with the same examples as text in the system message it did not (an
exact answer in 3 of 32 problems).

Only :func:`calc_agent` (the entry point) and the reward know about lightning-store. The store's LLM proxy
records every call with its token ids; the OpenInference AutoGen instrumentation, which ``store run`` turns on
when ``autogen_agentchat`` is imported, records the agent's run and each ``calculator`` call with its input and
output as spans.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import ToolCallRequestEvent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelInfo,
    UserMessage,
)
from autogen_ext.models.openai import OpenAIChatCompletionClient

SYSTEM_MESSAGE = (
    "You solve arithmetic word problems. Call the calculator with the expression that answers the problem, "
    "using the problem's numbers, for example 37 * 486."
)
EXAMPLES = [
    ("A shop had 4821 pens and sold 1375 of them. How many pens are left?", "4821 - 1375", "3446"),
    ("A school has 36 classes of 412 pupils. How many pupils are there?", "36 * 412", "14832"),
    ("5712 stamps are shared equally among 48 albums. How many stamps are in each album?", "5712 / 48", "119"),
    ("A zoo had 2468 visitors in May and 3579 in June. How many visitors came in both months?", "2468 + 3579", "6047"),
]
"""Worked problems the agent starts from, as earlier turns of its conversation (AutoGen's model context)."""
OPERATIONS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def evaluate(node: ast.AST) -> float:
    """Numbers, + - * / and parentheses; anything else is a ``ValueError``."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATIONS:
        return float(OPERATIONS[type(node.op)](evaluate(node.left), evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATIONS:
        return float(OPERATIONS[type(node.op)](evaluate(node.operand)))
    raise ValueError(f"not arithmetic: {ast.unparse(node)[:80]}")


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / and parentheses, e.g. 37 * 486."""
    try:
        value = evaluate(ast.parse(expression.replace(",", "").strip()[:200], mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as error:
        return f"Error: {error}"
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else str(round(value, 6))


def model_client(base_url: str, model: str, api_key: str) -> OpenAIChatCompletionClient:
    """An OpenAI-compatible client for a model AutoGen does not know (its capabilities stated)."""
    info = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False)
    return OpenAIChatCompletionClient(model=model, base_url=base_url, api_key=api_key, model_info=info, temperature=0.7)


def worked_examples() -> list[LLMMessage]:
    """:data:`EXAMPLES` as the turns they would have been: the problem, the calculator call, its result."""
    turns: list[LLMMessage] = []
    for number, (problem, expression, result) in enumerate(EXAMPLES):
        call_id = f"example-{number}"
        arguments = json.dumps({"expression": expression})
        turns += [
            UserMessage(content=problem, source="user"),
            AssistantMessage(
                content=[FunctionCall(id=call_id, name="calculator", arguments=arguments)], source="calculator_agent"
            ),
            FunctionExecutionResultMessage(
                content=[FunctionExecutionResult(content=result, name="calculator", call_id=call_id, is_error=False)]
            ),
        ]
    return turns


def calculator_agent(client: OpenAIChatCompletionClient, system_message: str = SYSTEM_MESSAGE) -> AssistantAgent:
    context = UnboundedChatCompletionContext(initial_messages=worked_examples())
    return AssistantAgent(
        "calculator_agent",
        model_client=client,
        tools=[calculator],
        system_message=system_message,
        model_context=context,
    )


# --- lightning-store: the entry point and the reward ---------------------------------------------------------
from examples.calc_agent.reward import numeric_reward  # noqa: E402
from lightning_store.resources import LLM  # noqa: E402
from runners import prompt, rollout  # noqa: E402


@rollout
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """One problem; the reward is the numeric match of the agent's final message (``reward.py``). APO rewrites
    the system message through the ``system_message`` prompt template (the default without one)."""
    client = model_client(llm.endpoint, llm.model, llm.api_key or "unused")
    try:
        agent = calculator_agent(client, prompt("system_message", SYSTEM_MESSAGE))
        result = await agent.run(task=task["question"])
    finally:
        await client.close()
    calls = [call for event in result.messages if isinstance(event, ToolCallRequestEvent) for call in event.content]
    expression = calls[0].arguments if calls else result.messages[-1].to_text()  # the JSON arguments, or prose
    return numeric_reward(
        result.messages[-1].to_text(), float(task["answer"]), question=task["question"], expression=expression
    )
