"""``store export`` as a real subprocess against real SQLite and Postgres stores filled through the store
contract (tests/export_store.py): every file holds exactly what the store holds, for every filter; batching
changes nothing; JSON Lines and Parquet hold the same values; bad input gets one line and exit status 2."""

from __future__ import annotations

import asyncio
import datetime
import json
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from lightning_store.sql import SqlStore, open_store
from tests.export_store import Filled, expected_export, fill, parsed, read_jsonl, run_export
from tests.postgres import TemplateDatabases

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
FILES = ("rollouts", "attempts", "llm_calls", "spans", "training_steps")
ORDER: dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]] = {
    "rollouts": lambda r: (r["start_time"], r["rollout_id"]),
    "attempts": lambda r: (r["rollout_id"], r["sequence_id"]),
    "llm_calls": lambda r: (r["rollout_id"], r["sequence_id"], r["attempt_id"], r["span_id"]),
    "spans": lambda r: (r["rollout_id"], r["sequence_id"], r["attempt_id"], r["span_id"]),
}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlStore]:
    opened = await open_store(database_url, migrate=True, watchdog=False)
    yield opened
    await opened.close()


@pytest.fixture
async def filled(store: SqlStore) -> Filled:
    return await fill(store)


async def export(url: str, out: Path, *args: str, quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Run ``store export`` (JSON Lines unless ``args`` say otherwise); each file's rows, JSON columns parsed.
    ``quick``: the command without the plugin commands loaded (see :func:`run_export`)."""
    result = await asyncio.to_thread(run_export, url, out, "--format", "jsonl", *args, quick=quick)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    files = {name: parsed_rows(out / entry["path"]) for name, entry in manifest["files"].items()}
    assert {name: len(rows) for name, rows in files.items()} == {n: e["rows"] for n, e in manifest["files"].items()}
    assert result.stdout.splitlines() == [
        f"{out / entry['path']}: {entry['rows']:,} row{'' if entry['rows'] == 1 else 's'}, " + size(entry["bytes"])
        for entry in manifest["files"].values()
    ]
    return files


def size(count: int) -> str:
    return f"{count} bytes" if count < 1024 else f"{count / 1024:.1f} KiB"


def parsed_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [parsed(row) for row in pq.read_table(path).to_pylist()]
    return [parsed(row) for row in read_jsonl(path)]


def training_steps(filled: Filled) -> list[dict[str, Any]]:
    """``training_steps_v`` of the filled store: the run's three steps, steps 1 and 2 last written when resumed."""
    run, resumed = filled.run_id, filled.resumed_id
    return [
        {"step": 0, "training_rollout_id": run, "resources_version": None, "val_reward": 0.25, "loss": None},
        {"step": 1, "training_rollout_id": resumed, "resources_version": 2, "val_reward": 0.75, "loss": 0.125},
        {"step": 2, "training_rollout_id": resumed, "resources_version": 3, "val_reward": None, "loss": 0.0625},
    ]


def steps_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("step", "training_rollout_id", "resources_version", "val_reward", "loss")
    return [{k: row[k] for k in keys} for row in rows]


async def check(files: dict[str, list[dict[str, Any]]], store: SqlStore, filled: Filled, selected: set[str]) -> None:
    """The files hold exactly what the store holds for ``selected``, in the documented order."""
    expected = await expected_export(store, filled, selected)
    for name, rows in expected.items():
        if name not in files:
            continue
        assert files[name] == sorted(rows, key=ORDER[name]), name
        assert files[name] == sorted(files[name], key=ORDER[name]), name


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_every_file_holds_what_the_store_holds_in_either_format_and_any_batch_size(
    database_url: str, store: SqlStore, filled: Filled, tmp_path: Path
) -> None:
    jsonl, batched, parquet = tmp_path / "jsonl", tmp_path / "batched", tmp_path / "parquet"
    files, _, _ = await asyncio.gather(
        export(database_url, jsonl),
        export(database_url, batched, "--batch-size", "3"),
        asyncio.to_thread(run_export, database_url, parquet, "--batch-size", "3"),
    )
    await check(files, store, filled, set(filled.modes) | {filled.queued})
    assert len(files["rollouts"]) == 15 and len(files["spans"]) > 3 * 3
    assert [r["run_id"] for r in files["training_steps"]] == [filled.run_id] * 3
    assert steps_of(files["training_steps"]) == training_steps(filled)
    assert files["training_steps"][1]["metrics"] == {
        "loss": 0.125,
        "reward_mean": 0.5,
        "val_reward": 0.75,
        "val_rollouts": 2.0,
        "version": 2.0,
    }
    # Batches of 3 rows: the very same bytes.
    for name in FILES:
        assert (batched / f"{name}.jsonl").read_bytes() == (jsonl / f"{name}.jsonl").read_bytes()
    # Parquet: the same rows, one row group per batch, the documented types.
    pq = pytest.importorskip("pyarrow.parquet")
    manifest = json.loads((parquet / "manifest.json").read_text())
    assert manifest["format"] == "parquet" and manifest["batch_size"] == 3
    for name in FILES:
        path = parquet / f"{name}.parquet"
        assert parsed_rows(path) == files[name], name
        rows = len(files[name])
        assert pq.ParquetFile(path).metadata.num_row_groups == max(1, math.ceil(rows / 3)), name
        schema = pq.read_schema(path)
        types = {f.name: str(f.type).replace("element: ", "") for f in schema}
        assert types == manifest["files"][name]["columns"], name
    assert str(pq.read_schema(parquet / "llm_calls.parquet").field("prompt_token_ids").type) == "list<element: int64>"


def filter_cases(filled: Filled) -> dict[str, tuple[list[str], set[str], list[int]]]:
    """Per case: the options, the rollouts they select and the training steps exported."""
    after = set(filled.modes) | {filled.queued}
    after -= filled.before
    iso = datetime.datetime.fromtimestamp(filled.boundary, datetime.UTC).isoformat()
    return {
        "mode": (
            ["--mode", "val", "--mode", "test"],
            {r for r, m in filled.modes.items() if m in ("val", "test")},
            [0, 1, 2],
        ),
        "since": (["--since", iso.replace("+00:00", "Z")], after, [1, 2]),
        "until": (["--since", "0", "--until", repr(filled.boundary)], set(filled.before), [0]),
        "resources": (
            ["--resources-id", "policy", "--resources-version", "3", "--resources-version", "99"],
            {r for r, v in filled.versions.items() if v == 3 and filled.modes.get(r) == "train"},
            [0, 1, 2],
        ),
        "run": (["--run", filled.run_id], filled.of_run, [0, 1, 2]),
        "apo_run": (["--run", filled.apo_run_id], filled.of_apo, []),
        "apo_run_val": (
            ["--run", filled.apo_run_id, "--mode", "val", "--what", "rollouts", "--what", "llm_calls"],
            filled.of_apo - {filled.apo_run_id},
            [],
        ),
    }


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_filters_select_rollouts_and_everything_of_theirs(
    database_url: str, store: SqlStore, filled: Filled, tmp_path: Path
) -> None:
    cases = filter_cases(filled)
    exported = await asyncio.gather(
        *(export(database_url, tmp_path / case, *args, quick=True) for case, (args, _, _) in cases.items())
    )
    for (case, (args, selected, steps)), files in zip(cases.items(), exported, strict=True):
        assert selected, f"{case}: the case must select something"
        assert {r["rollout_id"] for r in files["rollouts"]} == selected, case
        await check(files, store, filled, selected)
        manifest = json.loads((tmp_path / case / "manifest.json").read_text())
        assert manifest["filters"]["run"] == (args[1] if args[0] == "--run" else None), case
        if "--what" in args:  # only the files asked for
            assert sorted(p.name for p in (tmp_path / case).iterdir()) == [
                "llm_calls.jsonl",
                "manifest.json",
                "rollouts.jsonl",
            ]
            continue
        assert [r["step"] for r in files["training_steps"]] == steps, case
    # An APO run's calls to its optimizer LLM are LLM calls of its own rollout (no reward).
    optimizer = [c for c in exported[-2]["llm_calls"] if c["rollout_id"] == filled.apo_run_id]
    assert [c["agent_name"] for c in optimizer] == ["apo.critique"] and optimizer[0]["reward"] is None


def one_line(result: Any) -> str:
    """The command's stderr as one line (typer's usage errors are boxed over several)."""
    return " ".join(result.stderr.replace("│", " ").split())


async def test_bad_options_are_refused_naming_the_option_before_anything_is_written(
    store: SqlStore, filled: Filled, database_url: str, tmp_path: Path
) -> None:
    # (--mode, --what, --resources-version and --batch-size are checked by typer itself: choices and ranges.)
    cases = {
        "--since": (["--since", "yesterday"], "'yesterday' is neither an ISO 8601 time"),
        "--until": (["--since", "2026-01-02", "--until", "2026-01-01T23:59:59+00:00"], "must be later than --since"),
        "--run": (["--run", "ro-none"], "no training or APO run 'ro-none' in the store"),
        # A resumed part of a run is not the run: the error names the run to pass.
        "--run ": (
            ["--run", filled.resumed_id],
            f"'{filled.resumed_id}' continues the run '{filled.run_id}': pass --run {filled.run_id}",
        ),
    }
    results = await asyncio.gather(
        *(
            asyncio.to_thread(run_export, database_url, tmp_path / "out", *args, quick=True)
            for args, _ in cases.values()
        )
    )
    for (option, (_, message)), result in zip(cases.items(), results, strict=True):
        assert result.returncode == 2, (option, result.stderr)
        assert f"Invalid value for {option.strip()}: {message}" in one_line(result), (option, result.stderr)
    assert not (tmp_path / "out").exists()


async def test_a_directory_that_is_not_empty_is_refused_unless_overwrite(
    store: SqlStore, filled: Filled, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "spans.parquet").write_text("an older export")
    result = await asyncio.to_thread(run_export, database_url, out, "--format", "jsonl", quick=True)
    assert (result.returncode, result.stderr) == (
        2,
        f"cannot export: {out} is not empty: pass --overwrite to replace the export files in it\n",
    )
    files = await export(database_url, out, "--what", "training_steps", "--overwrite", quick=True)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt", "training_steps.jsonl"]
    assert len(files["training_steps"]) == 3 and (out / "notes.txt").read_text() == "mine"


async def test_parquet_without_pyarrow_says_which_extra_and_jsonl_needs_none(
    store: SqlStore, filled: Filled, database_url: str, tmp_path: Path
) -> None:
    no_pyarrow = "sys.modules['pyarrow'] = None  # as if the export extra were not installed"
    parquet, jsonl = await asyncio.gather(
        asyncio.to_thread(run_export, database_url, tmp_path / "parquet", prelude=no_pyarrow),
        asyncio.to_thread(run_export, database_url, tmp_path / "jsonl", "--format", "jsonl", prelude=no_pyarrow),
    )
    assert (parquet.returncode, parquet.stderr) == (
        2,
        "store export needs the 'export' extra for Parquet: pip install 'lightning-store[export]'\n",
    )
    assert not (tmp_path / "parquet").exists()
    assert jsonl.returncode == 0, jsonl.stderr
    assert len(read_jsonl(tmp_path / "jsonl" / "llm_calls.jsonl")) == 13


@pytest.mark.postgres
async def test_a_database_that_cannot_be_read_is_one_line(
    tmp_path: Path, pg_templates: TemplateDatabases | None
) -> None:
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    empty = await pg_templates.clone(migrated=False)
    cases = {
        empty: "cannot export: database is not migrated (at revision none, head is ",
        f"sqlite:///{tmp_path / 'missing.db'}": f"cannot export: cannot reach the database sqlite:///{tmp_path}",
        "postgresql://postgres@127.0.0.1:1/none": "cannot export: cannot reach the database postgresql://",
    }
    try:
        results = await asyncio.gather(
            *(asyncio.to_thread(run_export, url, tmp_path / "out", quick=True) for url in cases)
        )
    finally:
        await pg_templates.drop(empty)
    for (url, start), result in zip(cases.items(), results, strict=True):
        assert result.returncode == 1, (url, result.stderr)
        assert result.stderr.startswith(start) and result.stderr.count("\n") == 1, (url, result.stderr)
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "out").exists()
