"""Packing a conversation's calls into one sequence (``algorithms.training.packing``) changes the compute and not
the result: on a tiny Qwen2 built offline and on SmolLM2-135M-Instruct, every call's log-probs, values, loss
and gradients equal those of separate sequences; calls whose prompt does not extend the conversation so far fall
back to a sequence of their own and are counted."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from adapters import Transition
from algorithms.rl.builtin import GRPO
from algorithms.rl.lightning_rl import LightningRLConfig
from algorithms.serving.tiny_model import build_tiny_model
from algorithms.training.packing import pack
from algorithms.training.policy import TrainablePolicy, packed_token_batch, token_batch
from algorithms.training.update import Rollouts, UpdateJob, UpdateSettings, measure, update
from bench.smollm2 import available as smollm2_available

SETTINGS = UpdateSettings(clip_eps=0.2, kl_beta=0.04, micro_batch_size=2, mini_batches=1, epochs=1, max_grad_norm=None)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def call(rollout: str, step: int, prompt: list[int], response: list[int]) -> Transition:
    return Transition(
        rollout_id=rollout,
        attempt_id="a",
        group="g",
        agent_name=None,
        step=step,
        resources_id=None,
        resources_version=None,
        prompt_ids=prompt,
        response_ids=response,
        logprobs=None,
        reward=0.0,
        return_=0.0,
        final_reward=0.0,
    )


def conversation(rollout: str, turns: int, rng: random.Random) -> list[Transition]:
    """``turns`` calls, each prompt the previous prompt + response + a tool result (random token ids)."""

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(5, 300) for _ in range(rng.randint(low, high))]

    calls, prompt = [], tokens(4, 9)
    for step in range(turns):
        response = tokens(1, 6)
        calls.append(call(rollout, step, prompt, response))
        prompt = [*prompt, *response, *tokens(2, 5)]
    return calls


def mixed_batch() -> list[Transition]:
    """Three 3-turn conversations, two single calls, and a 3-turn one whose second prompt edits the history
    (its third call extends the second, so it packs with it): 14 calls in 7 sequences, 1 fallback."""
    rng = random.Random(0)
    edited = conversation("edited", 3, rng)
    history = edited[1].prompt_ids
    edited[1] = replace(edited[1], prompt_ids=[history[0] + 1, *history[1:]])
    edited[2] = replace(edited[2], prompt_ids=[history[0] + 1, *edited[2].prompt_ids[1:]])
    batch = [
        *conversation("c0", 3, rng),
        *conversation("single0", 1, rng),
        *conversation("c1", 3, rng),
        *edited,
        *conversation("single1", 1, rng),
        *conversation("c2", 3, rng),
    ]
    rng.shuffle(batch)  # calls come in any order: packing sorts each conversation by step
    return batch


def test_pack_groups_each_conversations_calls_whose_prompts_extend_each_other() -> None:
    batch = mixed_batch()
    packing = pack(batch)
    by_rollout = {t.rollout_id: sorted(i for i, u in enumerate(batch) if u.rollout_id == t.rollout_id) for t in batch}
    rows = [sorted(row) for row in packing.rows]
    for rollout in ("c0", "c1", "c2"):
        assert by_rollout[rollout] in rows
    first, second, third = sorted(by_rollout["edited"], key=lambda i: batch[i].step)
    assert [first] in rows and sorted([second, third]) in rows
    assert all([batch[i].step for i in row] == sorted(batch[i].step for i in row) for row in packing.rows)
    sequence_tokens = sum(len(batch[row[-1]].prompt_ids) + len(batch[row[-1]].response_ids) for row in packing.rows)
    assert packing.metrics() == {
        "packed_calls": 11.0,
        "pack_fallback_calls": 1.0,
        "train_sequences": 7.0,
        "train_sequence_tokens": float(sequence_tokens),
    }
    separate = pack(batch, enabled=False)
    assert separate.rows == [[i] for i in range(len(batch))]
    assert separate.sequence_tokens == sum(len(t.prompt_ids) + len(t.response_ids) for t in batch) > sequence_tokens


def test_two_agents_interleaving_in_one_episode_each_grow_their_own_sequence() -> None:
    rng = random.Random(1)
    planner, critic = conversation("r", 2, rng), conversation("r", 2, rng)
    calls = [replace(planner[0], step=0), replace(critic[0], step=1), replace(planner[1], step=2)]
    calls.append(replace(critic[1], step=3))
    packing = pack(calls)
    assert sorted(packing.rows) == [[0, 2], [1, 3]]
    assert packing.fallback_calls == 1  # the critic's first call extends nothing of the planner's


def test_a_packed_row_must_hold_its_calls_as_prefixes() -> None:
    with pytest.raises(ValueError, match="prefix"):
        packed_token_batch([[([1, 2], [3]), ([1, 2, 4, 5], [6])]], pad_id=0)


def test_packed_log_probs_and_values_equal_those_of_separate_sequences(model_dir: Path) -> None:
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True, value_head=True)
    assert policy.value_head is not None
    torch.nn.init.normal_(policy.value_head.weight)  # a zero head would make every value 0 either way
    policy.model.eval()
    batch = mixed_batch()
    rows = pack(batch).rows
    calls = [i for row in rows for i in row]
    packed = packed_token_batch([[(batch[i].prompt_ids, batch[i].response_ids) for i in row] for row in rows], 0)
    separate = token_batch([(batch[i].prompt_ids, batch[i].response_ids) for i in calls], 0)
    assert not packed.aligned and separate.aligned
    assert packed.input_ids.shape[0] < separate.input_ids.shape[0]
    torch.testing.assert_close(packed.response_mask, separate.response_mask)
    with torch.no_grad():
        for reference in (False, True):
            a, b = policy.forward(packed, reference=reference), policy.forward(separate, reference=reference)
            mask = separate.response_mask
            torch.testing.assert_close(a.logprobs * mask, b.logprobs * mask, rtol=0.0, atol=1e-5)
            if not reference:
                assert a.values is not None and b.values is not None
                torch.testing.assert_close(a.values * mask, b.values * mask, rtol=0.0, atol=1e-5)


class RecordedGradients:
    """An :class:`algorithms.training.optimization.Optimization` that keeps each step's gradients instead of
    applying them, so that two updates compute theirs from the same weights."""

    rank, world = 0, 1

    def __init__(self, policy: TrainablePolicy) -> None:
        self.params = [p for group in policy.optimizer.param_groups for p in group["params"]]
        self.steps: list[list[torch.Tensor]] = []
        policy.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # type: ignore[no-untyped-call]

    def step(self) -> float:
        self.steps.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params])
        for p in self.params:
            p.grad = None
        return 0.0

    def reduce(self, totals: dict[str, float]) -> dict[str, float]:
        return totals


def train_twice(
    policy: TrainablePolicy, batch: list[Transition], settings: UpdateSettings, *, old_logprobs: bool
) -> dict[bool, tuple[dict[str, float], list[list[torch.Tensor]]]]:
    """The metrics and gradients of one update of ``batch``, packed and not, from the same weights (PPO's
    value loss included when the policy has a value head)."""
    results = {}
    for packing in (True, False):
        rollouts = measure(policy, batch, settings.micro_batch_size, old_logprobs=old_logprobs, packing=packing)
        # Each call its own advantage (and return), as credit assignment gives them.
        per_call = torch.linspace(-1.0, 1.0, len(batch)).unsqueeze(1)
        advantages = per_call * rollouts.mask
        returns = (per_call + 0.5) * rollouts.mask if rollouts.values is not None else None
        recorded = RecordedGradients(policy)
        metrics = update(policy, batch, advantages, rollouts, settings, returns, None, recorded, packing=packing)
        results[packing] = (metrics, recorded.steps)
    return results


def assert_same_update(
    results: dict[bool, tuple[dict[str, float], list[list[torch.Tensor]]]], rtol: float = 0.0
) -> None:
    """Equal metrics (to 1e-5) and gradients (to 1e-5 plus ``rtol`` of their size)."""
    (packed, packed_grads), (separate, separate_grads) = results[True], results[False]
    for name in ("loss", "pg_loss", "kl", "entropy", "value_loss", "clip_fraction"):
        if name in separate:
            assert packed[name] == pytest.approx(separate[name], abs=1e-5), name
    assert len(packed_grads) == len(separate_grads)
    for step_a, step_b in zip(packed_grads, separate_grads, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-5)
    assert any(bool(g.abs().sum() > 0) for g in packed_grads[0]), "no gradient at all"


def test_a_packed_update_has_the_loss_and_gradients_of_separate_sequences(model_dir: Path) -> None:
    """A mixed batch (packed conversations, single calls, a fallback), micro-batches of two rows, one optimizer
    step with the old log-probs from the training pass (GRPO's default)."""
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True)
    results = train_twice(policy, mixed_batch(), SETTINGS, old_logprobs=False)
    assert_same_update(results)
    assert {k: results[True][0][k] for k in ("packed_calls", "pack_fallback_calls", "train_sequences")} == {
        "packed_calls": 11.0,
        "pack_fallback_calls": 1.0,
        "train_sequences": 7.0,
    }
    assert results[False][0]["train_sequences"] == 14.0 and results[False][0]["packed_calls"] == 0.0


def test_packed_ppo_with_a_value_head_and_several_optimizer_steps_matches_separate_sequences(model_dir: Path) -> None:
    """PPO's path: measured old log-probs and values, the value loss, two epochs of one mini-batch each (the
    second epoch's order differs between the two, its mini-batch, the whole batch, does not)."""
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=True, value_head=True)
    assert policy.value_head is not None
    torch.nn.init.normal_(policy.value_head.weight, std=0.1)
    settings = replace(SETTINGS, epochs=2)
    results = train_twice(policy, mixed_batch(), settings, old_logprobs=True)
    assert_same_update(results)
    assert "value_loss" in results[True][0]


class JobRecorder:
    """A :class:`algorithms.training.trainers.Trainer` in this process that keeps the jobs it runs."""

    def __init__(self, policy: TrainablePolicy) -> None:
        self.policy = policy
        self.jobs: list[UpdateJob] = []

    def update(self, job: UpdateJob) -> dict[str, float]:
        self.jobs.append(job)
        return job.run(self.policy)


@pytest.mark.parametrize("packing", [True, False])
def test_the_pack_conversations_option_reaches_the_update_job(model_dir: Path, packing: bool) -> None:
    """The option is part of the job a trainer runs (the DeepSpeed trainer broadcasts the job to its ranks)."""
    assert LightningRLConfig().pack_conversations is True
    batch = [replace(t, return_=float(i % 3)) for i, t in enumerate(mixed_batch())]  # a group worth training
    trainer = JobRecorder(TrainablePolicy(model_dir, learning_rate=1e-2, reference=True))
    metrics = GRPO(pack_conversations=packing, micro_batch_size=2)._step(trainer, batch, [])  # type: ignore[arg-type]
    assert [job.packing for job in trainer.jobs] == [packing]
    assert metrics["train_sequences"] == (7.0 if packing else 14.0)
    assert metrics["packed_calls"] == (11.0 if packing else 0.0)


def test_an_update_job_packs_unless_told_not_to(model_dir: Path) -> None:
    policy = TrainablePolicy(model_dir, learning_rate=1e-2, reference=False)
    batch = mixed_batch()
    rollouts: Rollouts = measure(policy, batch, 4, old_logprobs=False, packing=False)
    settings = replace(SETTINGS, kl_beta=0.0)
    assert UpdateJob(batch, rollouts.mask.clone(), rollouts, settings).run(policy)["train_sequences"] == 7.0
    job = UpdateJob(batch, rollouts.mask.clone(), rollouts, settings, packing=False)
    assert job.run(policy)["train_sequences"] == len(batch)


@pytest.mark.slow
def test_packing_a_real_chat_on_smollm2_gives_the_loss_and_gradients_of_separate_sequences(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A 3-turn tool conversation rendered with SmolLM2's own chat template: each prompt is the template of the
    conversation so far, so the test also shows that this template extends its previous renderings exactly."""
    if not smollm2_available():
        pytest.skip("SmolLM2 needs the smollm2 and train extras (bench/smollm2.py)")
    from bench.smollm2 import convert

    model = convert(tmp_path_factory.mktemp("smollm2") / "model")
    policy = TrainablePolicy(model, learning_rate=1e-5, reference=True)
    # In float64: in float32 the two summation orders put some gradients (RMSNorm weights, whose gradient is a
    # sum over every position with much cancellation) up to 3e-3 of their largest entry apart, which would hide
    # a small error. In float64 (logits too) they agreed to 1.6e-7: float32 is left only inside RMSNorm.
    policy.model.double()
    policy.reference.double()
    tokenizer = policy.tokenizer
    replies = ["memory", "search for flights to Paris tomorrow", "The TAP flight at 06:05 fits your budget."]
    results = ["Itinerary: Lisbon to Paris, budget 300 EUR.", "TAP 06:05 arrives 09:40 (210 EUR)."]
    batch = []
    for rollout, question in enumerate(["My flight was cancelled.", "Rebook my cancelled flight to Paris."]):
        messages = [{"role": "system", "content": "Name the tool to call next."}, {"role": "user", "content": question}]
        for step, reply in enumerate(replies):
            prompt = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            response = [*tokenizer(reply)["input_ids"], tokenizer.convert_tokens_to_ids("<|im_end|>")]
            batch.append(call(f"r{rollout}", step, list(prompt), response))
            messages += [{"role": "assistant", "content": reply}]
            if step < len(results):
                messages += [{"role": "user", "content": results[step]}]
    batch.append(call("single", 0, batch[0].prompt_ids, batch[0].response_ids[:2]))
    outcome = train_twice(policy, batch, SETTINGS, old_logprobs=False)
    assert outcome[True][0]["packed_calls"] == 6.0 and outcome[True][0]["pack_fallback_calls"] == 0.0
    # A position read off the wrong column is off by far more than the tolerance.
    assert_same_update(outcome, rtol=1e-5)
