"""Learning, measured, on the three framework agents of ``examples/`` (LangGraph SQL, Agents SDK retrieval, AutoGen
calculator): GRPO with LoRA on SmolLM2-135M-Instruct, through ``store train`` exactly as a user runs it, on several
seeds. Prints, per example and seed, the held-out reward (the example's validation tasks, which training never
draws) before the first step and after the last, and the wall time; then one JSON line per run.

    pip install torch==2.13.0 -e ".[train,lora,smollm2,examples]"
    python -m bench.framework_agents --examples calc --seeds 0 1 2 --steps 12
    python -m bench.framework_agents                  # all three, seeds 0-2, 12 steps each (hours on a laptop CPU)
    python -m bench.framework_agents --examples rag --set learning_rate=1e-3   # an option laid over grpo.yaml

Each run is ``store train --algorithm grpo --config examples/NAME/grpo.yaml`` with the seed and the evaluation
options set here (and ``--set``'s, passed on to ``store train``), in a directory of its own under ``--output``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness import report_runs
from bench.smollm2 import convert

ROOT = Path(__file__).parents[1]
EXAMPLES = {
    "sql": ("examples/sql_agent", "examples.sql_agent.agent:sql_agent"),
    "rag": ("examples/rag_agent", "examples.rag_agent.agent:rag_agent"),
    "calc": ("examples/calc_agent", "examples.calc_agent.agent:calc_agent"),
}


def train(name: str, seed: int, args: argparse.Namespace, model: Path, work: Path) -> dict[str, Any]:
    """One ``store train`` run; its summary line with the wall time."""
    folder, agent = EXAMPLES[name]
    run = work / f"{name}-seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / folder / "grpo.yaml").read_text())
    config |= {"seed": seed, "eval_repeats": args.eval_repeats}
    (run / "grpo.yaml").write_text(yaml.safe_dump(config))
    val = (ROOT / folder / "val.jsonl").read_text().splitlines()[: args.val_tasks]
    (run / "val.jsonl").write_text("\n".join(val) + "\n")
    command = [
        *("store", "train", "--algorithm", "grpo", "--agent", agent),
        *("--train", str(ROOT / folder / "train.jsonl"), "--val", str(run / "val.jsonl")),
        *("--model", str(model), "--config", str(run / "grpo.yaml"), "--steps", str(args.steps)),
        *("--output", str(run / "out"), "--no-resume", "--workers", str(args.workers)),
        *(part for option in args.set for part in ("--set", option)),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    (run / "train.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{name} seed {seed} failed (exit {done.returncode}); see {run / 'train.log'}")
    summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    return {"example": name, "seed": seed, "wall_seconds": round(wall, 1), **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", choices=sorted(EXAMPLES), default=["sql", "rag", "calc"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--val-tasks", type=int, default=16, help="held-out tasks scored before and after")
    parser.add_argument("--eval-repeats", type=int, default=2, help="rollouts per held-out task per evaluation")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a GRPO option over grpo.yaml")
    parser.add_argument("--output", type=Path, default=None, help="where the runs are kept (default: a temp dir)")
    args = parser.parse_args()
    work = args.output or Path(tempfile.mkdtemp(prefix="framework-agents-"))
    model = convert(work / "smollm2-135m")
    results = []
    print(f"{'example':8} {'seed':>4} {'val before':>10} {'val after':>9} {'untrained':>9} {'wall (s)':>9}")
    for name in args.examples:
        for seed in args.seeds:
            result = train(name, seed, args, model, work)
            results.append(result)
            val = result["val_reward"]
            print(
                f"{name:8} {seed:>4} {val['first']:>10.3f} {val['last']:>9.3f} "
                f"{result.get('untrained_steps', 0):>9} {result['wall_seconds']:>9.0f}",
                flush=True,
            )
    report_runs(results, work)


if __name__ == "__main__":
    main()
