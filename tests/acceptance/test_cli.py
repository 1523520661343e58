"""The ``store`` console script, run as a real subprocess against real databases."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from lightning_store.migrate import current_revision, head_revision
from lightning_store.sql import open_store
from lightning_store.sql.engine import make_engine
from tests.postgres import TemplateDatabases

URL_VIA = ["option", "env"]


def store_command() -> list[str]:
    """The installed ``store`` script, preferring the one beside this interpreter (same environment)."""
    script = shutil.which("store", path=str(Path(sys.executable).parent)) or shutil.which("store")
    if script is not None:
        return [script]
    return [sys.executable, "-m", "lightning_store.cli"]


class Cli:
    """Runs ``store`` with the database URL passed either as ``--database-url`` or in the environment."""

    def __init__(self, url: str, via: str, cwd: Path) -> None:
        self.url = url
        self.via = via
        self.cwd = cwd

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")}
        env["COLUMNS"] = "200"  # keep rich from wrapping messages
        argv = [*store_command(), *args]
        if self.via == "option":
            argv += ["--database-url", self.url]
        else:
            env["LIGHTNING_STORE_DATABASE_URL"] = self.url
        # cwd is the test's own directory, so the default ./lightning_store.db could never touch a real store.
        return subprocess.run(argv, env=env, cwd=self.cwd, capture_output=True, text=True, timeout=120, check=False)


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture(params=URL_VIA)
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    return Cli(sqlite_url(tmp_path), request.param, tmp_path)


@pytest.fixture
def migrated_cli(cli: Cli) -> Cli:
    result = cli("migrate")
    assert result.returncode == 0, output(result)
    return cli


@pytest.fixture
def postgres_url(pg_templates: TemplateDatabases | None) -> Iterator[str]:
    """A fresh, empty Postgres database (no schema at all)."""
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = asyncio.run(pg_templates.clone(migrated=False))
    yield url
    asyncio.run(pg_templates.drop(url))


def enqueue(url: str, count: int) -> None:
    async def run() -> None:
        store = await open_store(url, watchdog=False)
        try:
            for i in range(count):
                await store.enqueue_rollout({"task": i})
        finally:
            await store.close()

    asyncio.run(run())


def count_rollouts(url: str) -> int:
    async def run() -> int:
        engine = make_engine(url)
        try:
            async with engine.connect() as conn:
                return int((await conn.execute(sa.text("SELECT count(*) FROM rollouts"))).scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(run())


def revision_of(url: str) -> str | None:
    async def run() -> str | None:
        engine = make_engine(url)
        try:
            return await current_revision(engine)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_migrate_prints_the_revision(cli: Cli) -> None:
    result = cli("migrate")
    assert result.returncode == 0, output(result)
    assert result.stdout.strip() == f"schema at revision {head_revision()}"  # today: 0001
    assert revision_of(cli.url) == head_revision()
    # A second run is a no-op that reports the same revision.
    again = cli("migrate")
    assert again.returncode == 0, output(again)
    assert again.stdout.strip() == f"schema at revision {head_revision()}"


def test_stats_json_on_an_empty_store(migrated_cli: Cli) -> None:
    result = migrated_cli("stats", "--json")
    assert result.returncode == 0, output(result)
    stats = json.loads(result.stdout)
    assert stats["total_rollouts"] == 0
    assert stats["total_spans"] == 0
    assert stats["rollouts_by_status"] == {}


def test_sql_counts_rows_of_a_view(migrated_cli: Cli) -> None:
    enqueue(migrated_cli.url, 2)
    result = migrated_cli("sql", "SELECT count(*) AS n FROM rollouts_v", "--json")
    assert result.returncode == 0, output(result)
    assert [json.loads(line) for line in result.stdout.splitlines()] == [{"n": 2}]


def test_sql_refuses_to_write(migrated_cli: Cli) -> None:
    enqueue(migrated_cli.url, 2)
    result = migrated_cli("sql", "DELETE FROM rollouts")
    assert result.returncode != 0
    assert "query failed" in output(result)
    assert "Traceback" not in output(result)
    assert count_rollouts(migrated_cli.url) == 2


def test_sql_syntax_error_is_reported_without_a_traceback(migrated_cli: Cli) -> None:
    result = migrated_cli("sql", "SELEC count(*) FROM rollouts")
    assert result.returncode != 0
    assert "query failed" in output(result)
    assert "syntax error" in output(result)
    assert "Traceback" not in output(result)


@pytest.mark.parametrize("statement", ["PRAGMA foreign_keys = ON", ""])
def test_sql_statement_without_rows_is_reported_without_a_traceback(migrated_cli: Cli, statement: str) -> None:
    # Used to print sqlalchemy's ResourceClosedError with a traceback (result.all() on a statement with no rows).
    result = migrated_cli("sql", statement)
    assert result.returncode == 0, output(result)
    assert "returned no rows" in result.stdout
    assert "Traceback" not in output(result)


@pytest.mark.postgres
def test_migrate_on_a_fresh_postgres_database(tmp_path: Path, postgres_url: str) -> None:
    cli = Cli(postgres_url, "option", tmp_path)
    assert revision_of(postgres_url) is None
    result = cli("migrate")
    assert result.returncode == 0, output(result)
    assert result.stdout.strip() == f"schema at revision {head_revision()}"
    assert revision_of(postgres_url) == head_revision()


@pytest.mark.postgres
def test_sql_on_postgres_is_read_only(tmp_path: Path, postgres_url: str) -> None:
    cli = Cli(postgres_url, "env", tmp_path)
    assert cli("migrate").returncode == 0
    enqueue(postgres_url, 2)
    counted = cli("sql", "SELECT count(*) AS n FROM rollouts_v", "--json")
    assert counted.returncode == 0, output(counted)
    assert [json.loads(line) for line in counted.stdout.splitlines()] == [{"n": 2}]
    deleted = cli("sql", "DELETE FROM rollouts")
    assert deleted.returncode != 0
    assert "read-only" in output(deleted)
    assert "Traceback" not in output(deleted)
    assert count_rollouts(postgres_url) == 2


@pytest.mark.parametrize(
    "statement",
    ["ATTACH DATABASE 'attached.db' AS elsewhere", "PRAGMA query_only = OFF", "PRAGMA writable_schema = ON"],
)
def test_sql_on_sqlite_attaches_nothing_and_keeps_query_only(migrated_cli: Cli, statement: str) -> None:
    result = migrated_cli("sql", statement)
    assert result.returncode == 1 and "query failed: not authorized" in output(result), output(result)
    assert not (migrated_cli.cwd / "attached.db").exists()


def test_sql_stops_a_statement_past_its_timeout_and_reads_no_missing_file(migrated_cli: Cli) -> None:
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    result = migrated_cli("sql", endless, "--timeout", "1")
    assert result.returncode == 1 and "query failed: stopped after --timeout 1 s" in output(result), output(result)
    missing = Cli(f"sqlite:///{migrated_cli.cwd / 'mistyped.db'}", migrated_cli.via, migrated_cli.cwd)
    result = missing("sql", "SELECT 1")
    assert result.returncode == 1 and "no such file" in output(result)
    assert not (migrated_cli.cwd / "mistyped.db").exists()


def test_read_commands_create_no_database_and_bad_urls_get_one_line(tmp_path: Path) -> None:
    """A mistyped SQLite path once made `store stats` create an empty database and report 0; a URL that is not
    one, or a file that is not SQLite, printed a traceback."""
    mistyped = Cli(f"sqlite:///{tmp_path / 'mistyped.db'}", "option", tmp_path)
    result = mistyped("stats")
    assert result.returncode == 1 and "cannot read the store: no such file:" in output(result), output(result)
    assert not (tmp_path / "mistyped.db").exists()
    (tmp_path / "notes.db").write_text("not a database")
    for url, line in (
        ("not a url", "cannot serve: not a database URL: 'not a url'"),
        (f"sqlite:///{tmp_path / 'notes.db'}", "file is not a database"),
    ):
        result = Cli(url, "option", tmp_path)("serve", "--port", "0")
        assert result.returncode == 2 and line in output(result), output(result)
        assert "Traceback" not in output(result) and len(output(result).strip().splitlines()) == 1, output(result)


@pytest.mark.postgres
def test_sql_on_postgres_runs_as_the_reader_role_within_its_timeout(tmp_path: Path, postgres_url: str) -> None:
    """A read-only transaction alone still let a superuser run a shell command, read server files and end other
    sessions; as the reader role (revision 0009) each is refused, and a statement stops at its timeout."""
    cli = Cli(postgres_url, "option", tmp_path)
    assert cli("migrate").returncode == 0
    who = cli("sql", "SELECT current_user AS who", "--json")
    assert who.returncode == 0 and json.loads(who.stdout) == {"who": "lightning_store_reader"}, output(who)
    marker = tmp_path / "shell-ran"
    for statement, refusal in (
        (f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'", "pg_execute_server_program"),
        ("SELECT pg_read_file('/etc/hostname')", "permission denied for function pg_read_file"),
        ("SELECT pg_terminate_backend(pg_backend_pid())", "terminate"),
        ("SELECT * FROM alembic_version", None),  # a table: readable
    ):
        result = cli("sql", statement)
        if refusal is None:
            assert result.returncode == 0, output(result)
        else:
            assert result.returncode == 1 and refusal in output(result), output(result)
    assert not marker.exists()
    slept = cli("sql", "SELECT pg_sleep(30)", "--timeout", "1")
    assert slept.returncode == 1 and "stopped after --timeout 1 s" in output(slept), output(slept)


PLAIN_INSTALL = (
    "import sys\n"
    "sys.modules['torch'] = None  # import torch fails, as where the train extra is not installed\n"
    "sys.modules['transformers'] = None\n"
    "sys.argv[0] = 'store'\n"
    "from lightning_store.cli import main\n"
    "main()\n"
)
TRAIN_EXTRA = "pip install 'lightning-store[train]'"


def store_without_train_extra(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``store ARGS`` in a process where torch and transformers cannot be imported (``env`` added to its
    environment)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE_")} | {"COLUMNS": "200"}
    argv = [sys.executable, "-c", PLAIN_INSTALL, *args]
    cwd = Path(__file__).parents[2]  # the repository's packages, as installed
    return subprocess.run(
        argv, env=clean | (env or {}), cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def listed_commands(help_text: str) -> set[str]:
    """The command names of ``store --help`` (the rows of its Commands panel)."""
    commands = help_text.split("Commands", 1)[1]
    return set(re.findall(r"^│ ([a-z][\w-]*) ", commands, flags=re.MULTILINE))


def test_help_lists_the_training_commands_where_the_train_extra_is_installed() -> None:
    result = subprocess.run(
        [*store_command(), "--help"], env=os.environ | {"COLUMNS": "200"}, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, output(result)
    assert {"serve", "run", "train", "algorithms"} <= listed_commands(result.stdout)
    # In the loop's order, under three headings (docs/reference/cli.md has the same table).
    panels = [
        (title, re.findall(r"^│ ([a-z][\w-]*) ", body, flags=re.MULTILINE))
        for title, body in re.findall(r"╭─ (Commands[^─]*) ─+╮\n(.*?)╰", result.stdout, flags=re.DOTALL)
    ]
    assert panels == [
        ("Commands: the store", ["serve", "migrate"]),
        ("Commands: the training loop", ["resources", "policy", "enqueue", "doctor", "run", "train", "algorithms"]),
        ("Commands: what the store holds", ["rollouts", "stats", "sql", "export", "prune"]),
    ], result.stdout


def test_a_plain_install_lists_only_what_it_can_run(tmp_path: Path) -> None:
    """``store train`` and ``store algorithms`` are listed (an algorithm that trains no weights runs without torch);
    ``store policy`` is not."""
    result = store_without_train_extra(tmp_path, "--help")
    assert result.returncode == 0, output(result)
    assert result.stderr == ""  # no "cannot load command" warning
    commands = listed_commands(result.stdout)
    assert {"serve", "migrate", "stats", "sql", "run", "train", "algorithms"} <= commands
    assert "policy" not in commands, commands


def test_a_plain_install_says_which_extra_an_rl_algorithm_needs(tmp_path: Path) -> None:
    shown = store_without_train_extra(tmp_path, "train", "--help")
    assert shown.returncode == 0, output(shown)
    assert "Train an agent" in shown.stdout

    hint = f"store train needs the 'train' extra: {TRAIN_EXTRA}"
    ran = store_without_train_extra(tmp_path, "train", "--algorithm", "grpo", "--agent", "a:b", "--steps", "1")
    assert (ran.returncode, ran.stdout, ran.stderr) == (2, "", hint + "\n")
    alone = store_without_train_extra(tmp_path, "train", "--algorithm", "grpo")
    assert (alone.returncode, alone.stdout, alone.stderr) == (2, "", hint + "\n")
    listed = store_without_train_extra(tmp_path, "algorithms", "list", "--json")
    assert listed.returncode == 0, output(listed)
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert {"grpo", "ppo", "reinforce_pp"} <= set(rows)
    for name in ("grpo", "ppo", "reinforce_pp"):
        assert rows[name]["summary"] == f"(needs the 'train' extra: {TRAIN_EXTRA})", rows[name]
    policy = store_without_train_extra(tmp_path, "policy", "serve", "model")
    assert (policy.returncode, policy.stderr) == (2, f"store policy needs the 'train' extra: {TRAIN_EXTRA}\n")


NO_POLICY_PLUGIN = """
import json, sys
from algorithms.base import Algorithm


class Prompts(Algorithm):
    name = "prompts"
    summary = "Trains prompts, no weights."
    needs_policy = False

    async def train(self, session):
        seen = {
            "torch": sys.modules.get("torch"),
            "model_dir": session.model_dir,
            "policy": session.policy,
            "max_steps": session.max_steps,
            "tasks": [list(session.train_tasks), list(session.val_tasks), list(session.test_tasks)],
            "optimizer": session.optimizer.model_dump(),
        }
        (session.output_dir / "seen.json").write_text(json.dumps(seen))
        metrics = {"val_reward": 0.5, "round_seconds": 0.1}
        session.on_step(1, metrics)
        return {"history": [{"step": 1.0, **metrics}]}
"""


def install_no_policy_plugin(site: Path) -> None:
    """A package (module + dist-info, as pip lays it out) registering an algorithm that trains no weights."""
    site.mkdir()
    (site / "prompts_algorithm.py").write_text(NO_POLICY_PLUGIN)
    info = site / "prompts_algorithm-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: prompts-algorithm\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lightning_store.algorithms]\nprompts = prompts_algorithm:Prompts\n")
    (info / "RECORD").write_text("")


def test_a_plain_install_trains_with_an_algorithm_that_needs_no_model(tmp_path: Path) -> None:
    """No --model, no policy server, no torch: the session has neither model nor policy, and gets the test tasks
    and the optimizer settings (argument over environment)."""
    install_no_policy_plugin(tmp_path / "site")
    for split, task in (("train", {"q": 1}), ("val", {"q": 2}), ("test", {"q": 3})):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps(task) + "\n")
    run = tmp_path / "run"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(Path(__file__).parents[2])])}
    env |= {"LIGHTNING_STORE_OPTIMIZER_API_KEY": "key", "LIGHTNING_STORE_OPTIMIZER_MODEL": "from-env"}
    listed = store_without_train_extra(tmp_path, "algorithms", "list", "--json", env=env)
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["prompts"]["summary"] == "Trains prompts, no weights."
    args = ["train", "--algorithm", "prompts", "--agent", "examples.flight.agent:flight_agent", "--workers", "1"]
    args += ["--train", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl")]
    args += ["--test", str(tmp_path / "test.jsonl"), "--output", str(run)]
    args += ["--optimizer-url", "http://127.0.0.1:9/v1", "--optimizer-model", "from-option"]
    ran = store_without_train_extra(tmp_path, *args, env=env)
    assert ran.returncode == 0, output(ran)
    assert "loading the model" not in ran.stderr
    seen = json.loads((run / "seen.json").read_text())
    assert seen == {
        "torch": None,
        "model_dir": None,
        "policy": None,
        "max_steps": None,
        "tasks": [[{"q": 1}], [{"q": 2}], [{"q": 3}]],
        "optimizer": {
            "optimizer_url": "http://127.0.0.1:9/v1",
            "optimizer_model": "from-option",
            "optimizer_api_key": "key",
            "optimizer_timeout": 300.0,
        },
    }
    *steps, summary = [json.loads(line) for line in ran.stdout.splitlines()]
    assert steps == [{"event": "step", "step": 1, "val_reward": 0.5, "round_seconds": 0.1}]
    assert summary["event"] == "summary" and summary["algorithm"] == "prompts"
    assert (summary["steps_run"], summary["checkpoint"], summary["store"]) == (1, None, str(run / "store.db"))


def test_an_rl_algorithm_needs_a_model(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text("{}\n")
    argv = [
        *store_command(),
        "train",
        "--algorithm",
        "grpo",
        "--agent",
        "a:b",
        "--train",
        str(tmp_path / "train.jsonl"),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert result.returncode == 2, output(result)
    assert "--model" in result.stderr and "grpo trains a model" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()
