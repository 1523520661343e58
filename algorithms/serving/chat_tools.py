"""Tool calling and stop strings for the policy server, as vLLM's OpenAI server does them with its Hermes tool
parser (``vllm serve … --enable-auto-tool-choice --tool-call-parser hermes``), so that the same agents run on
either server.

**Rendering.** A chat template that takes ``tools`` (Qwen2.5, Hermes, Llama 3.1 …) renders them itself. One that
does not (SmolLM2-135M-Instruct's, the tiny test model's plain ChatML) gets them in the Hermes format, in the
system message, and the conversation's earlier tool calls and results are written in the same format (an
assistant turn's calls as ``<tool_call>`` blocks, a tool result as a user turn's ``<tool_response>``), so the model
sees one format across turns.

**Parsing.** Each ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` block of the reply (the last one may
be cut off by the token limit before its closing tag) that holds such an object becomes an entry of the message's
``tool_calls`` (``arguments`` as a JSON string, as OpenAI sends them) and leaves the content; a block that does
not parse stays in the content. With at least one call the finish reason is ``tool_calls``.

**tool_choice.** ``none``: the tools are not offered and nothing is parsed. ``auto`` (the default): the model
decides. ``required``, or ``{"type": "function", "function": {"name": N}}``: the reply is started for the model
with ``<tool_call>\\n{"name": "``, or, when the call is decided (named, or ``required`` with one tool offered),
with ``…"N", "arguments": {"K": "`` (``K`` the schema's first required argument, the quote when it is a string):
the text vLLM's guided decoding would force. That start is part of the prompt: the recorded
prompt token ids end with it, and the response token ids are exactly what the model produced after it.

**stop.** Up to four strings; generation ends once the text holds one of them, the content ends before it, and
the response token ids keep every token generated (the last holds the stop string), as vLLM reports them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from algorithms.serving.batching import SamplingError
from algorithms.serving.response_format import OutputCheck, output_check

HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
CALL_START = '<tool_call>\n{"name": "'
_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
MAX_STOP_STRINGS = 4


@dataclass(frozen=True)
class ChatPlan:
    """How one chat request is rendered and its reply read: the messages and tools to render, the text that
    starts the reply for the model (``tool_choice`` required or named; ``{`` for structured output), whether to
    parse tool calls, the stop strings, and what the reply's content must be (``response_format``)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    reply_start: str = ""
    parse_calls: bool = False
    stop: tuple[str, ...] = field(default_factory=tuple)
    check: OutputCheck | None = None
    decided: DecidedCall | None = None
    """The call the reply must be (``reply_start`` is its start)."""


@dataclass(frozen=True)
class DecidedCall:
    """A tool call decided before the model writes (a named ``tool_choice``, or ``required`` with one tool): how
    its text is begun for the model, the JSON text the model's text completes (generation ends once ``completes``
    + the text is a complete JSON value), and the text that then closes the call."""

    start: str
    completes: str
    closing: str


def plan_chat(body: dict[str, Any], template_takes_tools: bool) -> ChatPlan:
    """The plan of a chat request ``body``; :class:`SamplingError` names a wrong field."""
    plan = _plan_tools(body, template_takes_tools)
    check = output_check(body.get("response_format"))
    if check is None:
        return plan
    return dataclasses.replace(plan, check=check, reply_start=plan.reply_start or "{")


def _plan_tools(body: dict[str, Any], template_takes_tools: bool) -> ChatPlan:
    stop = stop_strings(body.get("stop"))
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools)):
        raise SamplingError("tools", 'must be a list of {"type": "function", "function": {"name": …}} objects')
    choice = body.get("tool_choice", "auto" if tools else "none")
    messages = [_plain_message(m) for m in body["messages"]]
    if not tools or choice == "none":
        if not template_takes_tools:
            messages = _hermes_history(messages)
        return ChatPlan(messages, stop=stop)
    names = [t["function"]["name"] for t in tools]
    start = ""  # auto: the model decides, nothing is begun for it
    decided: dict[str, Any] | None = None
    if choice == "required" and len(names) == 1:
        decided = tools[0]["function"]  # the one valid call (vLLM's guided decoding forces it)
    elif choice == "required":
        start = CALL_START
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        name = choice["function"]["name"]
        if name not in names:
            raise SamplingError("tool_choice", f"names the function {name!r}, which tools does not offer")
        decided = next(t["function"] for t in tools if t["function"]["name"] == name)
    elif choice != "auto":
        raise SamplingError("tool_choice", 'must be "none", "auto", "required" or {"type": "function", …}')
    call = decided_call(decided) if decided is not None else None
    if call is not None:
        start = call.start
    if template_takes_tools:
        return ChatPlan(messages, tools=tools, reply_start=start, parse_calls=True, stop=stop, decided=call)
    described = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ChatPlan(
        _with_system(_hermes_history(messages), HERMES_SYSTEM.format(tools=described)),
        reply_start=start,
        parse_calls=True,
        stop=stop,
        decided=call,
    )


def decided_call(function: dict[str, Any]) -> DecidedCall:
    """How a call to ``function`` that the model must make is begun and closed. Begun with its name and, when the
    schema requires an argument, that argument's key (and the opening quote of a string value): as far as the
    schema decides the text without a choice. When that argument is the only property and a string, the model
    writes the string alone and the call is closed after it (no other key is allowed). A small model left to
    write the arguments often wrote a bare value, a stray quote or keys the schema does not have."""
    start = f'{CALL_START}{function["name"]}", "arguments": '
    parameters = function.get("parameters")
    required = parameters.get("required") if isinstance(parameters, dict) else None
    if not isinstance(parameters, dict) or not isinstance(required, list) or not required:
        return DecidedCall(start, "", "}\n</tool_call>")
    key, properties = required[0], parameters.get("properties") or {}
    string = isinstance(properties, dict) and (properties.get(key) or {}).get("type") == "string"
    begun = f"{{{json.dumps(key)}: " + ('"' if string else "")
    if string and list(properties) == [key]:
        return DecidedCall(start + begun, '"', "}}\n</tool_call>")
    return DecidedCall(start + begun, begun, "}\n</tool_call>")


def close_decided_call(call: DecidedCall, text: str) -> str:
    """The model's ``text`` after a decided call's start, closed: once ``call.completes + text`` begins with a
    complete JSON value (where the stop rule ends generation), what follows it is replaced by the call's closing,
    so the call parses; otherwise ``text`` as it is (cut off: the call stays in the content)."""
    try:
        _, end = json.JSONDecoder().raw_decode(call.completes + text)
    except ValueError:
        return text
    return text[: end - len(call.completes)] + call.closing


def stop_strings(value: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of strings (a string alone, or up to four)."""
    if value is None:
        return ()
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(s, str) and s for s in listed):
        raise SamplingError("stop", "must be a non-empty string or a list of them")
    if len(listed) > MAX_STOP_STRINGS:
        raise SamplingError("stop", f"at most {MAX_STOP_STRINGS} strings")
    return tuple(listed)


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first stop string in it, and whether one was found."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The content (None when nothing is left) and the tool calls of a reply (see the module docstring)."""
    calls: list[dict[str, Any]] = []

    def take(block: re.Match[str]) -> str:
        try:
            call = json.loads(block.group(1))
        except ValueError:
            return block.group(0)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return block.group(0)
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
        return ""

    rest = _CALL_BLOCK.sub(take, text)
    if not calls:
        return text, []
    return rest.strip() or None, calls


@dataclass(frozen=True)
class ChatReply:
    """What a chat reply says: its content (None when only tool calls), tool calls and finish reason, and
    whether the content is verbatim the text of the generated tokens (not when calls were parsed out of it, a
    stop string cut it, or the reply was begun for the model)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    verbatim: bool

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def stop_rule(
    tokenizer: Any, stop: tuple[str, ...], json_after: str | None = None
) -> Callable[[Sequence[int]], bool] | None:
    """What ends a generation besides the model's stop tokens (None: nothing): a stop string in its text and,
    for structured output (``json_after``: the text the reply was begun with), a complete JSON value, so that
    nothing trails the object the client will parse."""
    if not stop and json_after is None:
        return None
    longest = max(map(len, stop), default=0) + 8  # a token is at least a character, but for special tokens

    def stopped(tokens: Sequence[int]) -> bool:
        if stop:
            window = str(tokenizer.decode(list(tokens[-longest:]), skip_special_tokens=True))
            if any(s in window for s in stop):
                return True
        if json_after is None:
            return False
        text = json_after + str(tokenizer.decode(list(tokens), skip_special_tokens=True))
        try:
            json.JSONDecoder().raw_decode(text.lstrip())
        except ValueError:
            return False
        return True

    return stopped


def _is_function_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str) and tool.get("type") == "function"


def _plain_message(message: Any) -> dict[str, Any]:
    """A message as chat templates take it: text parts joined into one string, and each tool call's arguments
    an object rather than the JSON string OpenAI sends (templates write them with ``tojson``), as vLLM does."""
    if not isinstance(message, dict):
        raise SamplingError("messages", "each message must be an object")
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_call_with_object_arguments(call) for call in out["tool_calls"]]
    return out


def _call_with_object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def _hermes_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier tool calls and results written as text, for a template that knows only role and content."""
    out = []
    for message in messages:
        if message.get("role") == "tool":
            out.append(
                {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
            )
            continue
        calls = message.get("tool_calls") or []
        if calls:
            blocks = [
                "<tool_call>\n"
                + json.dumps({"name": c["function"].get("name"), "arguments": c["function"].get("arguments")})
                + "\n</tool_call>"
                for c in calls
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
            text = "\n".join([message.get("content") or "", *blocks]).strip()
            out.append({"role": message.get("role", "assistant"), "content": text})
            continue
        out.append({**message, "content": message.get("content") or ""})
    return out


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
