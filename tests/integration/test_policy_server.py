"""The built-in policy server over real HTTP: concurrent requests are decoded in one batch, a request joins a
running batch, a prompt sent many times is prefilled once, and neither changes anything a client can see (token
ids, log-probabilities, seeded samples, token limits); new weights never reach a generation already running, nor
reuse a prompt prefilled by the old ones; bad settings get a 400."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from algorithms.serving.batching import SamplingRequest
from algorithms.serving.policy_server import PolicyServer
from algorithms.serving.tiny_model import build_tiny_model
from tests.conftest import serve_app

QUESTIONS = [
    "My flight was cancelled.",
    "Think step by step, then call a tool or answer the user. The answer is 42.",
    "Find a new flight for tomorrow morning.",
    "Use the tools memory, search and calculator.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def chat(question: str, **settings: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": question}]
    return {"model": "tiny", "messages": messages, "return_token_ids": True, "logprobs": True, **settings}


async def ask_all(server: PolicyServer, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with serve_app(server.app()) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        responses = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for body in bodies))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    return [r.json() for r in responses]


def teacher_forced_logprobs(
    server: PolicyServer, prompt: list[int], tokens: list[int], model: Any = None
) -> list[float]:
    """The tokens' log-probabilities from one unpadded forward pass over prompt + tokens (by ``model``, default
    the server's)."""
    with torch.no_grad():
        logits = (model or server.model)(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return [float(logprobs[i, token]) for i, token in enumerate(tokens)]


async def test_concurrent_requests_share_batches_and_match_the_model(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    limits = [3, 17, 8, 30, 1, 12, 25, 5]
    bodies = [chat(QUESTIONS[i % len(QUESTIONS)], max_tokens=n, seed=i) for i, n in enumerate(limits)]
    answers = await ask_all(server, bodies)

    assert sum(size * count for size, count in server.batch_sizes.items()) == len(bodies)
    assert max(server.batch_sizes) > 1, f"no two requests were decoded together: {server.batch_sizes}"
    for answer, limit in zip(answers, limits, strict=True):
        choice = answer["choices"][0]
        tokens, prompt = choice["token_ids"], answer["prompt_token_ids"]
        assert 1 <= len(tokens) <= limit
        ended = tokens[-1] in server.stop_token_ids
        assert choice["finish_reason"] == ("stop" if ended else "length")
        assert ended or len(tokens) == limit
        assert not any(t in server.stop_token_ids for t in tokens[:-1])
        reported = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        expected = teacher_forced_logprobs(server, prompt, tokens)
        assert reported == pytest.approx(expected, abs=1e-4)
        assert answer["usage"]["completion_tokens"] == len(tokens)
    assert server.generated_tokens == sum(a["usage"]["completion_tokens"] for a in answers)
    assert server.decode_seconds > 0


async def test_a_seeded_request_samples_the_same_tokens_alone_and_in_a_batch(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    seeded = chat(QUESTIONS[1], max_tokens=20, seed=1234, top_p=0.9)
    (alone,) = await ask_all(server, [seeded])
    crowd = [chat(q, max_tokens=24, temperature=0.7) for q in QUESTIONS]
    together = await ask_all(server, [*crowd, seeded, *crowd])
    assert max(server.batch_sizes) > 1
    assert together[len(crowd)]["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]
    assert len(alone["choices"][0]["token_ids"]) > 1


async def test_temperature_zero_is_greedy_like_transformers_generate(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    answers = await ask_all(server, [chat(q, max_tokens=12, temperature=0) for q in QUESTIONS])
    for answer in answers:
        prompt = torch.tensor([answer["prompt_token_ids"]])
        with torch.no_grad():
            greedy = server.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=sorted(server.stop_token_ids),
                pad_token_id=server.pad_token_id,
            )
        assert answer["choices"][0]["token_ids"] == greedy[0, prompt.shape[1] :].tolist()


async def started(server: PolicyServer) -> None:
    for _ in range(2000):
        if server.running:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the request never started")


async def test_a_request_joins_the_running_batch_between_two_tokens(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    long = chat(QUESTIONS[0], max_tokens=300, temperature=0)  # the tiny model's greedy reply runs to the limit
    (alone,) = await ask_all(server, [long])
    shorts = [chat(q, max_tokens=3, seed=i) for i, q in enumerate(QUESTIONS)]
    async with serve_app(server.app()) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = asyncio.ensure_future(client.post("/v1/chat/completions", json=long))
        await started(server)
        replies = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for body in shorts))
        assert not first.done(), "the short requests waited for the long one to end"
        together = (await first).json()["choices"][0]
    assert len(alone["choices"][0]["token_ids"]) == 300
    assert together["token_ids"] == alone["choices"][0]["token_ids"]
    for reply in (r.json() for r in replies):
        tokens = reply["choices"][0]["token_ids"]
        reported = [entry["logprob"] for entry in reply["choices"][0]["logprobs"]["content"]]
        assert reported == pytest.approx(teacher_forced_logprobs(server, reply["prompt_token_ids"], tokens), abs=1e-4)


async def test_new_weights_wait_for_the_running_generation_and_serve_the_next(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    long = chat(QUESTIONS[0], max_tokens=300, temperature=0)
    (before,) = await ask_all(server, [long])
    generator = torch.Generator().manual_seed(0)
    state = {
        name: value + 0.05 * torch.randn(value.shape, generator=generator) if value.is_floating_point() else value
        for name, value in server.model.state_dict().items()
    }
    later = chat(QUESTIONS[1], max_tokens=5, seed=3)
    original = copy.deepcopy(server.model)
    async with serve_app(server.app()) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = asyncio.ensure_future(client.post("/v1/chat/completions", json=long))
        await started(server)
        await asyncio.to_thread(server.load_state, state, 7)  # returns at once: applied when the batch ends
        assert not first.done() and server.version == 0
        after = (await client.post("/v1/chat/completions", json=later)).json()
        running = (await first).json()["choices"][0]
    assert server.version == 7
    assert running["token_ids"] == before["choices"][0]["token_ids"]  # all of it on the old weights
    reported = [entry["logprob"] for entry in running["logprobs"]["content"]]
    expected = teacher_forced_logprobs(server, before["prompt_token_ids"], running["token_ids"], original)
    assert reported == pytest.approx(expected, abs=1e-4)
    tokens, prompt = after["choices"][0]["token_ids"], after["prompt_token_ids"]
    reported = [entry["logprob"] for entry in after["choices"][0]["logprobs"]["content"]]
    assert reported == pytest.approx(teacher_forced_logprobs(server, prompt, tokens), abs=1e-4)
    assert reported != pytest.approx(teacher_forced_logprobs(server, prompt, tokens, original), abs=1e-4)


async def test_a_prompt_sent_many_times_is_prefilled_once_and_samples_as_if_it_were_not(model_dir: Path) -> None:
    # A GRPO group: the same prompt G times with different seeds, among other prompts.
    bodies = [chat(QUESTIONS[i % 2], max_tokens=10, seed=i) for i in range(12)]
    cached = PolicyServer(model_dir, model_name="tiny")
    uncached = PolicyServer(model_dir, model_name="tiny", prompt_cache_bytes=0)
    answers = await ask_all(cached, bodies)
    assert cached.prompt_cache is not None and uncached.prompt_cache is None
    assert cached.prompt_cache.misses == 2 and len(cached.prompt_cache) == 2  # one prefill per distinct prompt
    for answer, reference in zip(answers, await ask_all(uncached, bodies), strict=True):
        choice, expected = answer["choices"][0], reference["choices"][0]
        assert choice["token_ids"] == expected["token_ids"]
        reported = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        assert reported == pytest.approx([entry["logprob"] for entry in expected["logprobs"]["content"]], abs=1e-5)
        assert reported == pytest.approx(
            teacher_forced_logprobs(cached, answer["prompt_token_ids"], choice["token_ids"]), abs=1e-4
        )


def test_a_later_turn_prefills_only_what_follows_the_earlier_prompt(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    uncached = PolicyServer(model_dir, model_name="tiny", prompt_cache_bytes=0)
    first = [int(t) for t in server.tokenizer(QUESTIONS[1])["input_ids"]]
    other = [int(t) for t in server.tokenizer(QUESTIONS[3])["input_ids"]]
    # Later turns of the first conversation (rests of 1 and 9 tokens) admitted with an unrelated prompt.
    later = [[*first, *other[:1]], [*first, *other[:9]], other]
    requests = [SamplingRequest(prompt, max_tokens=8, seed=i) for i, prompt in enumerate(later)]
    server.decode([SamplingRequest(first, max_tokens=2)])
    assert server.prompt_cache is not None
    assert (server.prompt_cache.misses, server.prompt_cache.reused_tokens) == (1, 0)
    reused = server.decode(requests)
    assert (server.prompt_cache.prefix_hits, server.prompt_cache.reused_tokens) == (2, 2 * len(first))
    for got, expected in zip(reused, uncached.decode(requests), strict=True):
        assert got.token_ids == expected.token_ids
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
        assert got.logprobs == pytest.approx(
            teacher_forced_logprobs(server, got.prompt_token_ids, got.token_ids), abs=1e-4
        )
    # The later turns were kept whole, from their reused prefixes and their rests.
    again = server.decode(requests)
    assert server.prompt_cache.hits == 3
    assert [g.token_ids for g in again] == [g.token_ids for g in reused]


async def test_new_weights_prefill_a_cached_prompt_again(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    body = chat(QUESTIONS[2], max_tokens=6, seed=5)
    original = copy.deepcopy(server.model)
    await ask_all(server, [body])
    generator = torch.Generator().manual_seed(1)
    state = {
        name: value + 0.05 * torch.randn(value.shape, generator=generator) if value.is_floating_point() else value
        for name, value in server.model.state_dict().items()
    }
    await asyncio.to_thread(server.load_state, state)
    (after,) = await ask_all(server, [body])
    assert server.prompt_cache is not None and server.prompt_cache.misses == 2
    tokens, prompt = after["choices"][0]["token_ids"], after["prompt_token_ids"]
    reported = [entry["logprob"] for entry in after["choices"][0]["logprobs"]["content"]]
    assert reported == pytest.approx(teacher_forced_logprobs(server, prompt, tokens), abs=1e-4)
    assert reported != pytest.approx(teacher_forced_logprobs(server, prompt, tokens, original), abs=1e-4)


async def test_max_batch_size_one_decodes_one_request_at_a_time(model_dir: Path) -> None:
    server = PolicyServer(model_dir, model_name="tiny", max_batch_size=1)
    await ask_all(server, [chat(q, max_tokens=4) for q in QUESTIONS])
    assert server.batch_sizes == {1: len(QUESTIONS)}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": "abc"}, "seed"),
        ({"n": 2}, "n"),
        ({"messages": []}, "messages"),
    ],
)
async def test_bad_settings_get_a_400_naming_the_field(model_dir: Path, body: dict[str, Any], field: str) -> None:
    server = PolicyServer(model_dir, model_name="tiny")
    async with serve_app(server.app()) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post("/v1/chat/completions", json={**chat(QUESTIONS[0]), **body})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == field
        headers = {"content-type": "application/json"}
        garbled = await client.post("/v1/completions", content=b"{not json", headers=headers)
        assert garbled.status_code == 400 and garbled.json()["error"]["param"] == "body"
        still = await client.post("/v1/completions", json={"prompt": "The answer is", "max_tokens": 2})
        assert still.status_code == 200
    assert sum(server.batch_sizes.values()) == 1, "a refused request must not reach the model"
