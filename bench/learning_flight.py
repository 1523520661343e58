"""The first real-model result: GRPO on the cancelled-flight agent with SmolLM2-135M-Instruct, through the whole
stack (``store serve`` and ``store run`` as subprocesses, the policy server and the trainer here, as ``store
train`` runs them). Prints the held-out Memory-first rate before and after, the wall time, and tokens/s.

The agent asks once (``steps`` 1) and takes the first tool the reply names. Asked plainly, SmolLM2 names no tool
(0 of 128 replies at temperature 1), which leaves nothing to reinforce; so each task carries nine demonstrations
(``SHOTS``: earlier turns on unrelated travel questions, three per tool, memory first in each round) and words
every question the same way (``ASK``). Then about 84% of its replies name a tool and 30% name memory first
(measured on 128 samples with transformers' sampling). The held-out rate is also split into replies that *name*
memory, which is what training has to teach.

    pip install torch==2.13.0 -e ".[train,smollm2]"
    python -m bench.learning_flight            # 12 GRPO steps × 32 rollouts, lr 3e-6
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from algorithms.cli import read_tasks
from algorithms.local_stack import embedded_store_client, runners
from algorithms.rl.builtin import GRPO
from algorithms.serving.batching import SamplingRequest
from algorithms.serving.local import LocalPolicy
from algorithms.session import TrainingSession
from bench.smollm2 import convert
from examples.flight.agent import choose_tool, opening

ROOT = Path(__file__).parents[1]


ASK = "Question: {question}\nWhich tool first: search, calculator or memory?"
SHOTS = [
    ("What did I tell you my hotel budget was?", "memory"),
    ("How much is 3 nights at 85 euros each?", "calculator"),
    ("Look up trains from Madrid to Seville on Friday.", "search"),
    ("Which seat did I say I prefer?", "memory"),
    ("What is 15% of a 240 euro bill?", "calculator"),
    ("Find the opening hours of the Louvre.", "search"),
    ("Remind me which airline I like.", "memory"),
    ("Convert 120 dollars to euros at 0.92.", "calculator"),
    ("What's the weather in Rome this weekend?", "search"),
]


def single_turn(name: str, max_tokens: int) -> list[dict[str, Any]]:
    """The example's tasks from ``name`` (JSON Lines), asked once with this token limit, with the
    demonstrations."""
    options = {"steps": 1, "max_tokens": max_tokens, "shots": SHOTS, "ask": ASK}
    return [task | options for task in read_tasks(ROOT / "examples" / "flight" / name)]


def rates(policy: LocalPolicy, tasks: list[dict[str, Any]], samples: int, max_tokens: int) -> tuple[float, float]:
    """(Memory-first rate as the agent decides it, share of replies that name memory first) over ``samples``
    seeded samples per task, decoded by the policy server itself."""
    server = policy.server
    requests = [
        SamplingRequest(
            list(server.tokenizer.apply_chat_template(opening(t), add_generation_prompt=True, return_dict=False)),
            max_tokens=max_tokens,
            seed=seed,
        )
        for t in tasks
        for seed in range(samples)
    ]
    replies = [server.text(g.token_ids) for g in server.decode(requests)]
    chosen = [choose_tool(r) == "memory" for r in replies]
    named = [choose_tool(r) == "memory" and "memory" in r.lower() for r in replies]
    return sum(chosen) / len(replies), sum(named) / len(replies)


async def run(model: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    train_tasks = single_turn("train.jsonl", args.max_tokens)
    val_tasks = single_turn("val.jsonl", args.max_tokens)
    algorithm = GRPO(
        tasks_per_step=args.tasks,
        group_size=args.group,
        learning_rate=args.lr,
        kl_beta=0.04,
        micro_batch_size=8,
        save_every=0,
        eval_repeats=args.eval_repeats,
    )
    async with embedded_store_client(work / "store") as (store, url):
        with (
            runners("examples.flight.agent:flight_agent", url, workers=args.workers, log=work / "runner.log"),
            LocalPolicy(model, model_name="smollm2") as policy,
        ):
            before = rates(policy, val_tasks, args.samples, args.max_tokens)
            started = time.perf_counter()
            session = TrainingSession(
                store=store,
                train_tasks=train_tasks,
                val_tasks=val_tasks,
                model_dir=model,
                output_dir=work / "out",
                policy=policy,
                max_steps=args.steps,
                freeze_heap=True,
            )
            summary = await algorithm.train(session)
            wall = time.perf_counter() - started
            after = rates(policy, val_tasks, args.samples, args.max_tokens)
            generated = policy.server.generated_tokens
            decode_seconds = policy.server.decode_seconds
    steps = [h for h in summary["history"] if "step_seconds" in h]
    trained = [h for h in steps if "update_seconds" in h]  # a step whose groups all agreed trains nothing
    trained_tokens = sum(h["train_tokens_per_second"] * h["update_seconds"] for h in trained)
    return {
        "before": before,
        "after": after,
        "val_reward": (summary["history"][0]["val_reward"], summary["history"][-1]["val_reward"]),
        "wall_seconds": wall,
        "step_seconds": sum(h["step_seconds"] for h in steps) / len(steps),
        "generated_tokens_per_second": generated / decode_seconds,
        "trained_tokens_per_second": trained_tokens / max(sum(h["update_seconds"] for h in trained), 1e-9),
        "train_seconds": sum(h["train_seconds"] for h in trained) / max(len(trained), 1),
        "reward_curve": [round(h["reward_mean"], 2) for h in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(tempfile.gettempdir()) / "smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tasks", type=int, default=4, help="Tasks per step.")
    parser.add_argument("--group", type=int, default=8, help="Rollouts per task (G).")
    parser.add_argument("--lr", type=float, default=3e-6)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--eval-repeats", type=int, default=8, help="Rollouts per validation task (val_reward).")
    parser.add_argument("--samples", type=int, default=32, help="Seeded samples per validation task (rates).")
    args = parser.parse_args()
    model = convert(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(run(model, args, Path(tmp)))
    before, after = result["before"], result["after"]
    print(f"SmolLM2-135M-Instruct, GRPO {args.steps} steps × {args.tasks * args.group} rollouts, lr {args.lr}")
    print(f"Memory-first rate (held out): {before[0]:.3f} -> {after[0]:.3f}")
    print(f"replies naming memory:        {before[1]:.3f} -> {after[1]:.3f}")
    print(f"val_reward (agent rollouts):  {result['val_reward'][0]:.3f} -> {result['val_reward'][1]:.3f}")
    print(f"wall {result['wall_seconds']:.0f} s, {result['step_seconds']:.1f} s/step")
    print(f"generated {result['generated_tokens_per_second']:.0f} tokens/s (policy server while decoding)")
    print(f"trained {result['trained_tokens_per_second']:.0f} tokens/s (update), {result['train_seconds']:.1f} s/step")
    print(f"training reward by step: {result['reward_curve']}")


if __name__ == "__main__":
    main()
