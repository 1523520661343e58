"""The learning setup of the cancelled-flight task: a tiny model that names one of three tools at about equal
rates, and a harness that trains it with a LightningRL algorithm through the whole stack (store served over
HTTP, LLM proxy, runner worker processes, policy server, trainer)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from algorithms.base import Algorithm
from algorithms.serving.batching import SamplingRequest
from algorithms.serving.local import LocalPolicy
from algorithms.serving.policy_server import PolicyServer
from algorithms.session import TrainingSession
from examples.flight.model import TRAIN_TASKS, VAL_TASKS, prompt_ids
from lightning_store.sql import SqlStore
from runners import Runner


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
    store: SqlStore,
    url: str,
    model_dir: Path,
    output_dir: Path,
    steps: int,
    workers: int = 4,
    train_tasks: Sequence[Any] = TRAIN_TASKS,
    val_tasks: Sequence[Any] = VAL_TASKS,
    agent: str = "examples.flight.agent:flight_agent",
) -> dict[str, Any]:
    """Train with ``store run``'s Python API running ``agent`` (the flight agent); the algorithm's summary."""
    runner = Runner(
        agent,
        url,
        workers=workers,
        heartbeat_interval=1.0,
        poll_timeout=1.0,
        progress=False,
    )
    running = asyncio.create_task(runner.run())
    policy = LocalPolicy(model_dir, model_name="tiny").start()
    try:
        session = TrainingSession(
            store=store,
            train_tasks=train_tasks,
            val_tasks=val_tasks,
            model_dir=model_dir,
            output_dir=output_dir,
            policy=policy,
            max_steps=steps,
        )
        return await algorithm.train(session)
    finally:
        policy.stop()
        runner.stop()
        await running
