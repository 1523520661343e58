"""``store train --report-to tensorboard,mlflow,wandb``: the run mirrored to each tracker, read back with each
library's own reader and compared with what the store holds (``training_steps_v``, ``prompt_candidates_v``).

One APO run as a user runs it (the stand-in of ``tests.scripted_optimizer`` as the agents' model and the
optimizer, as in ``test_apo.py``), from a directory of its own, so that MLflow's default store (``./mlflow.db``)
lands there; W&B runs offline (no key, no network). Then a tracker that cannot be imported or fails is one
warning, and training goes on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from algorithms.trackers import Trackers, parse_report_to
from tests import apo_agents as agents
from tests.acceptance.test_apo import ROOT, candidates, sql, stack, store_train, summary_of, train_argv, write_tasks
from tests.scripted_optimizer import create_app

pytestmark = pytest.mark.slow


def steps_in_store(db: Path) -> dict[str, dict[int, float]]:
    """Each metric's curve as ``training_steps_v`` holds it: {metric: {step: value}}."""
    curves: dict[str, dict[int, float]] = {}
    for row in sql(db, "SELECT step, metrics FROM training_steps_v ORDER BY step"):
        for name, value in json.loads(row["metrics"]).items():
            curves.setdefault(name, {})[int(row["step"])] = float(value)
    return curves


def tensorboard_curves(directory: Path) -> tuple[dict[str, dict[int, float]], list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    curves = {tag: {e.step: e.value for e in accumulator.Scalars(tag)} for tag in tags["scalars"]}
    return curves, list(tags["tensors"])


WANDB_BLOCK = 32768
"""The ``.wandb`` file is a LevelDB-format log (``:W&B`` header, then 32 KiB blocks of records with a 7-byte
header each: CRC-32C, length, type FULL/FIRST/MIDDLE/LAST) of ``wandb_internal_pb2.Record`` messages. wandb 0.31
moved its reader to its Go core; this is that format's reader, and the records are parsed with wandb's own
protobuf classes."""


def wandb_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pending, offset = [], b"", 7
    while offset + 7 <= len(data):
        if WANDB_BLOCK - offset % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            offset += WANDB_BLOCK - offset % WANDB_BLOCK
            continue
        length, kind = int.from_bytes(data[offset + 4 : offset + 6], "little"), data[offset + 6]
        chunk, offset = data[offset + 7 : offset + 7 + length], offset + 7 + length
        if kind == 0 and length == 0:  # zero padding up to the block's end
            offset += WANDB_BLOCK - offset % WANDB_BLOCK if offset % WANDB_BLOCK else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    return records


def wandb_history(run_directory: Path) -> list[dict[str, Any]]:
    """The history rows of an offline W&B run."""
    from wandb.proto import wandb_internal_pb2

    [log] = run_directory.glob("run-*.wandb")
    rows = []
    for data in wandb_records(log):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return rows


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # MLflow's own SQLAlchemy and protobuf uses, reading back
def test_an_apo_run_is_mirrored_to_tensorboard_mlflow_and_wandb(tmp_path: Path) -> None:
    import mlflow

    script = {"prompt_template": [agents.BAD_REWRITE, agents.GOOD_REWRITE, agents.BAD_REWRITE + " Please."]}
    write_tasks(tmp_path, **{s: agents.classify_tasks(s) for s in ("train", "val")})
    config = {"seed": 3, "max_rollouts": 60, "max_optimizer_calls": 6, "minibatch_size": 3, "report_to": "mlflow"}
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_STORE_", "MLFLOW_", "WANDB_"))}
    env["PYTHONPATH"] = str(ROOT)  # the agent (tests.apo_agents) from the repository, the command run elsewhere
    with stack(tmp_path, create_app(script), {"prompt_template": agents.CLASSIFY_SEED}) as served:
        argv = train_argv(served, tmp_path, "tests.apo_agents:classify", config)
        argv += ["--report-to", "tensorboard,mlflow,wandb"]  # wins over the config file's report_to
        result = store_train(argv, cwd=work, env=env)
        summary_of(result)
        db = served["db"]
        [run] = sql(db, "SELECT run_id FROM training_steps_v LIMIT 1")
        run_id = run["run_id"]
        stored = steps_in_store(db)
        stored_candidates = [dict(r) for r in candidates(db, run_id)]
    assert "val_reward" in stored and len(stored["val_reward"]) >= 2
    assert "warning" not in result.stderr.lower(), result.stderr[-2000:]

    # TensorBoard: every metric's curve equals the store's; the config and the candidates as text.
    board, texts = tensorboard_curves(tmp_path / "run" / "tensorboard" / run_id)
    for name, curve in stored.items():  # (TensorBoard's scalars are 32-bit floats)
        assert board[name] == pytest.approx(curve, rel=1e-6), name
    scored = {c["candidate"]: c["val_score"] for c in stored_candidates if c["val_score"] is not None}
    assert board["apo/candidate_val_score"] == pytest.approx(scored)
    assert "config" in texts and "apo/candidate" in texts

    # MLflow: its default store in the directory the command ran in.
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "lightning-store"]
    [mlflow_run] = client.search_runs([experiment.experiment_id])
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.data.tags["lightning_store.run_id"] == run_id
    assert mlflow_run.data.params["minibatch_size"] == "3" and mlflow_run.data.params["seed"] == "3"
    for name, curve in stored.items():
        history = client.get_metric_history(mlflow_run.info.run_id, name)
        assert {m.step: m.value for m in history} == pytest.approx(curve), name
    artifact = client.download_artifacts(mlflow_run.info.run_id, "apo/candidates.json", str(tmp_path))
    logged = json.loads(Path(artifact).read_text())["candidates"]
    assert len(logged) == len(stored_candidates)

    # W&B: the offline run's history rows hold the same curves.
    [offline] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    rows = wandb_history(offline)
    for name, curve in stored.items():
        assert {int(r["_step"]): r[name] for r in rows if name in r} == pytest.approx(curve), name
    tables = [r for r in rows if "apo/candidates/path" in r]
    assert tables and tables[-1]["apo/candidates/nrows"] == len(stored_candidates)
    table = json.loads((offline / "files" / tables[-1]["apo/candidates/path"]).read_text())
    ordinal = table["columns"].index("apo.candidate")
    assert sorted(row[ordinal] for row in table["data"]) == sorted(c["candidate"] for c in stored_candidates)


def test_a_tracker_that_cannot_be_imported_or_fails_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as where mlflow is not installed
    caplog.set_level(logging.WARNING)
    trackers = Trackers(["mlflow", "tensorboard"], tmp_path)
    assert list(trackers.active) == ["tensorboard"]
    trackers.start("ro-run", "apo", {"seed": 1})
    trackers.log_step(0, {"val_reward": 0.5})
    trackers.active["tensorboard"]._writer.close()  # type: ignore[attr-defined]  # gone: its next write fails
    trackers.log_step(1, {"val_reward": 0.75})
    trackers.log_step(2, {"val_reward": 1.0})
    trackers.finish(succeeded=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0] == "mlflow is not installed: not reporting to it (pip install 'lightning-store[trackers]')"
    assert warnings[1].startswith("tensorboard: not reporting to it any more"), warnings
    with pytest.raises(ValueError, match="unknown tracker 'tensorbored': choose from tensorboard, mlflow, wandb"):
        parse_report_to("tensorbored")
    assert parse_report_to(["wandb", "TensorBoard", "wandb"]) == ["wandb", "tensorboard"]
