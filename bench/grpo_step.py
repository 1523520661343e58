"""Time per GRPO step: our whole stack against TRL's ``GRPOTrainer``, on the same model, batch and generation
length, one after the other in one run; prints both (the median step, and the mean, which pauses such as a
garbage collection's show in), the ratio, and where our step's time goes.

The task is the cancelled-flight question, single-turn: one completion per rollout, reward 1 when it names
memory first. Both sides draw ``--prompts`` prompts per step, sample ``--group`` completions of each (at most
``--max-tokens`` tokens, temperature 1), and take one optimizer step over all of them with the same loss (clipped
ratio ε 0.2, k3 KL to the starting model with β 0.04, token mean over the batch, micro-batches of 8).

* Ours: ``store serve`` (SQLite) and ``store run`` (``--workers`` processes, ``--concurrency`` attempts each) as
  subprocesses; the flight agent calls the policy server through the store's LLM proxy; the trainer waits for
  the rollouts, adapts them from the store, updates, and serves the new weights (what ``store train`` does).
* TRL: ``GRPOTrainer`` generating with ``model.generate`` in its own process (no vLLM on a CPU).

The middleware share is the part of our step spent neither decoding (the policy server's time) nor training:
the store, the proxy, the runners, the adapter and publishing the new weights.

``--turns N`` makes each rollout a conversation of N calls (the agent appends its reply and the tool's result
and asks again, so each call's prompt extends the previous prompt and response): ours only (TRL's trainer is
single-turn), to compare the training time of an N-turn step with a 1-turn one. ``--no-packing`` trains every call
as a separate sequence (``pack_conversations: false``, ``algorithms.training.packing``), as before conversations
were packed.

    python -m bench.grpo_step --steps 8
    python -m bench.grpo_step --model /path/to/SmolLM2-135M-Instruct --steps 4
    python -m bench.grpo_step --turns 3 --no-packing --steps 4
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from algorithms import tensor_thread
from algorithms.local_stack import embedded_store_client, runners
from algorithms.rl.builtin import GRPO
from algorithms.serving.local import LocalPolicy
from algorithms.session import TrainingSession
from examples.flight.agent import SYSTEM, choose_tool
from examples.flight.model import QUESTIONS, build_tool_namer
from lightning_store import aio

PACKING_METRICS = ("train_sequences", "train_sequence_tokens", "packed_calls", "pack_fallback_calls")
WARMUP_STEPS = 1  # the first step of either side pays for one-off work (allocations, lazy imports)


def options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tasks_per_step": args.prompts,
        "group_size": args.group,
        "learning_rate": 1e-5,
        "kl_beta": 0.04,
        "clip_eps": 0.2,
        "micro_batch_size": 8,
        "save_every": 0,
        "asynchronous": args.asynchronous,
        "pack_conversations": not args.no_packing,
    }


async def ours(model: Path, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """Median seconds per step of our stack, and the medians of its parts."""
    tasks = [{"question": q, "steps": args.turns, "max_tokens": args.max_tokens} for q in QUESTIONS]
    decode_marks = [0.0]  # the policy server's decode_seconds at the end of each step
    async with embedded_store_client(work / "store") as (store, url):
        with (
            runners(
                "examples.flight.agent:flight_agent",
                url,
                workers=args.workers,
                concurrency=args.concurrency,
                log=work / "runner.log",
            ),
            LocalPolicy(model, model_name="policy", decode_threads=args.decode_threads) as policy,
        ):
            session = TrainingSession(
                store=store,
                train_tasks=tasks,
                val_tasks=[],
                model_dir=model,
                output_dir=work / "ours",
                policy=policy,
                max_steps=args.steps,
                on_step=lambda step, metrics: decode_marks.append(policy.server.decode_seconds),
                freeze_heap=True,
            )
            summary = await GRPO(**options(args)).train(session)
    steps = [h for h in summary["history"] if "step_seconds" in h][WARMUP_STEPS:]
    decode = [b - a for a, b in itertools.pairwise(decode_marks)][WARMUP_STEPS:]
    rows = []
    for h, d in zip(steps, decode, strict=True):
        rows.append(
            {
                "step": h["step_seconds"],
                "decode": d,
                "train": h["train_seconds"],
                "collect": h["collect_seconds"],
                "store_proxy_runners": h["collect_seconds"] - d,
                "adapt": h["adapt_seconds"],
                "publish": h["publish_seconds"],
                "tokens": h["train_tokens_per_second"] * h["update_seconds"],
                "reward": h["reward_mean"],
                "calls": h["transitions"],
                **{name: h.get(name, 0.0) for name in PACKING_METRICS},
            }
        )
    medians = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    return medians | {"mean_step": statistics.fmean(r["step"] for r in rows)}


def trl(model: Path, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """Median seconds per step of TRL's GRPOTrainer on the same model, batch and loss."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    marks: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            marks.append(time.perf_counter())

    def memory_first(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(choose_tool(c[0]["content"] if isinstance(c, list) else c) == "memory") for c in completions]

    prompts = [
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
        for q in QUESTIONS * (args.steps * args.prompts // len(QUESTIONS) + 1)
    ]
    o = options(args)
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        use_cpu=True,
        max_steps=args.steps,
        per_device_train_batch_size=o["micro_batch_size"],
        gradient_accumulation_steps=args.prompts * args.group // o["micro_batch_size"],
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        beta=o["kl_beta"],
        epsilon=o["clip_eps"],
        learning_rate=o["learning_rate"],
        loss_type="dapo",
        num_iterations=1,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        disable_dropout=True,
        # What ours does: float32 and no activation recomputation. TRL's defaults (bf16 autocast, gradient
        # checkpointing) would make the reference up to 16x slower on a CPU without AVX-512 BF16.
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        processing_class=AutoTokenizer.from_pretrained(model),
        reward_funcs=cast(Any, memory_first),
        args=config,
        train_dataset=Dataset.from_list(prompts),
        callbacks=[StepTimer()],
    )
    trainer.train()
    durations = [end - begin for begin, end in zip(marks[::2], marks[1::2], strict=True)][WARMUP_STEPS:]
    logged = [h for h in trainer.state.log_history if "reward" in h][WARMUP_STEPS:]
    return {
        "step": statistics.median(durations),
        "mean_step": statistics.fmean(durations),
        "tokens": statistics.median(h.get("completions/mean_length", 0.0) * args.prompts * args.group for h in logged),
        "reward": statistics.median(h["reward"] for h in logged),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="A model directory (default: the tiny flight model, built now).")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per side (the first is not counted).")
    parser.add_argument("--prompts", type=int, default=8, help="Prompts (tasks) per step.")
    parser.add_argument("--group", type=int, default=8, help="Completions per prompt (G).")
    parser.add_argument("--max-tokens", type=int, default=16, help="Longest completion.")
    parser.add_argument("--workers", type=int, default=4, help="Our runner worker processes.")
    parser.add_argument("--concurrency", type=int, default=1, help="Attempts each of our workers runs at once.")
    parser.add_argument(
        "--decode-threads", type=int, help="Threads our policy server decodes with (default: every core)."
    )
    parser.add_argument("--turns", type=int, default=1, help="LLM calls per rollout (above 1: ours only).")
    parser.add_argument(
        "--no-packing",
        action="store_true",
        help="Train each call as a separate sequence instead of packing a conversation's calls into one.",
    )
    parser.add_argument("--no-trl", action="store_true", help="Time ours only.")
    parser.add_argument(
        "--asynchronous",
        action="store_true",
        help="Ours in asynchronous mode: the next batch is sampled (one version stale) while the trainer updates.",
    )
    args = parser.parse_args()
    compare = not args.no_trl and args.turns == 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Both sides do their tensor work on the same one thread (algorithms.tensor_thread explains why).
        model = args.model or tensor_thread.call(build_tool_namer, work / "model")
        print(
            f"model {model.name}, {args.prompts}×{args.group} rollouts of {args.turns} call(s) of ≤{args.max_tokens}"
            f" tokens per step, packing {'off' if args.no_packing else 'on'}"
        )
        mine = aio.run(ours(model, args, work))
        theirs = tensor_thread.call(trl, model, args, work) if compare else None
    middleware = mine["store_proxy_runners"] + mine["adapt"] + mine["publish"]
    print(f"{'':>22} {'s/step':>8} {'mean':>6} {'tokens':>8} {'reward':>7}")
    sides = [("ours", mine), *([("TRL GRPOTrainer", theirs)] if theirs is not None else [])]
    for name, side in sides:
        print(f"{name:>22} {side['step']:8.2f} {side['mean_step']:6.2f} {side['tokens']:8.0f} {side['reward']:7.2f}")
    if theirs is not None:
        print(f"ratio TRL/ours (above 1: ours is faster): {theirs['step'] / mine['step']:.2f} (means: ", end="")
        print(f"{theirs['mean_step'] / mine['mean_step']:.2f})")
    print(
        f"calls per step {mine['calls']:.0f}: trained in {mine['train_sequences']:.0f} sequences,"
        f" {mine['packed_calls']:.0f} packed, {mine['pack_fallback_calls']:.0f} fell back;"
        f" {mine['train_sequence_tokens']:.0f} sequence tokens, {mine['train']:.2f} s training (medians)"
    )
    if args.asynchronous:
        # Decoding the next batch overlaps this step's update, so the parts do not add up to the step.
        parts = ("collect", "adapt", "train", "publish")
        print("our step, median seconds: " + ", ".join(f"{p} {mine[p]:.2f}" for p in parts))
        return
    print("our step, median seconds:")
    for part in ("decode", "train", "store_proxy_runners", "adapt", "publish"):
        print(f"  {part:>20} {mine[part]:7.2f}  {mine[part] / mine['step']:6.1%}")
    print(f"  {'middleware share':>20} {middleware:7.2f}  {middleware / mine['step']:6.1%}")


if __name__ == "__main__":
    main()
