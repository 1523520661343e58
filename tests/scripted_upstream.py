"""A scripted STAND-IN for an OpenAI-compatible policy server (there is no hosted LLM in the tests).

It is not a model: every chat completion follows a two-turn script, so that agents written with LangChain or the
OpenAI Agents SDK run their tool loop deterministically behind the store's LLM proxy.

* When the request offers tools and holds no tool result yet, it calls one tool: the first offered tool whose
  name the last user message mentions (else the first offered), with ``arguments``.
* Otherwise it answers ``"Answer: "`` followed by the last tool result (or ``"Answer: none"``).

Answers carry token ids the way vLLM returns them (``prompt_token_ids`` at the top, ``choices[0].token_ids`` and
logprobs), so the proxy records them as it would a real policy server's. Streaming is not scripted (400).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

TOOL_CALL_IDS = [201, 202, 203]
"""Response token ids of the tool-call turn."""
ANSWER_IDS = [301, 302, 303, 304]
"""Response token ids of the final answer."""


def create_app(arguments: Mapping[str, Any] | None = None) -> FastAPI:
    """The stand-in as an ASGI app; ``app.state.requests`` keeps every request body it answered."""
    app = FastAPI()
    app.state.requests = []
    tool_arguments = json.dumps(dict(arguments or {}))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        if body.get("stream"):
            return JSONResponse({"error": {"message": "the scripted stand-in does not stream"}}, status_code=400)
        app.state.requests.append(body)
        messages: list[dict[str, Any]] = body["messages"]
        tools = [t["function"]["name"] for t in body.get("tools") or [] if t.get("type") == "function"]
        tool_results = [m for m in messages if m.get("role") == "tool"]
        if tools and not tool_results:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{len(app.state.requests)}",
                        "type": "function",
                        "function": {"name": _chosen(tools, messages), "arguments": tool_arguments},
                    }
                ],
            }
            finish, ids = "tool_calls", TOOL_CALL_IDS
        else:
            result = _text(tool_results[-1].get("content")) if tool_results else "none"
            message, finish, ids = {"role": "assistant", "content": f"Answer: {result}"}, "stop", ANSWER_IDS
        prompt_ids = list(range(1, 2 + len(json.dumps(messages)) // 16))
        return {
            "id": f"chatcmpl-scripted-{len(app.state.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "scripted",
            "prompt_token_ids": prompt_ids,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish,
                    "token_ids": ids,
                    "logprobs": {
                        "content": [{"token": str(t), "logprob": -0.5, "bytes": None, "top_logprobs": []} for t in ids]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt_ids) + len(ids),
            },
        }

    return app


def _chosen(tools: list[str], messages: list[dict[str, Any]]) -> str:
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    mentioned = [name for name in tools if users and name in users[-1]]
    return (mentioned or tools)[0]


def _text(content: Any) -> str:
    """A message's content as text (a string, or a list of content parts)."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")
