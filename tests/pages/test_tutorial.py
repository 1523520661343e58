"""The tutorial (docs/tutorial.md) works as written: every command of its ``bash`` blocks runs, in order, in a
fresh directory that has the repository's ``examples`` beside it, and the agent learns what the text says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.learning import STARTING_RATE_CEILING

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

ROOT = Path(__file__).parents[2]


def tutorial_commands() -> list[str]:
    text = (ROOT / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [command.strip() for block in blocks for command in block.replace("\\\n", " ").splitlines() if command]


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("LIGHTNING_STORE_DATABASE_URL", None)
    commands = tutorial_commands()
    assert [c.split()[0] for c in commands[:2]] == ["python", "store"] and len(commands) == 4
    results = []
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        results.append(result)

    *steps, summary = [json.loads(line) for line in results[1].stdout.splitlines()]  # stdout: JSON lines only
    first, last = steps[0]["val_reward"], steps[-1]["val_reward"]
    assert summary["event"] == "summary" and summary["val_reward"]["first"] == first
    assert summary["val_reward"]["last"] == last
    promise = f"the tutorial promises val_reward from ~0.33 to above 0.85: {first}, {last}"
    assert first < STARTING_RATE_CEILING and last >= 0.85, promise
    assert (tmp_path / "runs" / "flight" / "step-40" / "config.json").exists()
    assert "40" in results[2].stdout and "train" in results[3].stdout
