"""A core install (no extras) pointed at Postgres says in one line which extra to install, from every command
that opens a database, instead of SQLAlchemy's ``No module named 'asyncpg'`` traceback.

The driver's absence is made real in the command's own interpreter the way Python documents for blocking an
import (``sys.modules["asyncpg"] = None``: ``import asyncpg`` then raises ``ImportError``), which is what an
interpreter without the package does; nothing of the store is replaced.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.test_serve import clean_env

WITHOUT_ASYNCPG = "import sys; sys.modules['asyncpg'] = None; from lightning_store.cli import main; main()"
URL = "postgresql://postgres@127.0.0.1:5432/postgres"
LINE = "Postgres needs its driver, which the core install leaves out: pip install 'lightning-store[postgres]'"


@pytest.mark.parametrize(
    ("arguments", "what", "status"),
    [
        (["serve", "--port", "0"], "cannot serve", 2),
        (["migrate"], "cannot migrate", 1),
        (["stats"], "cannot read the store", 1),
        (["sql", "SELECT 1"], "query failed", 1),
        (["export", "out"], "cannot export", 1),
    ],
)
def test_postgres_without_its_driver_names_the_extra_in_one_line(
    arguments: list[str], what: str, status: int, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ASYNCPG, *arguments, "--database-url", URL],
        cwd=tmp_path,
        env={**clean_env(), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = (done.stdout + done.stderr).strip()
    assert said == f"{what}: {LINE}" and done.returncode == status, said
    assert not (tmp_path / "out").exists()
