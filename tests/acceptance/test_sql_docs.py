"""The SQL the docs show works on a store that a real training run filled.

Every example of docs/reference/sql.md and docs/reference/metrics.md (each statement of a ```sql block) and the
query of every ``store sql "…"`` command of the tutorial runs against the store of a short ``store train`` and
returns rows; on Postgres, with the same rows copied over, it returns the same rows. The tutorial's commands also
run as written, through ``store sql``. The run: a tiny model built here, GRPO for one step with a validation task
and a task the agent fails on, then ``store train`` again on the same output with one step more (a resume, which
writes its starting step a second time). Facts the views promise are checked against what ``store train`` printed
and against each other.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from examples.flight.model import TRAIN_TASKS, VAL_TASKS, build_tool_namer
from lightning_store.sql.engine import make_engine
from lightning_store.sql.schema import metadata
from tests.acceptance.test_train_cli import store_train
from tests.export_store import read_jsonl, run_export
from tests.postgres import TemplateDatabases

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).parents[2]
DOCS = ("docs/reference/sql.md", "docs/reference/metrics.md", "docs/tutorial.md")
BROKEN_TASK = {"task_id": "broken", "steps": 1}
"""A validation task without a question: the agent raises KeyError on it, so the store holds failures."""
ERROR = "KeyError: 'question'"

Rows = list[tuple[Any, ...]]


def sql_examples(markdown: str) -> list[str]:
    """The examples of a page: each statement of a ```sql block (``--`` comment lines dropped) and the query of
    each ``store sql "…"`` command of a ```bash block (its shell escapes undone)."""
    found = []
    for block in re.findall(r"```sql\n(.*?)```", markdown, flags=re.DOTALL):
        for statement in block.split(";"):
            lines = [line for line in statement.splitlines() if not line.lstrip().startswith("--")]
            if "".join(lines).strip():
                found.append("\n".join(lines).strip())
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.DOTALL):
        for query in re.findall(r'\bstore sql "((?:[^"\\]|\\.)*)"', block.replace("\\\n", " ")):
            found.append(re.sub(r"\\(.)", r"\1", query))
    return found


EXAMPLES = {doc: sql_examples((ROOT / doc).read_text()) for doc in DOCS}
EXAMPLE_PARAMS = [
    pytest.param(sql, id=f"{Path(doc).stem}-{number}")
    for doc, examples in EXAMPLES.items()
    for number, sql in enumerate(examples, start=1)
]


@dataclass
class Trained:
    """The store of the training run (SQLite), what each ``store train`` printed per step, and the same rows
    copied into a Postgres database (None when no server answers)."""

    output: Path
    printed: list[dict[int, dict[str, float]]]
    postgres_url: str | None

    @property
    def sqlite_url(self) -> str:
        return f"sqlite+aiosqlite:///{self.output / 'store.db'}"

    def query(self, sql: str, postgres: bool = False) -> tuple[list[str], Rows]:
        url = self.postgres_url if postgres else self.sqlite_url
        assert url is not None
        return asyncio.run(_query(url, sql))

    def rows(self, sql: str) -> list[dict[str, Any]]:
        columns, rows = self.query(sql)
        return [dict(zip(columns, row, strict=True)) for row in rows]


async def _query(url: str, sql: str) -> tuple[list[str], Rows]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(sa.text(sql))
            return list(result.keys()), [tuple(row) for row in result.all()]
    finally:
        await engine.dispose()


async def _copy(source_url: str, target_url: str) -> None:
    """Every row of every table, in foreign-key order (the target is migrated and empty)."""
    source, target = make_engine(source_url), make_engine(target_url)
    try:
        async with source.connect() as read, target.begin() as write:
            for table in metadata.sorted_tables:
                rows = [dict(row) for row in (await read.execute(sa.select(table))).mappings()]
                if rows:
                    await write.execute(sa.insert(table), rows)
    finally:
        await source.dispose()
        await target.dispose()


def printed_steps(result: subprocess.CompletedProcess[str]) -> dict[int, dict[str, float]]:
    """The step lines ``store train`` printed (stdout or stderr, wherever the display puts them), by step."""
    steps = {}
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "step":
            steps[int(record["step"])] = {k: v for k, v in record.items() if k not in ("event", "step")}
    return steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, pg_templates: TemplateDatabases | None) -> Iterator[Trained]:
    tmp = tmp_path_factory.mktemp("sql-docs")
    build_tool_namer(tmp / "model", steps=1)  # what it answers does not matter here, only that it answers
    (tmp / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN_TASKS[:2]))
    (tmp / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n" + json.dumps(BROKEN_TASK) + "\n")
    (tmp / "grpo.yaml").write_text("tasks_per_step: 2\ngroup_size: 2\neval_repeats: 2\nlearning_rate: 1.0e-4\n")
    printed = []
    for steps in (1, 2):  # the second resumes from the step-1 checkpoint
        result = store_train(tmp, steps)
        assert result.returncode == 0, result.stderr[-3000:]
        printed.append(printed_steps(result))
    output = tmp / "run"
    if pg_templates is None:
        yield Trained(output, printed, None)
        return
    url = asyncio.run(pg_templates.clone())
    asyncio.run(_copy(f"sqlite+aiosqlite:///{output / 'store.db'}", url))
    yield Trained(output, printed, url)
    asyncio.run(pg_templates.drop(url))


def comparable(rows: Rows) -> list[str]:
    """Rows as both backends must agree on them, in a stable order: JSON text read, numbers to 12 digits."""

    def value(v: Any) -> Any:
        if isinstance(v, str) and v[:1] in "{[":
            v = json.loads(v)
        if isinstance(v, dict):
            return {k: value(item) for k, item in v.items()}
        if isinstance(v, list):
            return [value(item) for item in v]
        if isinstance(v, Decimal | float) and not isinstance(v, bool):
            return float(f"{float(v):.12g}")
        return v

    return sorted(json.dumps([value(v) for v in row], sort_keys=True) for row in rows)


def test_the_docs_hold_examples() -> None:
    # A page whose examples the extraction no longer finds (a new fence, say) would pass every test below.
    sql, metrics, tutorial = (len(EXAMPLES[doc]) for doc in DOCS)
    assert sql >= 12 and metrics >= 1 and tutorial == 2, EXAMPLES


@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_every_example_returns_rows(trained: Trained, example: str) -> None:
    columns, rows = trained.query(example)
    assert rows, f"no rows from\n{example}"
    assert len(set(columns)) == len(columns), columns


@pytest.mark.postgres
@pytest.mark.parametrize("example", EXAMPLE_PARAMS)
def test_every_example_returns_the_same_rows_on_postgres(trained: Trained, example: str) -> None:
    if trained.postgres_url is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    on_sqlite = trained.query(example)
    on_postgres = trained.query(example, postgres=True)
    assert on_postgres[0] == on_sqlite[0]
    assert comparable(on_postgres[1]) == comparable(on_sqlite[1])


def test_the_tutorial_commands_run_as_written(trained: Trained) -> None:
    # The tutorial's commands name the store by its relative path, runs/flight/store.db.
    link = trained.output.parent / "runs" / "flight"
    if not link.exists():
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(trained.output)
    commands = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "tutorial.md").read_text(), flags=re.DOTALL)
        for line in block.replace("\\\n", " ").splitlines()
        if " store sql " in line
    ]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command], cwd=trained.output.parent, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0 and "no rows" not in result.stdout, f"{command}\n{result.stdout}{result.stderr}"
        outputs.append(result.stdout)
    assert len(outputs) == 2 and "val_reward" in outputs[0] and "train" in outputs[1]


def test_training_steps_v_has_one_row_per_step_after_the_resume(trained: Trained) -> None:
    with sqlite3.connect(trained.output / "store.db") as db:
        written = db.execute(
            "SELECT json_extract(attributes, '$.step') FROM spans WHERE name = 'lightning_store.train.step'"
            " ORDER BY start_time"
        ).fetchall()
    assert [step for (step,) in written] == [0, 1, 1, 2]  # the resumed run writes step 1 again

    first, resumed = trained.printed
    assert sorted(first) == [0, 1] and sorted(resumed) == [1, 2]
    rows = trained.rows("SELECT * FROM training_steps_v ORDER BY step")
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert len({row["run_id"] for row in rows}) == 1
    assert {row["algorithm"] for row in rows} == {"grpo"}
    step0, step1, step2 = rows
    assert step0["training_rollout_id"] == step0["run_id"] != step1["training_rollout_id"]
    assert step1["training_rollout_id"] == step2["training_rollout_id"]

    # Step 1 keeps the first run's training metrics and takes the resumed run's evaluation of it.
    assert step0["val_reward"] == first[0]["val_reward"] and step0["reward_mean"] is None
    assert step1["reward_mean"] == first[1]["reward_mean"]
    assert step1["resources_version"] == first[1]["version"]
    assert step1["val_reward"] == resumed[1]["val_reward"]
    assert step2["reward_mean"] == resumed[2]["reward_mean"]
    assert step2["val_reward"] == resumed[2]["val_reward"]
    assert step2["resources_version"] == resumed[2]["version"]
    # The metrics JSON: the printed names and the very same numbers.
    metrics = json.loads(step2["metrics"])
    assert metrics.items() <= resumed[2].items()
    assert {"reward_mean", "val_reward", "version", "rollouts", "step_seconds"} <= metrics.keys()


def test_reward_per_step_is_the_mean_reward_of_the_rollouts_it_trained_on(trained: Trained) -> None:
    trained_steps = trained.rows(
        "SELECT step, reward_mean, resources_version, metrics FROM training_steps_v WHERE reward_mean IS NOT NULL"
    )
    assert [row["step"] for row in sorted(trained_steps, key=lambda r: r["step"])] == [1, 2]
    for row in trained_steps:
        (behind,) = trained.rows(
            "SELECT count(*) AS rewards, avg(reward) AS reward, min(resources_version) AS low,"
            f" max(resources_version) AS high FROM rewards_v WHERE mode = 'train' AND step = {row['step'] - 1}"
        )
        assert behind["rewards"] == 4  # tasks_per_step × group_size
        assert math.isclose(behind["reward"], row["reward_mean"])
        # The batch ran on the version before the one the step's update published; a step that trained nothing
        # (every group's rewards equal, which a step of this short run may draw) published none.
        untrained = json.loads(row["metrics"]).get("untrained") == 1
        assert behind["low"] == behind["high"] == row["resources_version"] - (0 if untrained else 1)


def test_val_reward_is_the_newest_evaluation_with_failures_counted_zero(trained: Trained) -> None:
    evaluated = trained.rows("SELECT step, val_reward, val_rollouts FROM training_steps_v WHERE val_reward IS NOT NULL")
    assert sorted(row["step"] for row in evaluated) == [0, 1, 2]
    for row in evaluated:
        assert row["val_rollouts"] == 4  # (one task + the broken one) × eval_repeats
        versions = trained.rows(
            "SELECT resources_version, sum(reward) AS total FROM rewards_v WHERE mode = 'val'"
            f" AND step = {row['step']} GROUP BY resources_version ORDER BY resources_version"
        )
        assert len(versions) == (2 if row["step"] == 1 else 1)  # step 1 was evaluated by both runs
        assert math.isclose(versions[-1]["total"] / row["val_rollouts"], row["val_reward"])


def test_failures_carry_their_error_message(trained: Trained) -> None:
    failed = trained.rows(
        "SELECT r.task_id, r.mode, r.num_attempts, r.resources_version, s.status_message FROM rollouts_v r"
        " JOIN spans_v s ON s.attempt_id = r.latest_attempt_id AND s.status_code = 'ERROR' WHERE r.status = 'failed'"
    )
    # Four evaluations (steps 0 and 1, then 1 again and 2) ran the broken task twice each; every such rollout
    # failed twice (max_attempts 2), and its latest attempt recorded the exception.
    assert len(failed) == 8
    assert all(
        row
        == {"task_id": "broken", "mode": "val", "num_attempts": 2, "resources_version": None, "status_message": ERROR}
        for row in failed
    ), failed


def test_every_rollout_store_train_enqueued_names_its_run_and_store_export_finds_them(
    trained: Trained, tmp_path: Path
) -> None:
    steps = trained.rows("SELECT DISTINCT run_id, training_rollout_id FROM training_steps_v")
    (run_id,) = {row["run_id"] for row in steps}
    training = {row["training_rollout_id"] for row in steps}
    assert run_id in training and len(training) == 2  # the first `store train` and the one that resumed it
    rollouts = trained.rows("SELECT rollout_id, mode, metadata FROM rollouts_v")
    enqueued = [json.loads(row["metadata"]) for row in rollouts if row["mode"] is not None]
    assert len(enqueued) == len(rollouts) - 2
    # metadata.training_run_id: the training-run rollout of the `store train` that enqueued it (docs/reference/sql.md).
    assert {meta["training_run_id"] for meta in enqueued} == training

    result = run_export(trained.sqlite_url, tmp_path / "out", "--run", run_id, "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    exported = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    assert {row["rollout_id"] for row in exported} == {row["rollout_id"] for row in rollouts}  # all of this run's
    assert len(read_jsonl(tmp_path / "out" / "training_steps.jsonl")) == 3
