"""The files of ``store export`` read as they are by pandas, DuckDB and Hugging Face ``datasets``, each as
docs/reference/export.md shows it: token ids, log-probabilities and rewards come back exactly as the store holds
them. A reader that is not installed skips its own test only."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightning_store.sql import open_store
from tests.export_store import expected_export, fill, run_export

CALL_KEYS = ("rollout_id", "attempt_id", "prompt_token_ids", "response_token_ids", "response_logprobs", "reward")


@dataclass
class Exported:
    parquet: Path
    jsonl: Path
    calls: list[dict[str, Any]]
    """The store's LLM calls (the keys of :data:`CALL_KEYS`), in the files' order."""
    rewards: dict[str, float | None]
    """Each rollout's reward."""
    attributes: dict[str, Any]
    """Each span's attributes, by span id."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    """One store, filled once for the module, exported as Parquet and as JSON Lines (batches of 4 rows)."""
    root = tmp_path_factory.mktemp("export")
    url = f"sqlite:///{root / 'store.db'}"

    async def filled() -> dict[str, list[dict[str, Any]]]:
        store = await open_store(url, migrate=True, watchdog=False)
        try:
            filling = await fill(store)
            return await expected_export(store, filling, set(filling.modes) | {filling.queued})
        finally:
            await store.close()

    expected = asyncio.run(filled())
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run_export, url, root / fmt, "--format", fmt, "--batch-size", "4", quick=True)
            for fmt in ("parquet", "jsonl")
        ]
        for run in runs:
            assert run.result().returncode == 0, run.result().stderr
    calls = sorted(expected["llm_calls"], key=lambda c: (c["rollout_id"], c["sequence_id"]))
    yield Exported(
        root / "parquet",
        root / "jsonl",
        [{k: c[k] for k in CALL_KEYS} for c in calls],
        {r["rollout_id"]: r["reward"] for r in expected["rollouts"]},
        {s["span_id"]: s["attributes"] for s in expected["spans"]},
    )


def reward(value: Any) -> float | None:
    """A reward as a reader gives it: pandas reads a missing one as NaN."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def as_lists(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Token ids and logprobs as plain lists (pandas gives numpy arrays for Parquet lists)."""
    out = []
    for row in rows:
        row = {k: row[k] for k in CALL_KEYS}
        for key in ("prompt_token_ids", "response_token_ids", "response_logprobs"):
            row[key] = None if row[key] is None else [v.item() if hasattr(v, "item") else v for v in row[key]]
        row["reward"] = reward(row["reward"])
        out.append(row)
    return out


def test_pandas_reads_parquet_and_json_lines(exported: Exported) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    calls = pd.read_parquet(exported.parquet / "llm_calls.parquet")
    assert as_lists(calls.to_dict("records")) == exported.calls
    # JSON Lines: dtype=False keeps the *_time columns numbers (not dates), precise_float=True every double exact.
    lines = pd.read_json(exported.jsonl / "llm_calls.jsonl", lines=True, dtype=False, precise_float=True)
    assert as_lists(lines.to_dict("records")) == exported.calls
    assert list(lines.columns) == list(calls.columns)
    rollouts = pd.read_parquet(exported.parquet / "rollouts.parquet")
    assert {r: reward(w) for r, w in zip(rollouts["rollout_id"], rollouts["reward"], strict=True)} == exported.rewards
    spans = pd.read_parquet(exported.parquet / "spans.parquet")
    assert {s: json.loads(a) for s, a in zip(spans["span_id"], spans["attributes"], strict=True)} == exported.attributes
    # One training dataset: each call with its rollout's task and the reward of its attempt.
    train = calls[(calls["mode"] == "train") & calls["reward"].notna()]
    assert set(train["task_id"]) == {"t1", "t2", "t3"}


def test_duckdb_queries_the_files_in_place(exported: Exported) -> None:
    duckdb = pytest.importorskip("duckdb")
    query = "SELECT {} FROM '{}' ORDER BY rollout_id, sequence_id".format(", ".join(CALL_KEYS), "{}")
    for path in (exported.parquet / "llm_calls.parquet", exported.jsonl / "llm_calls.jsonl"):
        rows = duckdb.sql(query.format(path)).fetchall()
        assert [dict(zip(CALL_KEYS, row, strict=True)) for row in rows] == exported.calls, path.name
    rewards = duckdb.sql(f"SELECT rollout_id, reward FROM '{exported.parquet / 'rollouts.parquet'}'").fetchall()
    assert dict(rewards) == exported.rewards
    # JSON columns are text that DuckDB's JSON functions read; files join on their ids.
    per_model = duckdb.sql(
        f"""SELECT json_extract_string(s.attributes, '$."gen_ai.request.model"') AS requested, count(*) AS calls,
                   avg(c.reward) AS reward
            FROM '{exported.parquet / "spans.parquet"}' s
            JOIN '{exported.parquet / "llm_calls.parquet"}' c USING (rollout_id, attempt_id, span_id)
            GROUP BY requested"""
    ).fetchall()
    known = [c["reward"] for c in exported.calls if c["reward"] is not None]
    assert per_model == [("tiny", len(exported.calls), pytest.approx(sum(known) / len(known)))]


def test_hugging_face_datasets_loads_parquet_and_json_lines(
    exported: Exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(name, value)
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    cache = str(tmp_path / "cache")
    for builder, path in (
        ("parquet", exported.parquet / "llm_calls.parquet"),
        ("json", exported.jsonl / "llm_calls.jsonl"),
    ):
        calls = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
        assert calls.features["prompt_token_ids"] == datasets.List(datasets.Value("int64")), builder
        assert [{k: row[k] for k in CALL_KEYS} for row in calls] == exported.calls, builder
    rollouts = datasets.load_dataset(
        "parquet", data_files=str(exported.parquet / "rollouts.parquet"), split="train", cache_dir=cache
    )
    assert dict(zip(rollouts["rollout_id"], rollouts["reward"], strict=True)) == exported.rewards
