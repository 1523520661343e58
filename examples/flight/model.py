"""The starting model of the cancelled-flight example: a tiny Qwen2 built offline (a byte-level BPE trained on
the example's text, random weights) and fine-tuned to answer the planner's prompt with one tool name, each
about a third of the time. Reinforcement learning then has to find that memory first is what is rewarded.

    python -m examples.flight.model flight-model     # ~10 s on a laptop CPU; says what it does on stderr

The example's tasks, ``train.jsonl`` and ``val.jsonl`` beside this file, are ``TRAIN_TASKS`` and ``VAL_TASKS``.

In a real project ``store train --model`` takes your own model directory instead (any causal LM that
transformers loads, with a chat template).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from algorithms.serving.tiny_model import CHAT_TEMPLATE, build_tiny_model
from examples.flight.agent import NAMES, SYSTEM

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
    heads: int = 4,
    say: Callable[[str], None] = lambda text: None,
    on_step: Callable[[int, int, float], None] = lambda step, total, loss: None,
) -> Path:
    """A tiny Qwen2 fine-tuned to answer the flight prompt with one tool name, each about a third of the time
    (the maximum-likelihood fit of a uniform mixture): the untrained starting point of the learning tests.
    ``roles`` lists (system prompt, answers) pairs; each is learnt the same way (answers equally likely).
    ``heads``: attention heads of the 64-wide model (vLLM's CPU kernels need 2, a head size of 32).
    ``say`` is told what it does next, ``on_step`` each fine-tuning step's number, the total and the loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    answers = [answer for _, role_answers in roles for answer in role_answers]
    corpus = [*(system for system, _ in roles), *QUESTIONS, *answers, CHAT_TEMPLATE]
    say("training a byte-level BPE tokenizer on the example's text and building a tiny Qwen2 (random weights)")
    build_tiny_model(path, corpus=corpus, vocab_size=384, hidden_size=64, layers=2, heads=heads, seed=seed)
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
    total = steps * len(roles)
    say(f"fine-tuning it for {total} steps to name one of the tools {', '.join(NAMES)}")
    for step in range(1, total + 1):
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
        on_step(step, total, loss.item())
    say(f"saving the model to {path}")
    model.save_pretrained(path)
    return path


@contextmanager
def fine_tuning_display() -> Iterator[Callable[[int, int, float], None]]:
    """Shows the fine-tuning steps on stderr: a progress bar on a terminal, else a line every 20 steps."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:

        def line(step: int, total: int, loss: float) -> None:
            if step % 20 == 0 or step == total:
                print(f"  step {step}/{total}  loss {loss:.3f}", file=sys.stderr, flush=True)

        yield line
        return
    columns = (TextColumn("  fine-tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*columns, TextColumn("loss {task.fields[loss]}"), console=console)
    task = bar.add_task("fine-tuning", total=None, loss="-")

    def update(step: int, total: int, loss: float) -> None:
        if not bar.live.is_started:
            bar.start()  # at the first step, not while the tokenizer is built
        bar.update(task, completed=step, total=total, loss=f"{loss:.3f}")

    try:
        yield update
    finally:
        bar.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="directory to write the model to")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars ("Loading weights", ...)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with fine_tuning_display() as on_step:
        path = build_tool_namer(args.output, say=say, on_step=on_step)
    print(f"model written to {path}")


if __name__ == "__main__":
    main()
