"""Faults across hosts: a training run on a cluster of network namespaces (``tests/cluster``), audited from the
database after partitions, kills, a Postgres restart, latency with loss, and a runner host that vanishes.

CI runs a short version: three faults at once, then a Postgres restart and a partition between a server and
Postgres. The ``long`` test takes each fault alone and all of them at once; docs/faults.md holds its table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from examples.flight.model import build_tool_namer
from tests.cluster.hosts import unavailable
from tests.cluster.scenario import FAULTS, Fault, combined, run_scenario

WHY_NOT = unavailable()
if WHY_NOT is not None and os.environ.get("LIGHTNING_STORE_REQUIRE_CLUSTER") == "1":
    raise RuntimeError(f"the fault cluster is required here (LIGHTNING_STORE_REQUIRE_CLUSTER=1): {WHY_NOT}")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=f"the fault cluster {WHY_NOT}")]

CHECKS = ("acknowledged", "one_runner", "timeouts", "training", "llm_calls")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tool-namer") / "model"
    build_tool_namer(path, steps=20)
    return path


def assert_held(result: dict[str, object], logs: Path) -> None:
    failed = {name: result[name] for name in CHECKS if not result[name]["held"]}  # type: ignore[index]
    assert not failed, f"{failed}\nevents: {result['events']}\nlogs: {logs}"
    assert result["faults_before_end"], f"the run ended before the faults were healed: {result['events']}"


def test_a_training_run_survives_faults_across_hosts(model: Path, tmp_path: Path) -> None:
    faults = [
        combined(
            ["server host killed (-9), then restarted", "runner host vanishes mid-attempt", "200 ms latency, 5 % loss"]
        ),
        FAULTS["Postgres restarted"],
        FAULTS["server partitioned from Postgres"],
    ]
    result = run_scenario(faults, model, tmp_path / "logs", steps=24)
    assert_held(result, tmp_path / "logs")
    assert result["given_up"] >= 1, "the vanished runner host left no attempt to give up: it was not mid-attempt"


@pytest.mark.long
@pytest.mark.parametrize("fault", [*FAULTS, "all at once"])
def test_each_fault_alone_and_all_at_once(fault: str, model: Path, tmp_path: Path) -> None:
    injected: Fault = combined(list(FAULTS)) if fault == "all at once" else FAULTS[fault]
    result = run_scenario([injected], model, tmp_path / "logs", steps=20)
    print({"fault": fault, **{name: result[name] for name in CHECKS}, "trainer_starts": result["trainer_starts"]})
    assert_held(result, tmp_path / "logs")
