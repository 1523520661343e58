"""An OpenAI-compatible policy server on transformers, for CPUs and tests (vLLM takes over on GPUs).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming too) and, like vLLM with
``return_token_ids``, reports the exact token ids: ``prompt_token_ids`` (top level for chat, in the choice for
completions) and ``choices[i].token_ids``; with ``logprobs`` it reports each sampled token's log-probability
under the model (log-softmax of the raw logits, before temperature). Generation runs in a worker thread, one
request at a time, so the event loop keeps serving; ``swap_weights`` (a checkpoint) and ``load_state`` (weights
in memory, from a trainer in the same process) take effect between two generations, never during one.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class Generation:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class PolicyServer:
    """Serves the causal LM in ``model_dir`` under the name ``model_name``."""

    def __init__(self, model_dir: str | Path, *, model_name: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        # transformers' own annotations do not describe generate()'s results well; keep them dynamic here.
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.model_dir)
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.model: Any = model.eval()
        self.version = 0
        self._lock = asyncio.Lock()
        self._weights = threading.Lock()  # held by a generation and by a weight swap (which come from other threads)

    def swap_weights(self, model_dir: str | Path) -> None:
        """Load a new checkpoint of the same architecture."""
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        with self._weights:
            self.model = model.eval()
            self.version += 1

    def load_state(self, state: Any, version: int | None = None) -> None:
        """Serve these weights (a state dict of the same architecture) from the next generation on."""
        with self._weights:
            self.model.load_state_dict(state)
            self.version = self.version + 1 if version is None else version

    def _generate(self, prompt_ids: list[int], body: dict[str, Any]) -> Generation:
        import torch

        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 64)
        temperature = float(body.get("temperature", 1.0))
        if body.get("seed") is not None:
            torch.manual_seed(int(body["seed"]))
        inputs = torch.tensor([prompt_ids])
        sampling: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            sampling.update(temperature=temperature, top_p=float(body.get("top_p", 1.0)), top_k=0)
        with torch.no_grad(), self._weights:
            out = self.model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=max_tokens,
                return_dict_in_generate=True,
                output_logits=True,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        new_ids = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            float(torch.log_softmax(step_logits[0].float(), dim=-1)[token])
            for step_logits, token in zip(out.logits, new_ids, strict=False)
        ]
        finish = "stop" if new_ids and new_ids[-1] == self.tokenizer.eos_token_id else "length"
        return Generation(prompt_ids, new_ids, logprobs, finish)

    async def generate(self, prompt_ids: list[int], body: dict[str, Any]) -> Generation:
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt_ids, body)

    def text(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def app(self) -> FastAPI:
        app = FastAPI(title="lightning-store policy server")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "local"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return JSONResponse({"error": {"message": "messages must be a non-empty list"}}, status_code=400)
            prompt_ids = list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            generation = await self.generate(prompt_ids, body)
            if body.get("stream"):
                return StreamingResponse(self._chat_stream(generation, body), media_type="text/event-stream")
            return self._chat_response(generation, body)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str):
                prompt_ids = list(self.tokenizer(prompt)["input_ids"])
            else:
                return JSONResponse({"error": {"message": "prompt must be a string or token ids"}}, status_code=400)
            generation = await self.generate(prompt_ids, body)
            return self._completion_response(generation, body)

        return app

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

    def _chat_response(self, generation: Generation, body: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": self.text(generation.token_ids)},
            "finish_reason": generation.finish_reason,
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

    async def _chat_stream(self, generation: Generation, body: dict[str, Any]) -> AsyncIterator[str]:
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
        for i, token in enumerate(generation.token_ids):
            last = i == len(generation.token_ids) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": self.text([token])},
                "finish_reason": generation.finish_reason if last else None,
                "logprobs": {"content": [logprobs[i]]} if body.get("logprobs") else None,
            }
            if with_ids:
                choice["token_ids"] = [token]
            yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            yield f"data: {json.dumps({**envelope, 'choices': [], 'usage': self._usage(generation)})}\n\n"
        yield "data: [DONE]\n\n"

    def _completion_response(self, generation: Generation, body: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.text(generation.token_ids),
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
