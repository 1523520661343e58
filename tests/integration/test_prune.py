"""``store prune`` as a user runs it: a real subprocess against a store filled through the store contract, on SQLite
and on Postgres, and what remains checked row by row; its selection racing the store's writers (in process); and a
prune beside a real ``store serve`` subprocess that keeps answering. The rules: docs/reference/prune.md.

The commands run as ``python -c "from lightning_store.cli import app; app()"`` (the ``store`` command group without
the entry-point plugins, whose imports cost seconds a start), as the enqueue tests run them.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from lightning_store.cli import app
from lightning_store.llm_calls import LlmCall
from lightning_store.migrate import head_revision
from lightning_store.models import RolloutMode, RolloutStatus
from lightning_store.spans import Span
from lightning_store.sql import SqlStore, open_store
from lightning_store.sql.prune_rules import Rules, Summary
from lightning_store.sql.pruner import Pruner
from tests.acceptance.test_serve import Server, clean_env, wait_healthy

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
FAST = [sys.executable, "-c", "from lightning_store.cli import app; app(prog_name='store')"]
DAY = 86400.0
TABLES = ("rollouts", "attempts", "spans", "llm_calls", "resources", "workers")
VIEWS = ("rollouts_v", "attempts_v", "llm_calls_v", "rewards_v", "training_steps_v")
"""The views that read something ``--what spans`` keeps (all but spans_v); each has a column that orders it."""

Rows = dict[str, set[tuple[Any, ...]]]


async def store_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**clean_env(), "COLUMNS": "200"}  # COLUMNS: rich must not wrap the lines
    argv = [*FAST, *args]
    return await asyncio.to_thread(
        subprocess.run, argv, env=environment, cwd=cwd, capture_output=True, text=True, timeout=120, stdin=None
    )


async def prune(url: str, *args: str, cwd: Path) -> dict[str, Any]:
    """``store prune ARGS --json`` on ``url``; its summary (the command must succeed)."""
    result = await store_cli("prune", *args, "--json", "--database-url", url, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def counts(summary: dict[str, Any]) -> dict[str, Any]:
    """What a summary says went, without how long it took."""
    return {k: v for k, v in summary.items() if k not in ("dry_run", "batches", "seconds", "protected_rollouts")}


class Fill:
    """Rollouts written through the store contract, then aged: the store stamps ``end_time`` (and ``start_time``)
    with its clock, and no method of the contract sets them (rightly), so a rollout that ended 40 days ago is made
    by an UPDATE of those two columns on the test's own database."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.count = 0

    async def rollout(
        self,
        mode: RolloutMode | None = None,
        *,
        ended: float | None = 40,
        started: float | None = None,
        status: RolloutStatus = "succeeded",
        metadata: dict[str, Any] | None = None,
        attempts: int = 1,
        spans: int = 2,
        calls: int = 1,
    ) -> str:
        """A finished rollout (``status``) with ``attempts`` attempts, each with ``spans`` plain spans, three reward
        spans (one of each kind the views read) and ``calls`` LLM calls; aged to have ended ``ended`` days ago."""
        run = await self.store.start_rollout({"n": self.count}, mode=mode, metadata=metadata, worker_id="w1")
        self.count += 1
        rid, aid = run.rollout_id, run.attempt.attempt_id
        for n in range(attempts):
            if n:
                aid = (await self.store.start_attempt(rid, worker_id="w1")).attempt.attempt_id
            await self.spans(rid, aid, spans, rewards=True)
            await self.store.add_llm_calls([self.call(rid, aid, k) for k in range(calls)])
            last = n == attempts - 1
            if status == "cancelled" and last:
                await self.store.update_rollout(rid, status="cancelled")
            else:
                ending = status if last else "failed"
                await self.store.update_attempt(rid, aid, status="succeeded" if ending == "succeeded" else "failed")
        await self.age(rid, ended=ended, started=started)
        return rid

    async def spans(self, rid: str, aid: str, plain: int, *, rewards: bool = False, names: Sequence[str] = ()) -> None:
        spans = [self.span(rid, aid, f"tool.{k}", {"k": k}) for k in range(plain)]
        spans += [self.span(rid, aid, name, {"step": k, "metric.reward_mean": 0.5}) for k, name in enumerate(names)]
        if rewards:
            spans += [
                self.span(rid, aid, "agentlightning.annotation", {"agentlightning.reward.0.value": 0.5}),
                self.span(rid, aid, "agentlightning.reward", {"reward": 1.0}),
                self.span(rid, aid, "agentlightning.reward", {"agentlightning.reward.0.value": "n/a"}),
            ]
        await self.store.add_many_spans(spans, allocate_sequence_ids=True)

    def span(self, rid: str, aid: str, name: str, attributes: dict[str, Any]) -> Span:
        self.count += 1
        now = time.time()
        return Span(
            rollout_id=rid,
            attempt_id=aid,
            sequence_id=0,
            trace_id="ab" * 16,
            span_id=f"{self.count:016x}",
            name=name,
            attributes=attributes,
            start_time=now,
            end_time=now,
        )

    def call(self, rid: str, aid: str, k: int) -> LlmCall:
        self.count += 1
        return LlmCall(
            rollout_id=rid,
            attempt_id=aid,
            span_id=f"{self.count:016x}",
            sequence_id=k,
            model="m",
            prompt_token_ids=[1, 2],
            response_token_ids=[3],
            start_time=time.time(),
        )

    async def run(self, algorithm: str, *, started: float | None = None, finished: bool = False) -> str:
        """A training run's own rollout with two step metrics, started ``started`` days ago, running or finished."""
        run = await self.store.start_rollout({"algorithm": algorithm}, metadata={"training_run": algorithm})
        await self.spans(run.rollout_id, run.attempt.attempt_id, 0, names=["lightning_store.train.step"] * 2)
        if finished:
            await self.store.update_attempt(run.rollout_id, run.attempt.attempt_id, status="succeeded")
        await self.age(run.rollout_id, started=started, ended=started if finished else None)
        return run.rollout_id

    async def age(self, rid: str, *, ended: float | None = None, started: float | None = None) -> None:
        values = {}
        if ended is not None:
            values["end_time"] = time.time() - ended * DAY
        if started is not None:
            values["start_time"] = time.time() - started * DAY
        if values:
            sets = ", ".join(f"{k} = :{k}" for k in values)
            async with self.store.engine.begin() as conn:
                await conn.execute(sa.text(f"UPDATE rollouts SET {sets} WHERE rollout_id = :r"), {**values, "r": rid})


async def snapshot(store: SqlStore) -> Rows:
    """Every row of every table, as (rollout id or None, what identifies the row)."""
    queries = {
        "rollouts": "SELECT rollout_id, status FROM rollouts",
        "attempts": "SELECT rollout_id, attempt_id FROM attempts",
        "spans": "SELECT rollout_id, span_id, name FROM spans",
        "llm_calls": "SELECT rollout_id, span_id FROM llm_calls",
        "resources": "SELECT NULL, resources_id FROM resources",
        "workers": "SELECT NULL, worker_id FROM workers",
    }
    async with store.engine.connect() as conn:
        return {table: {tuple(row) for row in await conn.execute(sa.text(sql))} for table, sql in queries.items()}


def without(rows: Rows, rollout_ids: set[str], *, spans_only: bool = False) -> Rows:
    """``rows`` less those of ``rollout_ids``: all of them, or only their spans that ``--what spans`` takes."""

    def goes(table: str, row: tuple[Any, ...]) -> bool:
        if row[0] not in rollout_ids:
            return False
        if not spans_only:
            return True
        return table == "spans" and row[2].startswith("tool.")

    return {table: {row for row in found if not goes(table, row)} for table, found in rows.items()}


async def views(store: SqlStore) -> dict[str, list[Any]]:
    async with store.engine.connect() as conn:
        return {
            view: sorted(repr(tuple(row)) for row in await conn.execute(sa.text(f"SELECT * FROM {view}")))
            for view in VIEWS
        }


@pytest.fixture
async def store(database_url: str) -> Any:
    opened = await open_store(database_url, migrate=True, watchdog=False)
    yield opened
    await opened.close()


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_age_and_mode_select_whole_rollouts(store: SqlStore, database_url: str, tmp_path: Path) -> None:
    fill = Fill(store)
    await store.add_resources({})
    old_train = await fill.rollout("train")
    old_test = await fill.rollout("test", attempts=2, calls=2)
    old_none = await fill.rollout(None, status="failed")
    old_val = await fill.rollout("val", status="cancelled")
    await fill.rollout("test", ended=20)
    await fill.rollout("test", ended=None)  # just ended
    queued = (await store.enqueue_rollout({"q": 1}, mode="test")).rollout_id
    running = await store.start_rollout({"r": 1}, mode="test")
    await fill.age(queued, started=40)
    await fill.age(running.rollout_id, started=40)
    old_run = await fill.run("grpo", started=40, finished=True)
    before = await snapshot(store)

    args = ["--older-than", "30d", "--keep-mode", "train", "--what", "rollouts"]
    dry = await prune(database_url, *args, "--dry-run", cwd=tmp_path)
    assert await snapshot(store) == before
    assert dry["dry_run"] is True
    assert {mode: tally["rollouts"] for mode, tally in dry["by_mode"].items()} == {"none": 1, "test": 1, "val": 1}
    # per rollout: its attempts, 5 spans and its LLM calls per attempt (the cancelled one: its attempt, too)
    assert (dry["rollouts"], dry["attempts"], dry["spans"], dry["llm_calls"]) == (3, 4, 20, 6)
    assert dry["by_mode"]["test"] == {**dry["by_mode"]["test"], "attempts": 2, "spans": 10, "llm_calls": 4}
    assert dry["oldest_end_time"] < time.time() - 39 * DAY

    done = await prune(database_url, *args, "--yes", cwd=tmp_path)
    assert done["dry_run"] is False and counts(done) == counts(dry)
    pruned = {old_test, old_none, old_val}
    assert await snapshot(store) == without(before, pruned)

    # Age alone, one rollout per transaction, finished training runs' own rollouts included.
    args = ["--older-than", "30d", "--what", "rollouts", "--include-runs", "--batch-size", "1", "--yes"]
    done = await prune(database_url, *args, cwd=tmp_path)
    assert (done["rollouts"], done["batches"], sorted(done["by_mode"])) == (2, 2, ["none", "train"])
    assert await snapshot(store) == without(before, pruned | {old_train, old_run})


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_include_runs_takes_no_run_rollout_while_a_run_is_in_progress(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    """A resumed run in progress reads the finished run rollout it resumed from (training_steps_v files its steps
    under that one), so while any run is in progress --include-runs takes none; once none is, the old one goes."""
    fill = Fill(store)
    resumed_from = await fill.run("grpo", started=40, finished=True)
    running = await fill.run("grpo", started=0)
    before = await snapshot(store)
    args = ["--older-than", "30d", "--what", "rollouts", "--include-runs", "--yes"]
    kept = await prune(database_url, *args, cwd=tmp_path)
    assert kept["rollouts"] == 0 and await snapshot(store) == before
    async with store.engine.begin() as conn:  # the run ends
        await conn.execute(sa.text("UPDATE rollouts SET status = 'succeeded' WHERE rollout_id = :r"), {"r": running})
    done = await prune(database_url, *args, cwd=tmp_path)
    assert done["rollouts"] == 1
    assert resumed_from not in {row[0] for row in (await snapshot(store))["rollouts"]}


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_spans_scope_keeps_what_training_and_the_views_read(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    fill = Fill(store)
    old_test = [await fill.rollout("test", attempts=2), await fill.rollout("test", spans=5)]
    old_none = await fill.rollout(None)
    await fill.rollout("train")
    await fill.run("grpo", started=40, finished=True)
    before, read = await snapshot(store), await views(store)

    done = await prune(database_url, "--keep-mode", "train", "--yes", cwd=tmp_path)
    pruned = {*old_test, old_none}
    assert (done["what"], done["rollouts"], done["attempts"], done["llm_calls"]) == ("spans", 3, 0, 0)
    assert done["spans"] == 2 * 2 + 5 + 2
    assert await snapshot(store) == without(before, pruned, spans_only=True)
    assert await views(store) == read  # rewards, LLM calls, rollouts, attempts and training steps as before

    again = await prune(database_url, "--keep-mode", "train", "--dry-run", cwd=tmp_path)
    assert again["rollouts"] == 0  # nothing left to take: what stays is not counted again


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_training_run_in_progress_keeps_its_rollouts(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    fill = Fill(store)
    run = await fill.run("grpo", started=10)  # in progress for ten days
    before_run = await fill.rollout("train", started=20, ended=15)
    during_run = await fill.rollout("train", started=9, ended=8)
    named = await fill.rollout("train", started=20, ended=15, metadata={"training_run_id": run})
    finished_run = await fill.run("grpo", started=30, finished=True)
    before = await snapshot(store)
    args = ["--older-than", "7d", "--what", "rollouts"]

    dry = await store_cli("prune", *args, "--dry-run", "--database-url", database_url, cwd=tmp_path)
    assert dry.stdout.splitlines()[0] == "would delete 1 rollout: 1 attempt, 5 spans, 1 LLM call"
    assert f"kept 2 matching rollouts of training runs in progress: grpo {run} since " in dry.stdout
    done = await prune(database_url, *args, "--yes", cwd=tmp_path)
    assert done["rollouts"] == 1 and [r["rollout_id"] for r in done["runs_in_progress"]] == [run]
    assert await snapshot(store) == without(before, {before_run})

    await store.update_attempt(run, "latest", status="succeeded")  # the run ends: its rollouts are fair game
    done = await prune(database_url, *args, "--yes", cwd=tmp_path)
    assert done["rollouts"] == 2 and done["runs_in_progress"] == []
    after = await snapshot(store)
    assert {rid for rid, _ in after["rollouts"]} == {run, finished_run}
    assert after == without(await_rows(before, run, after), {before_run, during_run, named})


def await_rows(before: Rows, rid: str, after: Rows) -> Rows:
    """``before`` with the rows of ``rid`` as they are now (its status changed since)."""
    return {t: {r for r in before[t] if r[0] != rid} | {r for r in after[t] if r[0] == rid} for t in before}


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_an_apo_run_in_progress_keeps_every_apo_rollout(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    fill = Fill(store)
    cached = await fill.rollout("val", started=41, metadata={"apo_run": "ro-an-earlier-run", "apo_split": "val"})
    plain = await fill.rollout("val", started=41)
    run = await fill.run("apo")  # started now: the time rule alone would not keep `cached`
    args = ["--older-than", "30d", "--what", "rollouts", "--yes"]

    done = await prune(database_url, *args, cwd=tmp_path)
    assert (done["rollouts"], [r["algorithm"] for r in done["runs_in_progress"]]) == (1, ["apo"])
    remaining = {rid for rid, _ in (await snapshot(store))["rollouts"]}
    assert plain not in remaining and {cached, run} <= remaining

    await store.update_attempt(run, "latest", status="succeeded")
    done = await prune(database_url, *args, cwd=tmp_path)
    assert done["rollouts"] == 1
    assert {rid for rid, _ in (await snapshot(store))["rollouts"]} == {run}


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
@pytest.mark.parametrize(("what", "batch", "batches"), [("rollouts", 2, 7), ("spans", 3, 5)])
async def test_small_batches_take_the_same_rows(
    store: SqlStore, database_url: str, tmp_path: Path, what: str, batch: int, batches: int
) -> None:
    fill = Fill(store)
    doomed = {await fill.rollout("test", spans=k % 4, attempts=1 + k % 2, calls=k % 3) for k in range(7)}
    await fill.rollout("train")
    before = await snapshot(store)

    done = await prune(
        database_url, "--keep-mode", "train", "--what", what, "--batch-size", str(batch), "-y", cwd=tmp_path
    )
    assert await snapshot(store) == without(before, doomed, spans_only=what == "spans")
    # A batch is whole rollouts holding at most `batch` rows, or one rollout that holds more. Whole: every rollout
    # holds more than 2 rows. Spans: the rollouts hold 0, 2, 2, 6, 0, 2, 2 spans to take, so 2 | 2 | 6 | 2 | 2.
    assert (done["rollouts"], done["batches"]) == (batches, batches)


async def migrated(url: str) -> None:
    await (await open_store(url, migrate=True, watchdog=False)).close()


def test_bad_options_are_usage_errors_naming_the_option(tmp_path: Path) -> None:
    # The real Typer app in this process (no subprocess start per case): the same parsing and exits.
    db = tmp_path / "store.db"
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    asyncio.run(migrated(f"sqlite:///{db}"))
    url = ["--database-url", f"sqlite:///{db}"]
    cases: list[tuple[list[str], int, str]] = [
        ([*url], 2, "'--older-than' / '--keep-mode': store prune selects by age, by mode or both"),
        (["--older-than", "30x", *url], 2, "'--older-than': '30x' is not a duration"),
        (["--older-than", "0d", *url], 2, "'--older-than': '0d' is no time at all"),
        (["--keep-mode", "prod", *url], 2, "'--keep-mode'"),
        (["--keep-mode", "train", "--keep-mode", "val", "--keep-mode", "test", "--keep-mode", "none", *url], 2,
         "'--keep-mode': --keep-mode keeps every mode"),
        (["--older-than", "1d", "--what", "everything", *url], 2, "'--what'"),
        (["--older-than", "1d", "--batch-size", "0", *url], 2, "'--batch-size'"),
        (["--older-than", "1d", "--pause", "-1", *url], 2, "'--pause'"),
        (["--older-than", "1d", *url], 2, "pass --yes"),  # stdin is not a terminal: no one to ask
        (["--older-than", "1d", "--yes", "--database-url", f"sqlite:///{tmp_path / 'nothing.db'}"], 1,
         "cannot prune: no database at"),
        (["--older-than", "1d", "--yes", "--database-url", f"sqlite:///{empty}"], 1,
         f"cannot prune: database is not migrated (at revision none, head is {head_revision()}): run `store migrate"),
        (["--older-than", "1d", "--yes", "--database-url", "postgresql://nobody@127.0.0.1:1/none"], 1,
         "cannot prune: cannot reach the database postgresql://nobody@127.0.0.1:1/none"),
    ]  # fmt: skip
    for args, code, message in cases:
        result = CliRunner().invoke(app, ["prune", *args], env={"COLUMNS": "200"})
        assert result.exit_code == code, (args, result.output)
        assert message in " ".join(result.stderr.replace("│", " ").split()), (args, result.stderr)
        if code == 1:
            assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
    assert not (tmp_path / "nothing.db").exists()


async def test_on_a_terminal_it_shows_what_would_go_and_asks(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    fill = Fill(store)
    doomed = await fill.rollout("test", spans=4)
    before = await snapshot(store)
    for answer, code in (("n", 1), ("y", 0)):
        main, tty = pty.openpty()  # stdin a terminal: the command asks before it deletes
        os.write(main, f"{answer}\n".encode())
        argv = [*FAST, "prune", "--keep-mode", "train", "--database-url", database_url]
        try:
            result = await asyncio.to_thread(
                subprocess.run, argv, env={**clean_env(), "COLUMNS": "200"}, stdin=tty, capture_output=True,
                text=True, timeout=60, cwd=tmp_path,
            )  # fmt: skip
        finally:
            os.close(tty)
            os.close(main)
        assert result.returncode == code, result.stdout + result.stderr
        assert result.stdout.startswith("would delete 4 spans of 1 rollout (the rollouts, their attempts, LLM calls")
        assert "Delete them? [y/N]" in result.stderr
        if answer == "n":
            assert await snapshot(store) == before
    assert await snapshot(store) == without(before, {doomed}, spans_only=True)
    assert "deleted 4 spans of 1 rollout" in result.stdout and "1 transaction in" in result.stdout


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_rollout_that_changed_since_it_was_selected_stays(store: SqlStore) -> None:
    fill = Fill(store)
    revived, protected, taken = [await fill.rollout("test", started=40) for _ in range(3)]
    pruner = Pruner(store.engine, Rules(older_than=30 * DAY, what="rollouts"))
    selected = [c async for page in pruner.candidates(100) for c in page]
    assert {c.rollout_id for c in selected} == {revived, protected, taken}

    await store.start_attempt(revived)  # retried after it was selected: no longer terminal
    run = await fill.run("grpo", started=1)  # a run starts; `protected` was enqueued after it
    await fill.age(protected, started=0.5)
    summary = Summary(pruner.rules, dry_run=False)
    await pruner.delete(selected, summary)
    assert summary.total.rollouts == 1
    remaining = {rid for rid, _ in (await snapshot(store))["rollouts"]}
    assert remaining == {revived, protected, run}


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_serving_store_keeps_answering_during_a_prune(
    store: SqlStore, database_url: str, tmp_path: Path
) -> None:
    fill = Fill(store)
    for _ in range(40):
        await fill.rollout("test", spans=40, calls=1)
    server = Server("--database-url", database_url, cwd=tmp_path)
    try:
        await wait_healthy(server.url, server.process)
        async with httpx.AsyncClient(base_url=f"{server.url}/v1/agl", timeout=30) as http:
            live = (await http.post("/rollouts", json={"input": {"live": True}, "mode": "test"})).json()
            answered: list[tuple[str, int]] = []
            prune_run = asyncio.create_task(
                prune(database_url, "--keep-mode", "train", "--what", "rollouts", "--batch-size", "100", "--yes",
                      cwd=tmp_path)
            )  # fmt: skip

            async def client(k: int) -> None:
                n = 0
                while not prune_run.done():
                    n += 1
                    kind = ("search", "enqueue", "span")[n % 3]
                    if kind == "search":
                        response = await http.post("/rollouts/search", json={"limit": 20, "mode_in": ["test"]})
                    elif kind == "enqueue":
                        response = await http.post("/queues/rollouts/enqueue", json={"rollouts": [{"input": k}]})
                    else:
                        span = fill.span(live["rollout_id"], live["attempt"]["attempt_id"], "tool.live", {})
                        response = await http.post("/spans", json=span.model_dump(mode="json"))
                    answered.append((kind, response.status_code))

            await asyncio.gather(*(client(k) for k in range(4)))
            done = await prune_run
    finally:
        server.stop()
    assert done["rollouts"] == 40 and done["spans"] == 40 * 43 and done["batches"] >= 20
    statuses = {status for _, status in answered}
    assert len(answered) > 30 and statuses <= {200, 201}, sorted(statuses)
    remaining = await snapshot(store)
    queued = len(remaining["rollouts"]) - 1
    live_spans = len([s for s in remaining["spans"] if s[0] == live["rollout_id"]])
    assert (queued, live_spans) == (answered.count(("enqueue", 201)), answered.count(("span", 201)))
