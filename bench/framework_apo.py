"""Prompt optimization, measured, on the three framework agents of ``examples/`` (LangGraph SQL, Agents SDK
retrieval, AutoGen calculator): ``store train --algorithm apo`` with the example's own ``apo.yaml`` (the prompt the
framework owns, bound with ``runners.prompt``), SmolLM2-135M-Instruct as the agents' model (``store policy
serve``), on several seeds, with one of two optimizers:

* ``scripted``: the scripted STAND-IN of ``tests.scripted_optimizer`` (no hosted LLM exists offline), which
  proposes the two hand-written rewrites of :data:`PROPOSALS` in turn. It measures the search: whether what
  validation picks among fixed candidates holds on the held-out tasks.
* ``smollm2``: the same SmolLM2 as the optimizer, writing its own critiques and rewrites.

``--seed-prompt`` starts from another prompt than the example's: with a budget of one proposal
(``--max-rollouts 32 --max-optimizer-calls 2``) its held-out score measures how far the prompt alone moves the agent.

Prints, per example, optimizer and seed, the held-out (test split) score of the seed prompt and of the best
candidate, the rollouts and optimizer calls spent, and the wall time; then one JSON line per run.

    pip install torch==2.13.0 -e ".[train,smollm2,examples]"
    python -m bench.framework_apo --examples calc --optimizers scripted smollm2 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from algorithms.local_stack import free_port
from bench.harness import child, report_runs, wait_http
from bench.smollm2 import convert
from lightning_store.resources import LLM
from tests.acceptance.test_apo import runs, stack, store_train, summary_of
from tests.acceptance.test_framework_agents_apo import CASES
from tests.scripted_optimizer import OPTIMIZER_MODEL, create_app

ROOT = Path(__file__).parents[1]
CALC = "You solve arithmetic word problems. Call the calculator with the expression that answers the problem"
EXAMPLES = {"sql": "sql_agent", "rag": "rag_agent", "calc": "calc_agent"}
"""Short name -> example folder, whose entry point, prompt template, seed text and LLM settings are the APO test's
(:data:`tests.acceptance.test_framework_agents_apo.CASES`)."""
PROPOSALS: dict[str, list[str]] = {
    "sql": [
        "You are a SQLite expert. Write one SQLite query for the question, using only the tables and columns of the "
        "schema below. Reply with the query only, no explanation.\n\n{schema}",
        "Given the schema below, answer the question with one SELECT statement. Use COUNT(*) for 'how many' and "
        "WHERE for conditions. Reply with the SQL only.\n\n{schema}",
    ],
    "rag": [
        "You answer questions about people, companies, cities and countries with the search tool's documents only. "
        "Search for the name the question asks about, then reply with the answer alone: one name, one place or one "
        "year, never a sentence.",
        "Search the knowledge base for the person, company, city or country the question names. The documents "
        "answer the question; reply with only the words that answer it, at most three.",
    ],
    "calc": [
        f"{CALC}: subtract for 'left' or 'fewer', divide for 'each' or 'shared equally', add for 'in all' or "
        "'both', multiply for groups of a size. Use the problem's numbers, for example 37 * 486.",
        f"{CALC}, once: the problem's two numbers and one operator (+, -, *, /), for example 37 * 486.",
    ],
}


def one(name: str, optimizer: str, seed: int, args: argparse.Namespace, policy: str, model: str, work: Path) -> Any:
    """One APO run; its outcome row (``apo_runs_v``) with the wall time."""
    folder = EXAMPLES[name]
    agent, template, seed_text, settings = CASES[folder]
    seed_text = args.seed_prompt if args.seed_prompt is not None else seed_text
    run = work / f"{name}-{optimizer}-seed{seed}"
    run.mkdir(parents=True)
    sizes = {"train": None, "val": args.val_tasks, "test": args.test_tasks}
    for split, size in sizes.items():
        lines = (ROOT / "examples" / folder / f"{split}.jsonl").read_text().splitlines()[:size]
        (run / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    config = yaml.safe_load((ROOT / "examples" / folder / "apo.yaml").read_text())
    config |= {"seed": seed, "max_rollouts": args.max_rollouts, "max_optimizer_calls": args.max_optimizer_calls}
    config |= {"test_repeats": args.test_repeats}
    (run / "apo.yaml").write_text(yaml.safe_dump(config))
    llm = LLM(endpoint=policy, model=model, max_tokens_cap=48, **settings)
    app = create_app({template: PROPOSALS[name]}, exhausted="echo")
    with stack(run, app, {template: seed_text}, agent_llm=llm) as env:
        optimizer_url, optimizer_model = (env["llm"], OPTIMIZER_MODEL) if optimizer == "scripted" else (policy, model)
        argv = [sys.executable, "-m", "lightning_store.cli", "train", "--algorithm", "apo", "--agent", agent]
        for split in sizes:
            argv += [f"--{split}", str(run / f"{split}.jsonl")]
        argv += ["--config", str(run / "apo.yaml"), "--store", env["store"], "--workers", str(args.workers)]
        argv += ["--optimizer-url", optimizer_url, "--optimizer-model", optimizer_model, "--output", str(run / "out")]
        started = time.perf_counter()
        summary_of(store_train(argv, timeout=7200, cwd=ROOT))
        wall = time.perf_counter() - started
        (outcome,) = runs(env["db"])
    keep = ("seed_val_score", "best_val_score", "seed_test_score", "best_test_score", "best_candidate")
    spent = ("rollouts_spent", "test_rollouts_spent", "optimizer_calls_spent", "optimizer_tokens_spent")
    row = {key: outcome[key] for key in (*keep, *spent)}
    return {"example": name, "optimizer": optimizer, "seed": seed, "wall_seconds": round(wall, 1), **row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", choices=sorted(EXAMPLES), default=["sql", "rag", "calc"])
    parser.add_argument("--optimizers", nargs="+", choices=["scripted", "smollm2"], default=["scripted", "smollm2"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--val-tasks", type=int, default=12, help="validation tasks the search scores on")
    parser.add_argument("--test-tasks", type=int, default=30, help="held-out tasks scored after the search")
    parser.add_argument("--test-repeats", type=int, default=2, help="rollouts per held-out task (APO's test_repeats)")
    parser.add_argument("--max-rollouts", type=int, default=60)
    parser.add_argument("--max-optimizer-calls", type=int, default=6)
    parser.add_argument(
        "--seed-prompt",
        default=None,
        help="start from this prompt instead of the example's (an ablation: how far the prompt moves the agent)",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--output", type=Path, default=None, help="where the runs are kept (default: a temp dir)")
    args = parser.parse_args()
    work = args.output or Path(tempfile.mkdtemp(prefix="framework-apo-"))
    model = convert(work / "smollm2-135m")
    port = free_port()
    results = []
    with child(["store", "policy", "serve", str(model), "--port", str(port)], work / "policy.log") as server:
        wait_http(f"http://127.0.0.1:{port}/v1/models", server, work / "policy.log", timeout=300)
        policy = f"http://127.0.0.1:{port}/v1"
        header = ("example", "optimizer", "seed", "test: seed", "best", "rollouts", "wall (s)")
        print("{:8} {:9} {:>4} {:>10} {:>6} {:>8} {:>8}".format(*header))
        for name in args.examples:
            for optimizer in args.optimizers:
                for seed in args.seeds:
                    result = one(name, optimizer, seed, args, policy, model.name, work)
                    results.append(result)
                    print(
                        f"{name:8} {optimizer:9} {seed:>4} {result['seed_test_score']:>10.3f} "
                        f"{result['best_test_score']:>6.3f} {result['rollouts_spent']:>8} "
                        f"{result['wall_seconds']:>8.0f}",
                        flush=True,
                    )
    report_runs(results, work)


if __name__ == "__main__":
    main()
