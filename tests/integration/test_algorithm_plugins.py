"""Algorithms are plugins: the built-ins and a third-party package are found through the
``lightning_store.algorithms`` entry points, with no change to this project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.base import load_algorithm, registered
from algorithms.rl.builtin import GRPO, PPO, ReinforcePP

PLUGIN = """
from algorithms.base import Algorithm, AlgorithmConfig


class EchoConfig(AlgorithmConfig):
    rounds: int = 1


class Echo(Algorithm):
    name = "echo"
    summary = "A third-party algorithm that trains nothing."
    Config = EchoConfig

    async def train(self, session):
        return {"rounds": self.config.rounds}
"""


def install_plugin(site: Path) -> None:
    """Install a one-module package into ``site`` the way pip lays it out (module + dist-info)."""
    site.mkdir()
    (site / "echo_algorithm.py").write_text(PLUGIN)
    info = site / "echo_algorithm-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-algorithm\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lightning_store.algorithms]\necho = echo_algorithm:Echo\n")
    (info / "RECORD").write_text("")


def test_built_ins_are_registered_through_entry_points() -> None:
    assert {"grpo", "ppo", "reinforce_pp"} <= set(registered())
    assert (load_algorithm("grpo"), load_algorithm("ppo"), load_algorithm("reinforce_pp")) == (GRPO, PPO, ReinforcePP)
    with pytest.raises(KeyError, match=r"available: .*grpo"):
        load_algorithm("nope")


def test_configs_are_validated() -> None:
    assert GRPO(group_size=8).config.group_size == 8
    with pytest.raises(ValueError, match="clip_eps"):
        GRPO(clip_eps=1.5)
    with pytest.raises(ValueError, match="gae_lambda"):
        PPO(gae_lambda=2.0)
    with pytest.raises(ValueError, match="group_sise"):
        GRPO(group_sise=8)  # a typo is an error, not a silently ignored option


def test_a_third_party_package_adds_an_algorithm(tmp_path: Path) -> None:
    install_plugin(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.getcwd()])}
    listed = subprocess.run(
        [sys.executable, "-m", "lightning_store.cli", "algorithms", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["echo"]["distribution"] == "echo-algorithm"
    assert rows["echo"]["summary"] == "A third-party algorithm that trains nothing."
    assert {"grpo", "ppo", "reinforce_pp"} <= set(rows)
