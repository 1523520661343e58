"""The examples' READMEs state each file's line count and how many of the agent's lines know about this project
(the issue asks a reader to see how little of a framework agent had to change): the numbers are the files' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"
READMES = sorted(EXAMPLES.glob("*/README.md"))
MARKER = "# --- lightning-store"
OURS = re.compile(r"\b(lightning_store|runners|tracers|adapters|algorithms)\b")


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.parent.name)
def test_each_files_line_count_is_its_own(readme: Path) -> None:
    counted = re.findall(r"^\| `([\w.]+\.py)` \| (\d+) \|", readme.read_text(), flags=re.MULTILINE)
    assert counted, f"{readme} has no table of files and line counts"
    for name, lines in counted:
        assert len((readme.parent / name).read_text().splitlines()) == int(lines), name


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.parent.name)
def test_only_the_lines_after_the_marker_know_about_the_project(readme: Path) -> None:
    lines = (readme.parent / "agent.py").read_text().splitlines()
    marker = next(i for i, line in enumerate(lines) if line.startswith(MARKER))
    code = [i for i, line in enumerate(lines) if OURS.search(line) and not line.lstrip().startswith(("#", '"'))]
    assert code and min(code) > marker, [lines[i] for i in code if i < marker]
    said = re.search(r"the \*\*last (\d+) lines, the only ones that know about lightning-store\*\*", readme.read_text())
    assert said and int(said.group(1)) == len(lines) - marker
