"""``store export --store URL``: the export of the store a server serves, written by the command from the events
of ``POST /v1/export``, equals the export of the same database read directly, file for file, in both formats and
with filters; what cannot be exported is one line, before anything is written.

A real ``store serve`` (SQLite with a token, and Postgres) filled through its HTTP API with the export tests'
store (``tests.export_store``: a resumed GRPO run, an APO run, LLM calls with token ids, rewards); the commands run
in this process from another directory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from lightning_store.client import HttpStore
from tests.acceptance.test_cli_reads_through_server import TOKEN, Served, store, through
from tests.acceptance.test_serve import Server, wait_healthy
from tests.export_store import Filled, fill
from tests.postgres import TemplateDatabases

pytest.importorskip("pyarrow")
FILES = ["rollouts", "attempts", "llm_calls", "spans", "training_steps"]


async def filled_through(url: str, token: str | None) -> Filled:
    client = HttpStore(url, token=token)
    try:
        return await fill(client)
    finally:
        await client.close()


def serve(tmp_path: Path, database_url: str, token: str | None) -> Iterator[tuple[Served, Filled]]:
    server = Server("--database-url", database_url, *(["--token", token] if token else []), cwd=tmp_path)
    try:
        asyncio.run(wait_healthy(server.url, server.process))
        yield Served(server.url, database_url, token), asyncio.run(filled_through(server.url, token))
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(
    request: pytest.FixtureRequest, tmp_path: Path, pg_templates: TemplateDatabases | None
) -> Iterator[tuple[Served, Filled]]:
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


def manifest(directory: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((directory / "manifest.json").read_text())
    return loaded


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_the_servers_export_is_the_databases_file_for_file(
    served: tuple[Served, Filled], fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, filled = served
    monkeypatch.chdir(tmp_path)
    options = ["--format", fmt, "--batch-size", "3"]  # several batches a file: the stream's framing is exercised
    out, _ = store("export", "through", *options, *through(server))
    store("export", "direct", *options, "--database-url", server.database_url)
    for name in FILES:
        assert (tmp_path / "through" / f"{name}.{fmt}").read_bytes() == (
            tmp_path / "direct" / f"{name}.{fmt}"
        ).read_bytes()
    assert f"through/llm_calls.{fmt}: " in out
    remote, local = manifest(tmp_path / "through"), manifest(tmp_path / "direct")
    assert remote.pop("served_by") == server.url
    for key in ("exported_at", "exported_at_seconds", "files"):
        remote.pop(key), local.pop(key)
    assert remote == local  # the same schema revision, database (its password hidden), filters, batch size
    rows = {name: spec["rows"] for name, spec in manifest(tmp_path / "through")["files"].items()}  # type: ignore[attr-defined]
    assert rows == {name: spec["rows"] for name, spec in manifest(tmp_path / "direct")["files"].items()}  # type: ignore[attr-defined]
    assert rows["llm_calls"] > 0 and rows["training_steps"] > 0

    # Filters travel: the run and everything of it, as the database's own export selects it.
    store("export", "run-through", "--format", "jsonl", "--run", filled.run_id, "--mode", "train", *through(server))
    store(
        "export",
        "run-direct",
        "--format",
        "jsonl",
        "--run",
        filled.run_id,
        "--mode",
        "train",
        "--database-url",
        server.database_url,
    )
    for name in FILES:
        assert (tmp_path / "run-through" / f"{name}.jsonl").read_bytes() == (
            tmp_path / "run-direct" / f"{name}.jsonl"
        ).read_bytes()


def test_what_cannot_be_exported_is_one_line_and_nothing_is_written(
    served: tuple[Served, Filled], tmp_path: Path
) -> None:
    server, _ = served
    out = tmp_path / "out"
    _, err = store("export", str(out), "--format", "jsonl", "--run", "no-such-run", *through(server), code=2)
    assert "--run" in err and "no training or APO run 'no-such-run'" in err
    assert not out.exists()
    if server.token:
        _, err = store("export", str(out), "--format", "jsonl", "--store", server.url, "--token", "wrong", code=1)
        assert "pass --token or set LIGHTNING_STORE_TOKEN" in err and len(err.strip().splitlines()) == 1
        assert not out.exists()
    _, err = store("export", str(out), "--format", "jsonl", "--store", "http://127.0.0.1:9", code=1)
    assert "cannot reach the store at http://127.0.0.1:9" in err and not out.exists()
