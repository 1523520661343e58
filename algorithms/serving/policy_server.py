"""An OpenAI-compatible policy server on transformers, for CPUs and tests (vLLM takes over on GPUs).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming too) and, like vLLM with
``return_token_ids``, reports the exact token ids: ``prompt_token_ids`` (top level for chat, in the choice for
completions) and ``choices[i].token_ids``; with ``logprobs`` it reports each sampled token's log-probability
under the model (log-softmax of the raw logits, before temperature). Concurrent requests are decoded together,
a request joining the running batch before its next token (:mod:`algorithms.serving.batching`), on the
process's tensor thread (:mod:`algorithms.tensor_thread`, where loading and weight swaps run too) in slices, so
the event loop keeps serving and a trainer's update in the same process takes turns with decoding.
``swap_weights`` (a checkpoint) and ``load_state`` (weights in memory, from a trainer in the same process) apply
to the generations admitted after them, never to one already running. Invalid sampling settings get a 400
naming the field.

Chat requests may offer ``tools`` (with ``tool_choice``) and give ``stop`` strings, as vLLM's OpenAI server with
its Hermes tool parser takes them (:mod:`algorithms.serving.chat_tools`); completions take ``stop`` too. Not
supported: ``n`` > 1 (400).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from algorithms import tensor_thread
from algorithms.serving.batching import Decoder, Generation, SamplingError, SamplingRequest, generate_batch
from algorithms.serving.chat_tools import (
    ChatPlan,
    ChatReply,
    close_decided_call,
    cut_at_stop,
    parse_tool_calls,
    plan_chat,
    stop_rule,
    stop_strings,
)
from algorithms.serving.openai_answers import AnswerWriter
from algorithms.serving.prompt_cache import PromptCache
from algorithms.serving.response_format import DEFAULT_TRIES

SLICE_SECONDS = 0.05
"""How long decoding holds the tensor thread before other tensor work may take a turn."""

PROMPT_CACHE_BYTES = 2**30
"""Default budget of the prefilled prompts kept for reuse (:mod:`algorithms.serving.prompt_cache`): 256 MiB held
too few of SmolLM2-135M's second turns (64 prompts of ~110 tokens, 46 kB per token) for their third turns to
find them."""


class PolicyServer:
    """Serves the causal LM in ``model_dir`` under the name ``model_name``, decoding up to ``max_batch_size``
    requests at once (1: one at a time) with ``decode_threads`` intra-op threads (default: torch's, every core),
    and reusing prefilled prompts up to ``prompt_cache_bytes`` (0: none), so that a GRPO group's G requests for the
    same prompt prefill it once.

    Fewer decode threads than cores pay off where the model is tiny and the store, the proxy and the agents
    share the machine: on 2 cores the tiny flight model's GRPO step decoded in 0.26 s with 1 thread and 0.54 s
    with 2, while SmolLM2-135M's took 13-15 s with 1 and 11-12 s with 2 (docs/benchmarks.md, eighth round)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str | None = None,
        max_batch_size: int = 64,
        decode_threads: int | None = None,
        prompt_cache_bytes: int = PROMPT_CACHE_BYTES,
        response_format_tries: int = DEFAULT_TRIES,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.response_format_tries = response_format_tries
        """Samples a request with a ``response_format`` may take (:mod:`algorithms.serving.response_format`)."""
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        # transformers' own annotations do not describe generate()'s results well; keep them dynamic here.
        self.tokenizer: Any = AutoTokenizer.from_pretrained(self.model_dir)
        self.answers = AnswerWriter(self.tokenizer, self.model_name)
        model: Any = tensor_thread.call(AutoModelForCausalLM.from_pretrained, self.model_dir, dtype=torch.float32)
        self.model: Any = model.eval()
        self.version = 0
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.max_batch_size = max_batch_size
        if decode_threads is not None and decode_threads < 1:
            raise ValueError("decode_threads must be at least 1")
        self.decode_threads = decode_threads
        eos = model.generation_config.eos_token_id
        self.stop_token_ids = {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        self.pad_token_id: int = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id
        self.batch_sizes: Counter[int] = Counter()  # requests admitted together (one prefill), by count
        self.decode_seconds = 0.0  # wall time spent decoding, all batches together (what the model cost)
        self.generated_tokens = 0  # tokens sampled, all batches together
        # Appended to by the event loop, taken from by the tensor thread (deque operations are atomic).
        self._pending: deque[tuple[SamplingRequest, asyncio.Future[Generation]]] = deque()
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes else None
        self._decoder = self._new_decoder()  # the tensor thread's
        self._staged: list[Callable[[], None]] = []  # weight changes waiting for the running batch to end
        self._driving: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        """Requests in the running batch (being decoded now)."""
        return len(self._decoder.rows)

    def swap_weights(self, model_dir: str | Path) -> None:
        """Serve a new checkpoint of the same architecture from the next admitted generation on."""
        from transformers import AutoModelForCausalLM

        model: Any = tensor_thread.call(AutoModelForCausalLM.from_pretrained, model_dir)

        def apply() -> None:
            self.model = self._decoder.model = model.eval()
            self.version += 1

        tensor_thread.call(self._change_weights, apply)

    def load_state(self, state: Any, version: int | None = None) -> None:
        """Serve these weights (a state dict of the same architecture) from the next admitted generation on.

        With no generation running (a synchronous training step) they are loaded before this returns; otherwise
        the running batch admits nobody new, ends on the old weights, and the new ones are loaded then: a
        generation never mixes two versions. ``state`` must not change afterwards (a trainer passes a copy)."""

        def apply() -> None:
            self.model.load_state_dict(state)
            self.version = self.version + 1 if version is None else version

        tensor_thread.call(self._change_weights, apply)

    def _change_weights(self, apply: Callable[[], None]) -> None:
        self._staged.append(apply)
        self._apply_staged_if_idle()

    def _apply_staged_if_idle(self) -> None:
        """Applies the staged weight changes, in order, unless a batch is running (it ends on its weights)."""
        while self._staged and not self._decoder.rows:
            self._staged.pop(0)()
            if self.prompt_cache is not None:
                self.prompt_cache.clear()  # prefilled by the old weights

    def _new_decoder(self) -> Decoder:
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        return Decoder(self.model, self.stop_token_ids, self.pad_token_id, self.prompt_cache)

    def decode(self, requests: list[SamplingRequest]) -> list[Generation]:
        """Decode ``requests`` as one batch now, on the tensor thread (``generate`` queues them instead)."""
        return tensor_thread.call(self._decode_now, requests)

    def _decode_now(self, requests: list[SamplingRequest]) -> list[Generation]:
        self._apply_staged_if_idle()
        with tensor_thread.intra_op_threads(self.decode_threads):
            started = time.perf_counter()
            generations = generate_batch(
                self.model,
                requests,
                stop_token_ids=self.stop_token_ids,
                pad_token_id=self.pad_token_id,
                prompts=self.prompt_cache,
            )
            self.decode_seconds += time.perf_counter() - started
            self.generated_tokens += sum(len(g.token_ids) for g in generations)
            return generations

    async def generate(self, request: SamplingRequest) -> Generation:
        """Queue ``request``; it joins the running batch before its next token (or starts one)."""
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._driving is None or self._driving.done():
            self._driving = asyncio.create_task(self._drive())
        return await future

    async def _drive(self) -> None:
        # Decoding runs in slices on the tensor thread, so that other tensor work (a trainer's update in the same
        # process) takes turns with it; between slices the event loop takes new requests.
        loop = asyncio.get_running_loop()
        while self._pending or self._decoder.rows:
            await tensor_thread.run(self._decode_slice, loop)

    def _decode_slice(self, loop: asyncio.AbstractEventLoop) -> None:
        """Admits what is pending (room and weights permitting) and decodes tokens for up to SLICE_SECONDS."""
        decoder, started = self._decoder, time.perf_counter()
        joining: list[tuple[asyncio.Future[Generation], SamplingRequest]] = []
        try:
            with torch.no_grad(), tensor_thread.intra_op_threads(self.decode_threads):
                while time.perf_counter() - started < SLICE_SECONDS:
                    self._apply_staged_if_idle()
                    if not self._staged and decoder.can_join():
                        while self._pending and len(decoder.rows) + len(joining) < self.max_batch_size:
                            request, future = self._pending.popleft()
                            joining.append((future, request))
                    if joining:
                        self.batch_sizes[len(joining)] += 1
                        self._deliver(loop, decoder.admit(joining))
                        joining = []
                    if not decoder.rows:
                        break
                    self._deliver(loop, decoder.step())
        except Exception as exc:  # the model failed: every request in the batch, or joining it, gets the error
            for future in [*(row.key for row in decoder.rows), *(future for future, _ in joining)]:
                loop.call_soon_threadsafe(_settle, future, None, exc)
            self._decoder = self._new_decoder()
        finally:
            self.decode_seconds += time.perf_counter() - started

    def _deliver(self, loop: asyncio.AbstractEventLoop, ended: dict[Any, Generation]) -> None:
        for future, generation in ended.items():
            self.generated_tokens += len(generation.token_ids)
            loop.call_soon_threadsafe(_settle, future, generation, None)

    def text(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=True))

    def app(self) -> FastAPI:
        app = FastAPI(title="lightning-store policy server")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "local"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _bad_request("messages must be a non-empty list", "messages")
            try:
                plan = plan_chat(body, self.template_takes_tools)
            except SamplingError as exc:
                return _bad_request(str(exc), exc.field)
            answered = await self._chat_answer(self._chat_prompt(plan), body, plan)
            if isinstance(answered, JSONResponse):
                return answered
            generation, reply = answered
            if body.get("stream"):
                return StreamingResponse(
                    self.answers.chat_stream(generation, body, reply), media_type="text/event-stream"
                )
            return self.answers.chat(generation, body, reply)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await _json_object(request)
            if isinstance(body, JSONResponse):
                return body
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            elif isinstance(prompt, str):
                prompt_ids = list(self.tokenizer(prompt)["input_ids"])
            else:
                return _bad_request("prompt must be a string or token ids", "prompt")
            try:
                stop = stop_strings(body.get("stop"))
            except SamplingError as exc:
                return _bad_request(str(exc), exc.field)
            generation = await self._answer(prompt_ids, body, stop)
            if isinstance(generation, JSONResponse):
                return generation
            return self.answers.completion(generation, body, stop)

        return app

    @functools.cached_property
    def template_takes_tools(self) -> bool:
        """Whether the model's chat template renders ``tools`` itself (else :mod:`chat_tools` writes them)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return isinstance(template, str) and "tools" in template

    def _chat_prompt(self, plan: ChatPlan) -> list[int]:
        ids = list(
            self.tokenizer.apply_chat_template(
                plan.messages, tools=plan.tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        if plan.reply_start:  # the start of a required tool call: part of the prompt the model continues
            ids += self.tokenizer.encode(plan.reply_start, add_special_tokens=False)
        return ids

    async def _answer(
        self, prompt_ids: list[int], body: dict[str, Any], stop: tuple[str, ...] = (), json_after: str | None = None
    ) -> Generation | JSONResponse:
        try:
            if body.get("n") not in (None, 1):
                raise SamplingError("n", "only n=1 is supported; send several requests (they are batched)")
            request = SamplingRequest.from_body(prompt_ids, body)
        except SamplingError as exc:
            return _bad_request(str(exc), exc.field)
        stopped = stop_rule(self.tokenizer, stop, json_after)
        if stopped is not None:
            request = dataclasses.replace(request, stopped=stopped)
        return await self.generate(request)

    async def _chat_answer(
        self, prompt_ids: list[int], body: dict[str, Any], plan: ChatPlan
    ) -> tuple[Generation, ChatReply] | JSONResponse:
        """One reply; with a ``response_format``, sampled again until its content passes the check, at most
        ``response_format_tries`` times (a seeded request takes seeds seed, seed + 1, …)."""
        json_after = plan.reply_start if plan.check is not None else None
        if plan.decided is not None:
            json_after = plan.decided.completes
        generation = await self._answer(prompt_ids, body, plan.stop, json_after)
        if isinstance(generation, JSONResponse):
            return generation
        reply, seed = self._reply(generation, plan), body.get("seed")
        for attempt in range(1, self.response_format_tries if plan.check else 1):
            if plan.check is None or plan.check.passes(reply.content):
                break
            again = {**body, "seed": seed + attempt} if isinstance(seed, int) else body
            retried = await self._answer(prompt_ids, again, plan.stop, json_after)
            if isinstance(retried, JSONResponse):
                return retried
            generation, reply = retried, self._reply(retried, plan)
        return generation, reply

    def _reply(self, generation: Generation, plan: ChatPlan) -> ChatReply:
        text, cut = cut_at_stop(self.text(generation.token_ids), plan.stop)
        if not plan.parse_calls:
            verbatim = not cut and not plan.reply_start
            return ChatReply(plan.reply_start + text, [], generation.finish_reason, verbatim)
        if plan.decided is not None:
            text = close_decided_call(plan.decided, text)
        content, calls = parse_tool_calls(plan.reply_start + text)
        verbatim = not cut and not plan.reply_start and not calls
        return ChatReply(content, calls, "tool_calls" if calls else generation.finish_reason, verbatim)


def _bad_request(message: str, field: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": field}}, status_code=400
    )


async def _json_object(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return _bad_request("the body is not valid JSON", "body")
    return body if isinstance(body, dict) else _bad_request("the body must be a JSON object", "body")


def _settle(future: asyncio.Future[Generation], generation: Generation | None, error: Exception | None) -> None:
    if future.done():  # a client that went away cancelled its future
        return
    if error is not None:
        future.set_exception(error)
    elif generation is not None:
        future.set_result(generation)
