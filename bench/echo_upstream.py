"""A stand-in for an OpenAI-compatible policy server that answers at once (``python -m bench.echo_upstream
PORT``): fixed token ids, vLLM-style fields. It is not a model; it lets the runner benchmark measure the
middleware (runner, proxy, store) rather than generation speed."""

from __future__ import annotations

import sys
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

app = FastAPI()
RESPONSE_IDS = [101, 102, 103, 104, 105, 106, 107, 108]


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, Any]:
    body = await request.json()
    prompt_ids = list(range(1, 1 + sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4))
    return {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "echo"),
        "prompt_token_ids": prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Take the train."},
                "finish_reason": "stop",
                "token_ids": RESPONSE_IDS,
                "logprobs": {
                    "content": [
                        {"token": str(t), "logprob": -0.1, "bytes": None, "top_logprobs": []} for t in RESPONSE_IDS
                    ]
                },
            }
        ],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": 8, "total_tokens": len(prompt_ids) + 8},
    }


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
