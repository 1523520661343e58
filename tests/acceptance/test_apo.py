"""``store train --algorithm apo`` end to end as a user runs it: a real ``store serve`` (SQLite), real runners and
the store's LLM proxy, and the scripted STAND-IN of ``tests.scripted_optimizer`` as both the agents' model (its
rule model, whose answers depend on the prompt's wording) and the optimizer LLM (answering critiques and rewrites
from a script). The search, the template check, the budgets, the cache, resume after SIGKILL and publishing are
checked through what the store holds, read with the documented SQL views."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from algorithms.local_stack import embedded_store
from lightning_store.client import HttpStore
from lightning_store.resources import LLM, PromptTemplate
from tests import apo_agents as agents
from tests.scripted_optimizer import OPTIMIZER_MODEL, RULE_MODEL, create_app, serve_scripted

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
INVALID = agents.INVALID_REWRITES[0]


@contextlib.contextmanager
def stack(
    tmp_path: Path, app: Any, templates: Mapping[str, str], engine: str = "f-string", agent_llm: LLM | None = None
) -> Iterator[dict[str, Any]]:
    """A store server seeded with ``templates`` and the agents' LLM (default: the stand-in's rule model), and the
    stand-in (the optimizer)."""
    with serve_scripted(app) as llm_url, embedded_store(tmp_path / "store") as store_url:
        resources: dict[str, Any] = {"main_llm": agent_llm or LLM(endpoint=f"{llm_url}/v1", model=RULE_MODEL)}
        for name, text in templates.items():
            resources[name] = PromptTemplate(template=text, engine=engine)
        asyncio.run(_seed(store_url, resources))
        yield {"store": store_url, "llm": f"{llm_url}/v1", "db": tmp_path / "store" / "store.db", "app": app}


async def _seed(url: str, resources: dict[str, Any]) -> None:
    client = HttpStore(url)
    try:
        await client.update_resources("main", resources)
    finally:
        await client.close()


def write_tasks(tmp_path: Path, **splits: Sequence[dict[str, Any]]) -> dict[str, Path]:
    paths = {}
    for split, tasks in splits.items():
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return paths


def train_argv(
    env: dict[str, Any], tmp_path: Path, agent: str, config: dict[str, Any], output: str = "run"
) -> list[str]:
    (tmp_path / "apo.yaml").write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "lightning_store.cli", "train", "--algorithm", "apo", "--agent", agent]
    argv += ["--train", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl")]
    if (tmp_path / "test.jsonl").exists():
        argv += ["--test", str(tmp_path / "test.jsonl")]
    argv += ["--config", str(tmp_path / "apo.yaml"), "--store", env["store"], "--workers", "2"]
    argv += ["--optimizer-url", env["llm"], "--optimizer-model", OPTIMIZER_MODEL, "--output", str(tmp_path / output)]
    return argv


def store_train(
    argv: list[str], timeout: float = 300, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def sql(db: Path, statement: str, *args: Any) -> list[sqlite3.Row]:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        connection.row_factory = sqlite3.Row
        return connection.execute(statement, args).fetchall()


def summary_of(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return next(line for line in lines if line["event"] == "summary")


def latest_template(db: Path, name: str = "prompt_template") -> str:
    row = sql(db, "SELECT resources FROM resources ORDER BY update_time DESC, pk DESC LIMIT 1")[0]
    return str(json.loads(row["resources"])[name]["template"])


def runs(db: Path) -> list[sqlite3.Row]:
    return sql(db, "SELECT * FROM apo_runs_v ORDER BY run_id")


def candidates(db: Path, run_id: str) -> list[sqlite3.Row]:
    return sql(db, "SELECT * FROM prompt_candidates_v WHERE run_id = ? ORDER BY candidate", run_id)


def test_pareto_finds_the_good_rewrite_among_bad_and_invalid_ones_and_publishes_it(tmp_path: Path) -> None:
    """The optimizer proposes a bad, an invalid, a partial and the good rewrite, in that order, then bad ones
    forever: the search must pick the good one by its measured scores (not the last proposal, not by chance),
    publish it as the latest resources, and the store's counts must equal the budget's accounting."""
    script = {
        "prompt_template": [
            agents.BAD_REWRITE,
            INVALID,
            agents.PARTIAL_REWRITE,
            agents.GOOD_REWRITE,
            agents.BAD_REWRITE + " Please.",
        ]
    }
    write_tasks(tmp_path, **{s: agents.classify_tasks(s) for s in ("train", "val", "test")})
    config = {"seed": 3, "max_rollouts": 120, "max_optimizer_calls": 16, "minibatch_size": 3, "test_repeats": 2}
    with stack(tmp_path, create_app(script), {"prompt_template": agents.CLASSIFY_SEED}) as env:
        result = store_train(train_argv(env, tmp_path, "tests.apo_agents:classify", config))
        summary = summary_of(result)
        db = env["db"]
        assert latest_template(db) == agents.GOOD_REWRITE  # the best is what runners get next
        (run,) = runs(db)
        rows = candidates(db, run["run_id"])
    assert run["best_test_score"] == 1.0 and run["best_test_score"] >= run["seed_test_score"] + 0.4
    assert run["rollouts_in_store"] == run["rollouts_spent"] <= 120
    # test_repeats: 2 -- each test task twice for the seed and twice for the best, each a rollout of its own
    assert run["test_rollouts_in_store"] == run["test_rollouts_spent"] == 2 * 2 * len(agents.classify_tasks("test"))
    assert run["optimizer_calls_in_store"] == run["optimizer_calls_spent"] <= 16
    assert run["optimizer_tokens_in_store"] == run["optimizer_tokens_spent"] > 0
    best = next(r for r in rows if r["is_best"] == 1)
    assert json.loads(best["templates"]) == {"prompt_template": agents.GOOD_REWRITE}
    assert best["status"] == "accepted" and best["parent_resources_id"] is not None and best["critique"]
    invalid = [r for r in rows if r["status"] == "invalid"]
    assert invalid and invalid[0]["resources_id"] is None and "drops" in invalid[0]["reason"]
    bad = next(r for r in rows if json.loads(r["templates"])["prompt_template"] == agents.BAD_REWRITE)
    assert bad["status"] == "rejected" and bad["minibatch_score"] < bad["parent_minibatch_score"]
    # No rollout ever ran on the invalid rewrite: every agent rollout is pinned to a published candidate.
    pinned = {r["resources_id"] for r in sql(db, "SELECT DISTINCT resources_id FROM rollouts_v WHERE mode IS NOT NULL")}
    assert pinned <= {r["resources_id"] for r in rows if r["resources_id"]}
    metrics = [r for r in (json.loads(line) for line in result.stdout.splitlines()) if r["event"] == "step"]
    assert metrics[-1]["candidates_invalid"] >= 1 and metrics[-1]["candidates_accepted"] >= 1
    assert summary["val_reward_last"] == 1.0 if "val_reward_last" in summary else True


def test_pareto_reaches_the_best_held_out_score_where_beam_stalls(tmp_path: Path) -> None:
    """Candidates trade tasks (see ``tests.apo_agents.pareto_lineage``): at the same rollout budget, beam search
    keeps the best means and ends on a candidate that is wrong on one category; the Pareto frontier keeps the
    seed, the only one right on that category, rewrites it again and reaches the full score."""
    seed, lineage = agents.pareto_lineage(branch_factor=1)
    write_tasks(tmp_path, **{s: agents.pareto_tasks(s) for s in ("train", "val", "test")})
    scores = {}
    for search in ("beam", "pareto"):
        base = tmp_path / search
        base.mkdir()
        write_tasks(base, **{s: agents.pareto_tasks(s) for s in ("train", "val", "test")})
        config = {
            "search": search,
            "seed": 0,
            "max_rollouts": 150,
            "max_optimizer_calls": 24,
            "beam_width": 1,
            "branch_factor": 1,
            "beam_rounds": 4,
            "gradient_batch_size": 3,
            "val_batch_size": 13,
        }
        with stack(base, create_app(lineage=lineage, exhausted="echo"), {"prompt_template": seed}) as env:
            summary_of(store_train(train_argv(env, base, "tests.apo_agents:classify", config)))
            (run,) = runs(env["db"])
            assert run["rollouts_in_store"] == run["rollouts_spent"] <= 150
            scores[search] = run["best_test_score"]
    assert scores["pareto"] == 1.0
    assert scores["beam"] < 1.0


def test_two_templates_are_optimized_together(tmp_path: Path) -> None:
    """A planner's and a checker's template in one run: the answer is right only when both are rewritten."""
    script = {"checker": [agents.CHECKER_GOOD], "planner": [agents.PLANNER_GOOD]}
    write_tasks(tmp_path, **{s: agents.plan_tasks(s) for s in ("train", "val", "test")})
    config = {
        "seed": 1,
        "max_rollouts": 200,
        "max_optimizer_calls": 20,
        "minibatch_size": 4,
        "templates": ["checker", "planner"],
    }
    seeds = {"planner": agents.PLANNER_SEED, "checker": agents.CHECKER_SEED}
    with stack(tmp_path, create_app(script, exhausted="echo"), seeds) as env:
        summary_of(store_train(train_argv(env, tmp_path, "tests.apo_agents:plan_and_check", config)))
        db = env["db"]
        (run,) = runs(db)
        assert latest_template(db, "planner") == agents.PLANNER_GOOD
        assert latest_template(db, "checker") == agents.CHECKER_GOOD
        rewritten = {r["template_name"] for r in candidates(db, run["run_id"]) if r["status"] == "accepted"}
    assert rewritten == {"planner", "checker"}
    assert run["best_test_score"] == 1.0 and run["seed_test_score"] == 0.0


def test_a_jinja_template_stays_jinja_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    script = {"prompt_template": [agents.INVALID_REWRITE_JINJA, agents.GOOD_REWRITE_JINJA]}
    write_tasks(tmp_path, **{s: agents.classify_tasks(s) for s in ("train", "val")})
    config = {"seed": 0, "max_rollouts": 80, "max_optimizer_calls": 4, "minibatch_size": 3}
    with stack(
        tmp_path, create_app(script, exhausted="echo"), {"prompt_template": agents.CLASSIFY_SEED_JINJA}, engine="jinja"
    ) as env:
        summary_of(store_train(train_argv(env, tmp_path, "tests.apo_agents:classify", config)))
        db = env["db"]
        (run,) = runs(db)
        rows = candidates(db, run["run_id"])
        latest = json.loads(sql(db, "SELECT resources FROM resources ORDER BY update_time DESC, pk DESC LIMIT 1")[0][0])
    assert [r["status"] for r in rows] == ["seed", "invalid", "accepted"]
    assert "Jinja syntax error" in rows[1]["reason"]
    assert latest["prompt_template"] == {
        "resource_type": "prompt_template",
        "template": agents.GOOD_REWRITE_JINJA,
        "engine": "jinja",
    }


def test_failed_rollouts_score_zero_and_their_errors_reach_the_optimizer_first(tmp_path: Path) -> None:
    app = create_app({"prompt_template": [agents.GOOD_REWRITE]})
    write_tasks(tmp_path, train=agents.flaky_tasks("train"), val=agents.classify_tasks("val"))
    config = {"seed": 0, "max_rollouts": 60, "max_optimizer_calls": 2, "minibatch_size": 3}
    with stack(tmp_path, app, {"prompt_template": agents.CLASSIFY_SEED}) as env:
        summary_of(store_train(train_argv(env, tmp_path, "tests.apo_agents:flaky_classify", config)))
    critiques = [r for r in app.state.requests if r["messages"][-1]["content"].startswith("# Task: critique")]
    report = critiques[0]["messages"][-1]["content"]
    assert agents.FLAKY_ERROR in report
    first = report.split("### Rollout 1:", 1)[1].splitlines()[0]
    assert "FAILED (score 0" in first


def test_resume_after_sigkill_ends_where_an_uninterrupted_run_ends_and_the_cache_is_free(tmp_path: Path) -> None:
    # A deterministic optimizer: each template has one rewrite (a cursor over several would answer a call that
    # was in flight at the kill, and whose record never landed, differently when it is made again).
    lineage = {
        agents.CLASSIFY_SEED: [agents.PARTIAL_REWRITE],
        agents.PARTIAL_REWRITE: [agents.GOOD_REWRITE],
        agents.GOOD_REWRITE: [agents.BAD_REWRITE],
    }
    config = {"seed": 5, "max_rollouts": 110, "max_optimizer_calls": 12, "minibatch_size": 3, "unresponsive_seconds": 3}
    outcomes = {}
    for name in ("straight", "killed"):
        base = tmp_path / name
        base.mkdir()
        write_tasks(base, **{s: agents.classify_tasks(s) for s in ("train", "val")})
        with stack(base, create_app(lineage=lineage), {"prompt_template": agents.CLASSIFY_SEED}) as env:
            argv = train_argv(env, base, "tests.apo_agents:classify", config)
            if name == "killed":
                _kill_mid_run(argv, env["db"])
            summary_of(store_train(argv))
            (run,) = runs(env["db"])
            rows = candidates(env["db"], run["run_id"])
            # Resources ids differ between the two stores (they hold the stand-in's URL, a port of each), the
            # prompts, the decisions, the scores and the spending do not.
            outcomes[name] = (
                [(r["candidate"], r["status"], r["templates"], r["val_score"], r["rollouts_spent"]) for r in rows],
                {k: run[k] for k in ("best_candidate", "rollouts_spent", "optimizer_calls_spent", "best_val_score")},
            )
            assert run["rollouts_in_store"] == run["rollouts_spent"]
            assert run["optimizer_calls_in_store"] == run["optimizer_calls_spent"]
            if name == "straight":
                # The same command again on the same store, as a new run: what was evaluated is read back.
                before = sql(env["db"], "SELECT count(*) FROM rollouts_v WHERE mode IS NOT NULL")[0][0]
                summary_of(store_train([*argv, "--no-resume"]))
                after = sql(env["db"], "SELECT count(*) FROM rollouts_v WHERE mode IS NOT NULL")[0][0]
                (second,) = [r for r in runs(env["db"]) if r["run_id"] != run["run_id"]]
                # It charges only the pairs it enqueued anew (with the budget the cache saved, it searches further).
                assert second["rollouts_spent"] == second["rollouts_in_store"] == after - before
                assert second["rollouts_spent"] < run["rollouts_spent"] / 4
                # It starts from the latest resources, the first run's best, whose scores it reads back.
                seed_row = candidates(env["db"], second["run_id"])[0]
                assert seed_row["resources_id"] == run["best_resources_id"]
                assert seed_row["val_score"] == run["best_val_score"]

    assert outcomes["killed"] == outcomes["straight"]


def _kill_mid_run(argv: list[str], db: Path) -> None:
    """Start ``store train`` and SIGKILL it once a candidate after the seed is recorded."""
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(sqlite3.OperationalError):
                if sql(db, "SELECT count(*) FROM prompt_candidates_v")[0][0] >= 2:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("no candidate was recorded within 120 s")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    time.sleep(1)  # its runner, told by the kernel, lets go of its attempts


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"templates": ["nope"]}, "templates: no prompt template named 'nope'"),
        ({"max_rollouts": 10}, "max_rollouts: 10 is too small"),
        ({"search": "beam", "max_optimizer_calls": 4}, "max_optimizer_calls: 4 is too small"),
        ({"optimizer": "http://127.0.0.1:9/v1"}, "--optimizer-url: cannot reach"),
        ({"seed_template": "Classify. Answer with one word."}, "templates: 'prompt_template' has no placeholder"),
        ({"critique_prompt_file": "/nonexistent.md"}, "critique_prompt_file"),
    ],
)
def test_bad_configs_fail_at_start_naming_the_field_before_any_rollout(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    change = dict(change)
    seed = change.pop("seed_template", agents.CLASSIFY_SEED)
    optimizer = change.pop("optimizer", None)
    write_tasks(tmp_path, **{s: agents.classify_tasks(s) for s in ("train", "val")})
    with stack(tmp_path, create_app({}), {"prompt_template": seed}) as env:
        argv = train_argv(env, tmp_path, "tests.apo_agents:classify", {"max_rollouts": 100, **change})
        if optimizer:
            argv[argv.index("--optimizer-url") + 1] = optimizer
        result = store_train(argv, timeout=120)
        agent_rollouts = sql(env["db"], "SELECT count(*) FROM rollouts_v WHERE mode IS NOT NULL")[0][0]
    assert result.returncode == 2, result.stderr[-2000:]
    assert field in result.stderr
    assert "Traceback" not in result.stderr
    assert agent_rollouts == 0
