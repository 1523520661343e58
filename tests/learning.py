"""The learning setup of the cancelled-flight task: a tiny model that names one of three tools at about equal
rates, and a harness that trains it with a LightningRL algorithm through the whole stack (store served over
HTTP, LLM proxy, runner worker processes, policy server, trainer)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from algorithms.base import Algorithm
from algorithms.serving.batching import SamplingRequest, generate_batch
from algorithms.serving.local import LocalPolicy
from algorithms.serving.policy_server import PolicyServer
from algorithms.serving.tiny_model import CHAT_TEMPLATE, build_tiny_model
from algorithms.session import TrainingSession
from lightning_store.sql import SqlStore
from runners import Runner
from tests.flight_agent import NAMES, SYSTEM

QUESTIONS = [
    "My flight to Paris was cancelled. Book me another one for tomorrow morning.",
    "The airline cancelled my flight home; what should I take instead?",
    "Flight cancelled, I need to be in Paris by nine. Help.",
    "My morning flight got cancelled. Find the best replacement.",
    "Cancelled flight to Lisbon, please rebook me within budget.",
    "They cancelled my connection. Which flight can I still take?",
    "My 7am flight is cancelled; get me there before my meeting.",
    "Flight cancelled again. What are my options for tomorrow?",
    "I lost my flight to a cancellation, rebook me please.",
    "The flight I booked was cancelled, can you sort it out?",
    "Cancellation on my trip to Paris, find another flight.",
    "My return flight was cancelled, what now?",
]
TRAIN_TASKS = [{"task_id": f"q{i}", "question": q, "steps": 1, "max_tokens": 4} for i, q in enumerate(QUESTIONS[:8])]
VAL_TASKS = [{"task_id": f"v{i}", "question": q, "steps": 1, "max_tokens": 4} for i, q in enumerate(QUESTIONS[8:])]


def prompt_ids(tokenizer: Any, question: str, system: str = SYSTEM) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def build_tool_namer(
    path: Path,
    *,
    steps: int = 120,
    seed: int = 0,
    roles: Sequence[tuple[str, Sequence[str]]] = ((SYSTEM, NAMES),),
) -> Path:
    """A tiny Qwen2 fine-tuned to answer the flight prompt with one tool name, each about a third of the time
    (the maximum-likelihood fit of a uniform mixture): the untrained starting point of the learning tests.
    ``roles`` lists (system prompt, answers) pairs; each is learnt the same way (answers equally likely)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    answers = [answer for _, role_answers in roles for answer in role_answers]
    corpus = [*(system for system, _ in roles), *QUESTIONS, *answers, CHAT_TEMPLATE]
    build_tiny_model(path, corpus=corpus, vocab_size=384, hidden_size=64, layers=2, heads=4, seed=seed)
    tokenizer: Any = AutoTokenizer.from_pretrained(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path)
    rows = []
    for system, role_answers in roles:
        for question in QUESTIONS:
            prompt = prompt_ids(tokenizer, question, system)
            for answer in role_answers:
                rows.append((prompt, [*tokenizer(answer)["input_ids"], tokenizer.eos_token_id]))
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    model.train()
    for _ in range(steps * len(roles)):
        batch = rng.sample(rows, 18)
        length = max(len(p) + len(r) for p, r in batch)
        ids = torch.full((len(batch), length), tokenizer.pad_token_id)
        labels = torch.full((len(batch), length), -100)
        attention = torch.zeros((len(batch), length), dtype=torch.long)
        for i, (p, r) in enumerate(batch):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
            attention[i, : len(p) + len(r)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(path)
    return path


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
    with torch.no_grad():
        generations = generate_batch(
            server.model, requests, stop_token_ids=server.stop_token_ids, pad_token_id=server.pad_token_id
        )
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
    agent: str = "tests.flight_agent:flight_agent",
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
