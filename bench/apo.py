"""``pareto`` against ``beam`` at equal rollout budgets: held-out test score and the rollouts spent to reach it.

Both searches run as a user runs them (``store train --algorithm apo``), on a real ``store serve`` (SQLite) with
real runners and the LLM proxy, against the scripted STAND-IN of ``tests.scripted_optimizer`` as the agents'
model and the optimizer (there is no hosted LLM offline). The task is the one built so that candidates trade
tasks (``tests.apo_agents.pareto_lineage``): beam search keeps the top means, the Pareto frontier keeps per-task
winners. Where the ``gepa`` package is installed, the same task and the same scripted rewrites also run through
its own loop (``gepa.optimize`` with a custom proposer and an adapter over the stand-in's rules). For each search
and seed it prints the best candidate's held-out test score and ``rollouts_to_best``,
the run's rollouts spent when its final best candidate was recorded (``prompt_candidates_v``).

    python -m bench.apo --seeds 5 --max-rollouts 150

Results with the machine are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib
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


def gepa_one(seed: int, max_rollouts: int, branch_factor: int) -> dict[str, Any] | None:
    """The same task and the same scripted rewrites through the ``gepa`` package's own loop (its Pareto selection,
    minibatch acceptance and budget in metric calls = rollouts), evaluating with the stand-in's rules in process.
    None when ``gepa`` is not installed."""
    try:  # optional, and untyped here: the project does not depend on it
        gepa: Any = importlib.import_module("gepa")
        evaluation_batch: Any = importlib.import_module("gepa.core.adapter").EvaluationBatch
    except ImportError:
        return None
    from lightning_store.resources import PromptTemplate
    from tests.scripted_optimizer import rule_answer

    start, lineage = agents.pareto_lineage(branch_factor=branch_factor)
    cursors: dict[str, int] = {}

    def run_task(text: str, task: dict[str, Any]) -> tuple[float, str, str]:
        answer = rule_answer(agents.render(PromptTemplate(template=text, engine="f-string"), task))
        value, feedback = agents.score(task, answer)
        return value, answer, feedback

    class RuleAdapter:
        propose_new_texts = None

        def evaluate(self, batch: list[Any], candidate: dict[str, str], capture_traces: bool = False) -> Any:
            results = [run_task(candidate["prompt_template"], task) for task in batch]
            traces = [{"task": t, "answer": a, "feedback": f} for t, (_, a, f) in zip(batch, results, strict=True)]
            return evaluation_batch(
                outputs=[a for _, a, _ in results],
                scores=[v for v, _, _ in results],
                trajectories=traces if capture_traces else None,
            )

        def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components: list[str]) -> Any:
            rows = [
                {"Inputs": t["task"]["text"], "Generated Outputs": t["answer"], "Feedback": t["feedback"]}
                for t in eval_batch.trajectories or []
            ]
            return {name: rows for name in components}

    def propose(candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        parent = candidate["prompt_template"]
        children = lineage.get(parent, [])
        at = cursors.get(parent, 0)
        cursors[parent] = at + 1
        return {"prompt_template": str(children[at]) if at < len(children) else parent}

    result = gepa.optimize(
        seed_candidate={"prompt_template": start},
        trainset=agents.pareto_tasks("train"),
        valset=agents.pareto_tasks("val"),
        adapter=RuleAdapter(),
        custom_candidate_proposer=propose,
        reflection_minibatch_size=3,
        max_metric_calls=max_rollouts,
        seed=seed,
    )
    best = result.best_candidate
    assert isinstance(best, dict)
    test = agents.pareto_tasks("test")
    score = sum(run_task(best["prompt_template"], t)[0] for t in test) / len(test)
    counts = result.discovery_eval_counts
    return {
        "search": "gepa",
        "seed": seed,
        "test": score,
        "val": result.val_aggregate_scores[result.best_idx],
        "rollouts": result.total_metric_calls,
        # GEPA records the metric calls spent before a candidate's validation; ours, after it: add the validation.
        "rollouts_to_best": counts[result.best_idx] + len(agents.pareto_tasks("val")) if counts else None,
        "scored": [],
    }


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
            gepa_row = gepa_one(seed, args.max_rollouts, args.branch_factor)
            if gepa_row is not None:
                rows.append(gepa_row)
                print(json.dumps({k: v for k, v in gepa_row.items() if k != "scored"}), flush=True)
    by = {s: [r for r in rows if r["search"] == s] for s in ("beam", "pareto")}
    for r in (r for r in rows if r["search"] == "gepa"):
        print(f"gepa seed {r['seed']}: test {r['test']:.3f}, metric calls to its best {r['rollouts_to_best']}")
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
