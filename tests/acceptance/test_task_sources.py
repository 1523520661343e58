"""Tasks from Parquet, CSV and Hugging Face ``datasets``, not only JSON Lines: ``store enqueue FILE`` and ``store
train --train/--val/--test`` read them through ``lightning_store.task_sources``.

The files are written here by the libraries people write them with (pyarrow, ``datasets``' ``save_to_disk``,
``csv``), enqueued through the real command into a real SQLite store, and what the store holds is compared with
the rows. Offline, so ``hf:NAME`` is exercised with a local directory of data files (what ``load_dataset`` does
with a Hub name after the download).
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_store import task_sources
from lightning_store.connect import connect
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_cli_rollouts import cli
from tests.acceptance.test_serve import clean_env

ROWS: list[dict[str, Any]] = [
    {"id": "q1", "question": "2 + 2?", "answer": 4, "tags": ["math"], "weight": 0.5},
    {"id": "q2", "question": "Capital of France?", "answer": None, "tags": [], "weight": 1.0},
]


async def stored_inputs(database_url: str) -> dict[str, Any]:
    store = await connect(database_url)
    try:
        return {r.rollout_id: r.input for r in (await store.query_rollouts(sort_by="start_time")).items}
    finally:
        await store.close()


def enqueue(database_url: str, source: str, *options: str, code: int = 0) -> tuple[dict[str, Any], str]:
    _, err = cli("enqueue", source, "--id-field", "id", "--store", database_url, *options, code=code)
    return asyncio.run(stored_inputs(database_url)), err


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"


def test_parquet_and_csv_rows_become_tasks(tmp_path: Path, database_url: str) -> None:
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "tasks.parquet")
    stored, err = enqueue(database_url, str(tmp_path / "tasks.parquet"))
    assert stored == {"q1": ROWS[0], "q2": ROWS[1]} and "enqueued 2 rollouts" in err

    (tmp_path / "tasks.csv").write_text('id,question,answer,exact\nc1,"Two, plus two?",4,true\nc2,Empty?,,false\n')
    stored, _ = enqueue(database_url, str(tmp_path / "tasks.csv"))
    # Numbers and booleans inferred per column, an empty cell null, the rest text (commas inside quotes kept).
    assert stored["c1"] == {"id": "c1", "question": "Two, plus two?", "answer": 4, "exact": True}
    assert stored["c2"] == {"id": "c2", "question": "Empty?", "answer": None, "exact": False}


def test_a_hugging_face_dataset_by_directory_split_and_name(tmp_path: Path, database_url: str) -> None:
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list([{**ROWS[0], "id": "t1"}])}
    ).save_to_disk(str(saved))
    stored, _ = enqueue(database_url, str(saved))  # the train split by default
    assert list(stored) == ["q1", "q2"] and stored["q1"] == ROWS[0]
    stored, _ = enqueue(database_url, f"{saved}:test")
    assert list(stored) == ["q1", "q2", "t1"]
    _, err = enqueue(database_url, str(saved), "--split", "validation", code=1)
    assert "has no split 'validation' (it has: train, test)" in err

    files = tmp_path / "hub-like"  # what load_dataset(NAME) reads after a download: data files in a directory
    files.mkdir()
    pq.write_table(pa.Table.from_pylist([{**ROWS[1], "id": "h1"}]), files / "train.parquet")
    stored, _ = enqueue(database_url, f"hf:{files}")
    assert stored["h1"] == {**ROWS[1], "id": "h1"}

    assert task_sources.read_tasks(f"{saved}:test") == [{**ROWS[0], "id": "t1"}]  # what store train reads


def test_rows_json_cannot_hold_are_named_and_nothing_is_enqueued(tmp_path: Path, database_url: str) -> None:
    table = pa.Table.from_pylist([{"id": "ok", "blob": b"x"}, {"id": "bad", "blob": b"\x00\xff"}])
    pq.write_table(table.set_column(1, "blob", pa.array([None, b"\x00\xff"])), tmp_path / "bytes.parquet")
    _, err = enqueue(database_url, str(tmp_path / "bytes.parquet"), code=1)
    assert "bytes.parquet:2: a value of type bytes is not JSON" in err and "nothing was enqueued" in err

    pq.write_table(
        pa.Table.from_pylist([{"id": "a", "score": 1.5}, {"id": "b", "score": math.nan}]), tmp_path / "nan.pq"
    )
    _, err = enqueue(database_url, str(tmp_path / "nan.pq"), code=1)
    assert "nan.pq:2:" in err and "finite" in err, err
    assert math.isnan(task_sources.read_tasks(str(tmp_path / "nan.pq"))[1]["score"])  # read; refused when stored
    (tmp_path / "empty.csv").write_text("id,score\na,\nb,n/a\n")  # pyarrow's CSV reader: both are null
    assert task_sources.read_tasks(str(tmp_path / "empty.csv")) == [
        {"id": "a", "score": None},
        {"id": "b", "score": None},
    ]

    for source, line in [
        (str(tmp_path / "missing.parquet"), "cannot read"),
        (str(tmp_path / "tasks.csv") + ":test", "cannot read"),
        (str(tmp_path), "is a directory, not a dataset saved with datasets' save_to_disk"),
    ]:
        _, err = enqueue(database_url, source, code=1)
        assert line in err, (source, err)
    assert asyncio.run(stored_inputs(database_url)) == {}


def test_store_train_names_the_option_whose_tasks_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("question\nWhat is 2 + 2?\n")
    command = [*store_command(), "train", "--algorithm", "apo", "--workers", "0", "--store", "http://127.0.0.1:9"]
    result = subprocess.run(
        [*command, "--train", str(tmp_path / "train.csv"), "--val", str(tmp_path / "val.parquet")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        check=False,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    said = " ".join(result.stderr.replace("│", " ").split())
    # typer draws the error in a box as wide as the terminal (80 columns here): a long path may break anywhere.
    assert "Invalid value for --val: cannot read" in said and "val.parquet" in "".join(said.split()), said
    assert json.dumps("What is 2 + 2?") not in result.stdout  # nothing ran
