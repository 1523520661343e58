"""The examples' READMEs state each file's line count (the issue asks a reader to see how little of an example
knows about this project): the counts are the files' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"
READMES = sorted(EXAMPLES.glob("*/README.md"))


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.parent.name)
def test_each_files_line_count_is_its_own(readme: Path) -> None:
    counted = re.findall(r"^\| `([\w.]+\.py)` \| (\d+) \|", readme.read_text(), flags=re.MULTILINE)
    assert counted, f"{readme} has no table of files and line counts"
    for name, lines in counted:
        assert len((readme.parent / name).read_text().splitlines()) == int(lines), name


def test_the_sql_agent_knows_the_project_only_in_its_last_15_lines() -> None:
    lines = (EXAMPLES / "sql_agent" / "agent.py").read_text().splitlines()
    knowing = [i for i, line in enumerate(lines) if re.search(r"lightning_store|\brunners\b|\btracers\b", line)]
    assert knowing and min(knowing) >= len(lines) - 15 and lines[-15].startswith("# --- lightning-store")
