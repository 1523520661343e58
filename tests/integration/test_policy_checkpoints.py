"""Checkpoints of the trainable policy on a tiny model built offline: a saved step loads as a plain model, and a
resumed run continues from exactly the saved state (weights, optimizer; with LoRA the adapters on top of the
base model) while the initial model stays the KL reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from algorithms.serving.tiny_model import build_tiny_model
from algorithms.training.policy import ADAPTER_DIR, TrainablePolicy, token_batch

LORA: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
ROWS = [([5, 6, 7, 8], [9, 10, 11]), ([12, 13], [14])]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def one_step(policy: TrainablePolicy) -> None:
    batch = token_batch(ROWS, policy.pad_id)
    loss = -policy.forward(batch).logprobs.sum()
    policy.optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    policy.optimizer.step()


def logprobs(policy: TrainablePolicy, *, reference: bool = False) -> torch.Tensor:
    with torch.no_grad():
        return policy.forward(token_batch(ROWS, policy.pad_id), reference=reference).logprobs


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_a_resumed_policy_continues_from_the_saved_state(
    model_dir: Path, tmp_path: Path, lora: dict[str, Any] | None
) -> None:
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True, lora=lora)
    base = logprobs(policy, reference=True)
    one_step(policy)
    saved = policy.save(tmp_path / "step-1")

    if lora is not None:
        assert sum(p.requires_grad for p in policy.model.parameters()) < len(list(policy.model.parameters()))
        assert (saved / ADAPTER_DIR / "adapter_config.json").exists()
    resumed = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True, lora=lora, checkpoint=saved)
    torch.testing.assert_close(logprobs(resumed, reference=True), base)  # the reference is still the base
    assert resumed.load_optimizer(saved)
    torch.testing.assert_close(logprobs(resumed), logprobs(policy))
    assert not torch.allclose(logprobs(resumed), base)

    one_step(policy)
    one_step(resumed)  # same optimizer moments, same gradients: the same next step
    torch.testing.assert_close(logprobs(resumed), logprobs(policy), rtol=1e-4, atol=1e-5)


def test_a_lora_checkpoint_loads_as_a_plain_model(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True, lora=LORA)
    one_step(policy)
    saved = policy.save(tmp_path / "step-1")
    plain = AutoModelForCausalLM.from_pretrained(saved)
    assert not any("lora" in key for key in plain.state_dict())
    batch = token_batch(ROWS, policy.pad_id)
    with torch.no_grad():
        out = plain(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    width = batch.response_ids.shape[1]  # prompts end together, so the response columns are the last ones
    expected = torch.log_softmax(out[:, -width - 1 : -1], -1).gather(-1, batch.response_ids.unsqueeze(-1))
    torch.testing.assert_close(expected.squeeze(-1) * batch.response_mask, logprobs(policy) * batch.response_mask)
