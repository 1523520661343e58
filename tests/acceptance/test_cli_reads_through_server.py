"""``store stats`` and ``store sql`` read the store a server serves (``--store URL``, or ``$LIGHTNING_STORE_URL``).

A user once ran ``store stats`` from another directory: it opened (then created) ``./lightning_store.db`` there and
reported 0 rollouts while the server held 44. Here a real ``store serve`` runs in one directory, on SQLite (with a
token) and on Postgres, and the commands run in this process from another; what they print through the server
must equal what they print reading the server's database directly, and a statement the database refuses is
refused the same way through ``POST /v1/sql``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightning_store.cli import app
from lightning_store.client import HttpStore
from tests.acceptance.test_serve import Server, wait_healthy
from tests.postgres import TemplateDatabases

TOKEN = "s3cret-token"


@dataclass
class Served:
    url: str
    database_url: str
    token: str | None


def store(*args: str, code: int = 0, env: dict[str, str] | None = None) -> tuple[str, str]:
    """``store ARGS`` (the real Typer app, in this process): stdout and stderr."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    return result.stdout, result.stderr


async def fill(url: str, token: str | None) -> None:
    client = HttpStore(url, token=token)
    try:
        for i in range(5):
            await client.enqueue_rollout({"task": i}, mode="train" if i % 2 else "val", rollout_id=f"ro-{i}")
        claimed = await client.dequeue_rollout()
        assert claimed is not None
    finally:
        await client.close()


def serve(tmp_path: Path, database_url: str, token: str | None) -> Iterator[Served]:
    args = ["--database-url", database_url, *(["--token", token] if token else [])]
    server = Server(*args, cwd=tmp_path)
    try:
        asyncio.run(wait_healthy(server.url, server.process))
        asyncio.run(fill(server.url, token))
        yield Served(server.url, database_url, token)
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path, pg_templates: TemplateDatabases | None) -> Iterator[Served]:
    if request.param == "sqlite":
        yield from serve(tmp_path, f"sqlite+aiosqlite:///{tmp_path / 'served.db'}", TOKEN)
        return
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = asyncio.run(pg_templates.clone())
    try:
        yield from serve(tmp_path, url, None)
    finally:
        asyncio.run(pg_templates.drop(url))


def through(served: Served) -> list[str]:
    return ["--store", served.url, *(["--token", served.token] if served.token else [])]


def test_stats_and_sql_through_the_server_read_what_the_database_holds(
    served: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no lightning_store.db here: reading it would say "no such file"

    [stats] = [json.loads(line) for line in store("stats", "--json", *through(served))[0].splitlines()]
    assert stats["total_rollouts"] == 5 and stats["total_attempts"] == 1
    assert stats["rollouts_by_status"] == {"queuing": 4, "preparing": 1}
    direct = json.loads(store("stats", "--json", "--database-url", served.database_url)[0])
    assert {k: v for k, v in direct.items() if k != "uptime"} == {k: v for k, v in stats.items() if k != "uptime"}

    query = "SELECT rollout_id, status, mode, input FROM rollouts_v ORDER BY rollout_id"
    for form in ([], ["--json"]):
        served_rows = store("sql", query, *form, *through(served))[0]
        assert served_rows == store("sql", query, *form, "--database-url", served.database_url)[0]
    rows = [json.loads(line) for line in store("sql", query, "--json", *through(served))[0].splitlines()]
    assert [r["rollout_id"] for r in rows] == [f"ro-{i}" for i in range(5)] and rows[1]["mode"] == "train"

    text, err = store("sql", query, "--max-rows", "2", "--json", *through(served))
    assert len(text.splitlines()) == 2 and "more rows matched: these are the first 2" in err

    # $LIGHTNING_STORE_URL names the store as --store does (and wins over the default database file).
    env = {"LIGHTNING_STORE_URL": served.url, **({"LIGHTNING_STORE_TOKEN": served.token} if served.token else {})}
    assert json.loads(store("stats", "--json", env=env)[0])["total_rollouts"] == 5
    assert store("sql", "SELECT count(*) AS n FROM rollouts_v", "--json", env=env)[0] == '{"n": 5}\n'
    _, err = store("stats", code=1)
    assert "no such file: lightning_store.db" in err and "read a running server with --store" in err
    assert not (elsewhere / "lightning_store.db").exists()


def test_a_refused_statement_is_one_line_and_changes_nothing(served: Served) -> None:
    postgres = served.database_url.startswith("postgresql")
    refusals = [
        ("SELEC 1", "syntax error"),
        ("DELETE FROM rollouts", "read-only transaction" if postgres else "attempt to write a readonly database"),
        (
            "SELECT pg_sleep(30)"
            if postgres
            else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
            "stopped after the timeout of 1 s",
        ),
    ]
    if postgres:
        refusals.append(("SELECT pg_read_file('/etc/hostname')", "permission denied for function pg_read_file"))
    for statement, line in refusals:
        _, err = store("sql", statement, "--timeout", "1", *through(served), code=1)
        assert err.startswith("query failed: ") and line in err and len(err.strip().splitlines()) == 1, err
    if postgres:  # the reader role, as `store sql` on the database (test_cli.py)
        assert (
            store("sql", "SELECT current_user AS who", "--json", *through(served))[0]
            == '{"who": "lightning_store_reader"}\n'
        )
    assert json.loads(store("stats", "--json", *through(served))[0])["total_rollouts"] == 5

    if served.token:
        _, err = store("sql", "SELECT 1", "--store", served.url, code=1)
        assert f"{served.url} wants a bearer token: pass --token or set LIGHTNING_STORE_TOKEN" in err
