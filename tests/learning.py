"""The learning harness: trains a tiny model with a LightningRL algorithm through the whole stack, laid out as
``store train`` lays it out (``store serve`` on SQLite and ``store run`` with its workers as subprocesses, the
policy server and the trainer in this process), and measures an agent's behaviour on a model directly."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from adapters import Transition
from algorithms.base import Algorithm
from algorithms.local_stack import runners
from algorithms.serving.batching import SamplingRequest
from algorithms.serving.local import LocalPolicy
from algorithms.serving.policy_server import PolicyServer
from algorithms.session import TrainingSession
from examples.flight.model import TRAIN_TASKS, VAL_TASKS, prompt_ids
from lightning_store.client import HttpStore
from lightning_store.settings import TrainerSettings

GRADIENT_OFF = os.environ.get("LIGHTNING_STORE_TEST_GRADIENT_OFF") == "1"
"""The control of every learning test that trains through :func:`train`: set, the algorithm runs with a learning
rate of 1e-12 (the same rollouts, losses and gradients; the weights do not move), and each such test must fail.
That it does is what shows the test measures learning and not luck (README, "Learning tests fail without a
gradient")."""

STARTING_RATE_CEILING = 0.55
"""A held-out Memory-first rate at or above this says the starting model already prefers Memory. The tool namer
names it first with p = 0.35 (0.348 over 256 seeded samples per validation question). A run measures it on at
least 64 unseeded rollouts (4 questions x 16), where 0.5 or more comes about once in 110 evaluations (a CI run
failed on one) and 0.55 or more about once in 2,800; a trained model's 0.8 stays far above either."""


def make_transitions(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]],
    logprobs: Sequence[list[float] | None] | None = None,
    agent: str | None = None,
) -> list[Transition]:
    """Transitions of ``(prompt ids, response ids)`` rows (one rollout each, one group), with the behaviour
    ``logprobs`` the server would have reported (None: not reported)."""
    behaviour = list(logprobs) if logprobs is not None else [None] * len(rows)
    return [
        Transition(
            rollout_id=f"r{i}",
            attempt_id="a",
            group="g",
            agent_name=agent,
            step=0,
            resources_id=None,
            resources_version=None,
            prompt_ids=list(prompt),
            response_ids=list(response),
            logprobs=row_logprobs,
            reward=0.0,
            return_=0.0,
            final_reward=0.0,
        )
        for i, ((prompt, response), row_logprobs) in enumerate(zip(rows, behaviour, strict=True))
    ]


def answer_rate(
    model_dir: Path, system: str, accept: Callable[[str], bool], *, questions: Sequence[str], samples: int = 64
) -> float:
    """The share of sampled replies (temperature 1, fixed seeds) to ``system`` + each question that ``accept``
    takes: how an agent behaves, measured on the model itself rather than through a training run."""
    server = PolicyServer(model_dir)
    requests = [
        SamplingRequest(prompt_ids(server.tokenizer, question, system), max_tokens=4, seed=seed)
        for question in questions
        for seed in range(samples)
    ]
    generations = server.decode(requests)
    return sum(accept(server.text(g.token_ids)) for g in generations) / len(generations)


async def train(
    algorithm: Algorithm,
    *,
    store: HttpStore,
    url: str,
    model_dir: Path,
    output_dir: Path,
    steps: int,
    workers: int = 2,
    concurrency: int = 8,
    train_tasks: Sequence[Any] = TRAIN_TASKS,
    val_tasks: Sequence[Any] = VAL_TASKS,
    agent: str = "examples.flight.agent:flight_agent",
    trainer: TrainerSettings | None = None,
) -> dict[str, Any]:
    """Train with ``store run`` running ``agent`` (the flight agent) against the store at ``url``, with
    ``workers × concurrency`` attempts in flight; the algorithm's summary. (With :data:`GRADIENT_OFF`, nothing is
    learnt.)"""
    if GRADIENT_OFF:
        algorithm.config = algorithm.config.model_copy(update={"learning_rate": 1e-12})
    await asyncio.to_thread(output_dir.mkdir, parents=True, exist_ok=True)
    with (
        runners(agent, url, workers=workers, concurrency=concurrency, log=output_dir / "runner.log"),
        LocalPolicy(model_dir, model_name="tiny") as policy,
    ):
        session = TrainingSession(
            store=store,
            train_tasks=train_tasks,
            val_tasks=val_tasks,
            model_dir=model_dir,
            output_dir=output_dir,
            policy=policy,
            max_steps=steps,
            trainer=trainer or TrainerSettings(),
        )
        return await algorithm.train(session)
