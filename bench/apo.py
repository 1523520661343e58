"""``pareto`` against ``beam`` at equal rollout budgets: held-out test score and the rollouts spent to reach it.

Both searches run as a user runs them (``store train --algorithm apo``), on a real ``store serve`` (SQLite) with
real runners and the LLM proxy, against the scripted STAND-IN of ``tests.scripted_optimizer`` as the agents'
model and the optimizer (there is no hosted LLM offline). The task is the one built so that candidates trade
tasks (``tests.apo_agents.pareto_lineage``): beam search keeps the top means, the Pareto frontier keeps per-task
winners. For each search and seed it prints the best candidate's held-out test score and ``rollouts_to_best``,
the run's rollouts spent when its final best candidate was recorded (``prompt_candidates_v``).

    python -m bench.apo --seeds 5 --max-rollouts 150

Results with the machine are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests import apo_agents as agents
from tests.acceptance.test_apo import candidates, runs, stack, store_train, summary_of, train_argv, write_tasks
from tests.scripted_optimizer import create_app


def one(search: str, seed: int, max_rollouts: int, branch_factor: int, work: Path) -> dict[str, Any]:
    base = work / f"{search}-{seed}"
    base.mkdir(parents=True)
    start, lineage = agents.pareto_lineage(branch_factor=branch_factor)
    write_tasks(base, **{s: agents.pareto_tasks(s) for s in ("train", "val", "test")})
    config = {
        "search": search,
        "seed": seed,
        "max_rollouts": max_rollouts,
        "max_optimizer_calls": 200,
        "beam_width": branch_factor,
        "branch_factor": branch_factor,
        "beam_rounds": 50,
        "gradient_batch_size": 3,
        "val_batch_size": 13,
    }
    began = time.monotonic()
    with stack(base, create_app(lineage=lineage, exhausted="echo"), {"prompt_template": start}) as env:
        summary_of(store_train(train_argv(env, base, "tests.apo_agents:classify", config), timeout=1800))
        (run,) = runs(env["db"])
        rows = candidates(env["db"], run["run_id"])
        best = next(r for r in rows if r["is_best"] == 1)
        scored = [(r["val_score"], r["rollouts_spent"]) for r in rows if r["val_score"] is not None]
    return {
        "search": search,
        "seed": seed,
        "test": run["best_test_score"],
        "val": run["best_val_score"],
        "rollouts": run["rollouts_spent"],
        "rollouts_to_best": best["rollouts_spent"],
        "scored": scored,
        "seconds": round(time.monotonic() - began, 1),
    }


def rollouts_to(row: dict[str, Any], val: float) -> int | None:
    """The rollouts the run had spent when it first held a candidate scoring ``val`` on validation."""
    reached = [spent for score, spent in row["scored"] if score >= val]
    return min(reached) if reached else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-rollouts", type=int, default=150)
    parser.add_argument("--branch-factor", type=int, default=1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seeds):
            for search in ("beam", "pareto"):
                rows.append(one(search, seed, args.max_rollouts, args.branch_factor, Path(folder)))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "scored"}), flush=True)
    by = {s: [r for r in rows if r["search"] == s] for s in ("beam", "pareto")}
    wins = sum(p["test"] >= b["test"] for p, b in zip(by["pareto"], by["beam"], strict=True))
    print(f"pareto >= beam on {wins}/{args.seeds} seeds")
    for search, found in by.items():
        print(
            f"{search}: test {statistics.mean(r['test'] for r in found):.3f} mean, "
            f"rollouts to its best {statistics.mean(r['rollouts_to_best'] for r in found):.1f} mean"
        )
    ratios = []
    for pareto, beam in zip(by["pareto"], by["beam"], strict=True):
        mine = rollouts_to(pareto, beam["val"])
        if mine is not None:
            ratios.append(mine / max(beam["rollouts_to_best"], 1))
    if ratios:
        print(
            f"pareto reached beam's best validation score on {len(ratios)}/{args.seeds} seeds, with "
            f"{statistics.mean(ratios):.2f}x beam's rollouts on average"
        )


if __name__ == "__main__":
    main()
