"""The policy server's answers in OpenAI's shapes (chat, its stream, completions), with the token ids and
logprobs that vLLM's ``return_token_ids`` and ``logprobs`` add. Separate from the server (which decodes) because
it only formats what was decoded."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from algorithms.serving.batching import Generation
from algorithms.serving.chat_tools import ChatReply, cut_at_stop


class AnswerWriter:
    """Writes the answers of the model named ``model_name`` whose tokens ``tokenizer`` decodes."""

    def __init__(self, tokenizer: Any, model_name: str) -> None:
        self.tokenizer, self.model_name = tokenizer, model_name

    def _text(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.model_name}

    def _token_logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        return [
            {
                "token": self.tokenizer.convert_ids_to_tokens(token),
                "logprob": logprob,
                "bytes": None,
                "top_logprobs": [],
            }
            for token, logprob in zip(generation.token_ids, generation.logprobs, strict=True)
        ]

    def _usage(self, generation: Generation) -> dict[str, int]:
        prompt, completion = len(generation.prompt_token_ids), len(generation.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def chat(self, generation: Generation, body: dict[str, Any], reply: ChatReply) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": reply.message(),
            "finish_reason": reply.finish_reason,
            "logprobs": {"content": self._token_logprobs(generation)} if body.get("logprobs") else None,
        }
        response = {
            **self._envelope("chatcmpl"),
            "object": "chat.completion",
            "choices": [choice],
            "usage": self._usage(generation),
        }
        if body.get("return_token_ids"):
            response["prompt_token_ids"] = generation.prompt_token_ids
            choice["token_ids"] = generation.token_ids
        return response

    async def chat_stream(self, generation: Generation, body: dict[str, Any], reply: ChatReply) -> AsyncIterator[str]:
        envelope = {**self._envelope("chatcmpl"), "object": "chat.completion.chunk"}
        with_ids = bool(body.get("return_token_ids"))
        first: dict[str, Any] = {
            **envelope,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
        if with_ids:
            first["prompt_token_ids"] = generation.prompt_token_ids
        yield f"data: {json.dumps(first)}\n\n"
        logprobs = self._token_logprobs(generation)
        if not reply.verbatim:
            # The reply is not the tokens' text (calls parsed out of it, cut at a stop string, begun for the
            # model): one event with all of it, as a streaming tool parser ends up sending.
            delta: dict[str, Any] = {"content": reply.content or ""}
            if reply.tool_calls:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]
            whole: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reply.finish_reason}
            whole["logprobs"] = {"content": logprobs} if body.get("logprobs") else None
            if with_ids:
                whole["token_ids"] = generation.token_ids
            yield f"data: {json.dumps({**envelope, 'choices': [whole]})}\n\n"
        for i, token in enumerate(generation.token_ids if reply.verbatim else []):
            last = i == len(generation.token_ids) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": self._text([token])},
                "finish_reason": generation.finish_reason if last else None,
                "logprobs": {"content": [logprobs[i]]} if body.get("logprobs") else None,
            }
            if with_ids:
                choice["token_ids"] = [token]
            yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': self._usage(generation)})}\n\n"
        yield "data: [DONE]\n\n"

    def completion(self, generation: Generation, body: dict[str, Any], stop: tuple[str, ...]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": cut_at_stop(self._text(generation.token_ids), stop)[0],
            "finish_reason": generation.finish_reason,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": [self.tokenizer.convert_ids_to_tokens(t) for t in generation.token_ids],
                "token_logprobs": generation.logprobs,
            }
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = generation.prompt_token_ids
            choice["token_ids"] = generation.token_ids
        return {
            **self._envelope("cmpl"),
            "object": "text_completion",
            "choices": [choice],
            "usage": self._usage(generation),
        }
