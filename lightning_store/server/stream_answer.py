"""One answer rebuilt from an OpenAI/vLLM server-sent event stream, for the proxy's record of a streamed call.

The proxy relays every line to the agent as it arrives and feeds it here too. :meth:`StreamAssembler.feed` never
raises: a chunk of a shape it does not expect must not cut the agent's stream (the upstream's was complete), so it
is noted, and the record says the call is not trainable (:attr:`~lightning_store.server.answers.Answer.problem`).
Every part kept is checked as it arrives (the limits of :mod:`lightning_store.limits`, token ids and logprobs as
:mod:`~lightning_store.server.answers` reads them), so the rebuilt answer is storable as it stands.
"""

from __future__ import annotations

from typing import Any

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import check_json, storable
from lightning_store.server.answers import (
    Answer,
    NotATransition,
    choice_logprobs,
    finish_reason,
    parse,
    read_storable,
    token_ids,
)


class StreamAssembler:
    """Rebuilds one response (text, tool calls, token ids, logprobs) from the events of a stream."""

    def __init__(self) -> None:
        self.prompt_token_ids: list[int] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.events = 0
        self.problem: str | None = None
        """The first event that could not be read, and why."""

    def feed(self, line: str) -> None:
        """Take one line of the stream (``data: {…}``; other lines and ``[DONE]`` are skipped). Never raises."""
        if not line.startswith("data:"):
            return
        payload = line[len("data:") :].strip()
        if not payload or payload == "[DONE]":
            return
        self.events += 1
        try:
            chunk = parse(payload)
            check_json(chunk, "event", text=False)
            self._take(storable(chunk, payload))
        except (ValueError, InvalidRequestError) as exc:  # NotATransition is a ValueError
            if self.problem is None:
                self.problem = f"stream event {self.events}: {exc}"

    def answer(self) -> Answer:
        """The record of what the stream said."""
        answer = read_storable(self.response())
        if self.problem is not None and answer.problem is None:
            answer.prompt_token_ids, answer.response_token_ids, answer.logprobs = [], [], []
            answer.problem = self.problem
        return answer

    def response(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        return {
            "model": self.model,
            "prompt_token_ids": self.prompt_token_ids,
            "usage": self.usage,
            "choices": [
                {
                    "index": 0,
                    "token_ids": self.token_ids,
                    "finish_reason": self.finish_reason,
                    "message": message,
                    "logprobs": {"content": [{"logprob": v} for v in self.logprobs]},
                }
            ],
        }

    def _take(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise NotATransition("not a JSON object")
        if isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if chunk.get("prompt_token_ids"):
            self.prompt_token_ids = token_ids(chunk["prompt_token_ids"], "prompt_token_ids")
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise NotATransition("choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise NotATransition("a choice is not an object")
            if choice.get("index", 0) == 0:
                self._take_choice(choice)

    def _take_choice(self, choice: dict[str, Any]) -> None:
        if choice.get("prompt_token_ids"):
            self.prompt_token_ids = token_ids(choice["prompt_token_ids"], "choices.0.prompt_token_ids")
        self.token_ids.extend(token_ids(choice.get("token_ids") or [], "choices.0.token_ids"))
        self.logprobs.extend(choice_logprobs(choice))
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise NotATransition("choices.0.delta is not an object")
        text = delta.get("content") or choice.get("text") or ""
        if not isinstance(text, str):
            raise NotATransition("choices.0.delta.content is not a string")
        self.text.append(text)
        for call in delta.get("tool_calls") or []:
            self._take_tool_call(call)
        self.finish_reason = finish_reason(choice.get("finish_reason")) or self.finish_reason

    def _take_tool_call(self, call: Any) -> None:
        """A tool call arrives in pieces: its index, id, type and name once, its arguments as text pieces."""
        if not isinstance(call, dict) or type(call.get("index", 0)) is not int:
            raise NotATransition("choices.0.delta.tool_calls holds an item that is not a tool call")
        whole = self.tool_calls.setdefault(
            call.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(call.get("id"), str):
            whole["id"] = call["id"]
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise NotATransition("choices.0.delta.tool_calls.function is not an object")
        for key in ("name", "arguments"):
            piece = function.get(key)
            if isinstance(piece, str):
                whole["function"][key] += piece
