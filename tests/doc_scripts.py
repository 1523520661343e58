"""Running a docs page's shell commands as written, in one bash script, and telling their outputs apart: shared
by the tests of executable how-tos."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
STORE_ENV = ("LIGHTNING_STORE_DATABASE_URL", "LIGHTNING_STORE_URL", "LIGHTNING_STORE_TOKEN")
"""What a reader's shell does not have set: the pages name their store themselves."""


def script(commands: list[str], marker: str, ready: Mapping[str, str]) -> str:
    """One bash script: each command, its output between markers (so each command's output can be told apart),
    and, after a command that starts a server in the background (one of ``ready``'s prefixes, ending in ``&``),
    ``ready``'s wait, the wait a reader does for it."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for number, command in enumerate(commands):
        lines.append(f"echo '{marker} {number}'; echo '{marker} {number}' >&2")
        lines.append(command)
        for start, wait in ready.items():
            if command.startswith(start) and command.rstrip().endswith("&"):
                lines.append(wait)
    return "\n".join(lines) + "\n"


def outputs(text: str, marker: str, count: int) -> list[str]:
    """The output of each of ``count`` commands, split at the markers :func:`script` printed."""
    parts = re.split(rf"^{marker} (\d+)\n", text, flags=re.MULTILINE)
    found = {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
    return [found.get(i, "") for i in range(count)]


def page_commands(page: Path) -> list[str]:
    """A docs page's shell commands (its ``bash`` blocks) in order, a ``\\``-continued line joined and a heredoc
    kept whole with its body."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        lines = block.replace("\\\n", " ").splitlines()
        while lines:
            line = lines.pop(0)
            if not line.strip():
                continue
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:
                end = lines.index(heredoc.group(1))
                line = "\n".join([line, *lines[: end + 1]])
                del lines[: end + 1]
            commands.append(line)
    return commands


def page_files(page: Path) -> dict[str, str]:
    """A docs page's Python files: each ``python`` block whose first line is ``# name.py``, by that name."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            files[first[2:]] = block
    return files


def run_commands(
    commands: list[str], ready: Mapping[str, str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> list[str]:
    """Run ``commands`` as one bash script (:func:`script`) and return each one's output; the script must succeed
    (the assertion shows the tail of its output)."""
    marker = f"#### command-{uuid.uuid4().hex}"
    run = subprocess.run(
        ["bash", "-c", script(commands, marker, ready)],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return outputs(run.stdout, marker, len(commands))


def store_ready(port: int) -> dict[str, str]:
    """The wait a reader does after starting ``store serve`` on ``port`` in the background (it answers its health
    route within a second or two)."""
    check = f"import httpx; httpx.get('http://127.0.0.1:{port}/v1/agl/health').raise_for_status()"
    return {"store serve": f'until python -c "{check}" 2>/dev/null; do sleep 0.2; done'}


def run_page(page: Path, cwd: Path, ready: Mapping[str, str], *, timeout: float) -> Callable[[str], str]:
    """Run ``page``'s shell commands as written, in ``cwd`` with the repository's ``examples`` and ``bench`` beside
    them and this interpreter's tools first on PATH; returns ``said(prefix)``, the output of the first command
    that starts with ``prefix``."""
    for package in ("examples", "bench"):
        (cwd / package).symlink_to(ROOT / package)
    commands = page_commands(page)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in STORE_ENV:
        env.pop(name, None)
    out = run_commands(commands, ready, cwd=cwd, env=env, timeout=timeout)

    def said(prefix: str) -> str:
        return next(text for command, text in zip(commands, out, strict=True) if command.startswith(prefix))

    return said


def rows(database: Path, query: str, *args: Any) -> list[dict[str, Any]]:
    """The rows of ``query`` on the SQLite file ``database``, as dicts."""
    with sqlite3.connect(database) as connection:
        connection.row_factory = sqlite3.Row
        return [dict(row) for row in connection.execute(query, args)]
