"""Tool calling and stop strings of the policy server, as pure functions: what a chat request becomes before the
model sees it, and what the model's text becomes in the answer (algorithms/serving/chat_tools.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from algorithms.serving.batching import SamplingError
from algorithms.serving.chat_tools import (
    CALL_START,
    close_decided_call,
    cut_at_stop,
    decided_call,
    parse_tool_calls,
    plan_chat,
    stop_strings,
)

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}
MUL = {"type": "function", "function": {"name": "mul", "parameters": ADD["function"]["parameters"]}}  # type: ignore[index]
MESSAGES = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 2 + 3?"}]
HISTORY = [
    *MESSAGES,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]
"""A conversation with one earlier tool call and its result."""


def body(**extra: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, **extra}


def test_a_reply_with_tool_call_blocks_becomes_tool_calls_and_the_rest_its_content() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me add."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "add", {"a": 2, "b": 3})
    ]
    assert calls[0]["id"].startswith("call_")
    two = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "mul", "arguments": {}}'
    content, calls = parse_tool_calls(two)  # the last block cut off by the token limit before its closing tag
    assert content is None and [c["function"]["name"] for c in calls] == ["add", "mul"]


@pytest.mark.parametrize(
    "text",
    ["no call here", "<tool_call>not json</tool_call>", '<tool_call>["add"]</tool_call>', "<tool_call>{}</tool_call>"],
)
def test_a_reply_without_a_well_formed_call_is_all_content(text: str) -> None:
    assert parse_tool_calls(text) == (text, [])


def test_tools_are_written_into_the_system_message_for_a_template_that_does_not_take_them() -> None:
    plan = plan_chat(body(tools=[ADD]), template_takes_tools=False)
    assert plan.tools is None and plan.parse_calls and plan.reply_start == ""
    system = plan.messages[0]
    assert system["role"] == "system" and system["content"].startswith("Be exact.\n\n# Tools")
    assert json.dumps(ADD) in system["content"] and "<tool_call>" in system["content"]
    assert plan.messages[1:] == MESSAGES[1:]


def test_a_template_that_takes_tools_gets_them_with_arguments_as_objects() -> None:
    history = HISTORY
    plan = plan_chat({"messages": history, "tools": [ADD]}, template_takes_tools=True)
    assert plan.tools == [ADD] and plan.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 2}
    assert plan.messages[3] == history[3]


def test_earlier_calls_and_results_are_written_as_hermes_text_for_a_plain_template() -> None:
    history = HISTORY
    plan = plan_chat({"messages": history, "tools": [ADD]}, template_takes_tools=False)
    assert plan.messages[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>',
    }
    assert plan.messages[3] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}


@pytest.mark.parametrize(
    ("choice", "start", "parsed"),
    [
        ("auto", "", True),
        ("none", "", False),
        ("required", CALL_START, True),
        ({"type": "function", "function": {"name": "add"}}, f'{CALL_START}add", "arguments": ', True),
    ],
)
def test_tool_choice(choice: Any, start: str, parsed: bool) -> None:
    plan = plan_chat(body(tools=[ADD, MUL], tool_choice=choice), template_takes_tools=False)
    assert (plan.reply_start, plan.parse_calls) == (start, parsed)
    assert ("# Tools" in plan.messages[0]["content"]) is parsed


def test_required_with_one_tool_offered_starts_its_call() -> None:
    """The only call the reply may make (a small model otherwise names tools that do not exist)."""
    plan = plan_chat(body(tools=[ADD], tool_choice="required"), template_takes_tools=False)
    assert plan.reply_start == f'{CALL_START}add", "arguments": '


def test_a_decided_call_starts_with_its_first_required_argument_and_is_closed_when_it_is_complete() -> None:
    query = {"type": "string"}
    search = {"name": "search", "parameters": {"properties": {"query": query}, "required": ["query"]}}
    plan = plan_chat(body(tools=[{"type": "function", "function": search}], tool_choice="required"), False)
    assert plan.decided is not None and plan.reply_start == f'{CALL_START}search", "arguments": {{"query": "'
    # The only property, a string: the model writes the string; the call is closed after its closing quote.
    closed = close_decided_call(plan.decided, 'Ostrel", "more": 1}}\n<tool_call>{"name": "other"')
    content, [call] = parse_tool_calls(plan.reply_start + closed)
    assert content is None and json.loads(call["function"]["arguments"]) == {"query": "Ostrel"}
    assert close_decided_call(plan.decided, "Ostr") == "Ostr"  # cut off: left as it is
    # Other properties may follow: the arguments object is closed when it is complete.
    wider = {**search, "parameters": {"properties": {"query": query, "k": {"type": "integer"}}, "required": ["query"]}}
    decided = decided_call(wider)
    closed = close_decided_call(decided, 'Ostrel", "k": 2}"}')
    [call] = parse_tool_calls(decided.start + closed)[1]
    assert json.loads(call["function"]["arguments"]) == {"query": "Ostrel", "k": 2}
    count = {"name": "count", "parameters": {"properties": {"n": {"type": "integer"}}, "required": ["n"]}}
    assert decided_call(count).start == f'{CALL_START}count", "arguments": {{"n": '


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
        ({"tools": [ADD], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": "add"}, "tools"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [1]}, "stop"),
    ],
)
def test_bad_tool_and_stop_settings_name_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(SamplingError) as error:
        plan_chat(body(**extra), template_takes_tools=False)
    assert error.value.field == field


def test_stop_strings_cut_the_text_at_the_first_one() -> None:
    assert stop_strings("END") == ("END",) and stop_strings(None) == ()
    assert cut_at_stop("one two END three STOP", ("STOP", "END")) == ("one two ", True)
    assert cut_at_stop("nothing", ("END",)) == ("nothing", False)


@pytest.mark.parametrize(
    ("response_format", "content", "passes"),
    [
        ({"type": "json_object"}, '{"a": 1}', True),
        ({"type": "json_object"}, "[1]", False),
        ({"type": "json_object"}, '{"a": ', False),
        (
            {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "required": ["a"]}}},
            '{"b": 1}',
            False,
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "required": ["a"]}}},
            '{"a": 1}',
            True,
        ),
    ],
)
def test_structured_output_begins_the_reply_and_checks_it(
    response_format: dict[str, Any], content: str, passes: bool
) -> None:
    plan = plan_chat(body(response_format=response_format), template_takes_tools=False)
    assert plan.reply_start == "{" and plan.check is not None and plan.check.passes(content) is passes
    assert plan_chat(body(response_format={"type": "text"}), template_takes_tools=False).check is None


@pytest.mark.parametrize(
    "response_format",
    [{"type": "yaml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}],
)
def test_a_bad_response_format_names_the_field(response_format: dict[str, Any]) -> None:
    with pytest.raises(SamplingError) as error:
        plan_chat(body(response_format=response_format), template_takes_tools=False)
    assert error.value.field == "response_format"
