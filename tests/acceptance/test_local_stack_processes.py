"""The subprocesses of ``store train`` (``store serve``, ``store run``) die with the trainer, even one killed with
SIGKILL, which gets no chance to stop them: they are not left running, orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = """
import sys, time
from pathlib import Path
from algorithms.local_stack import subprocess_in

with subprocess_in([sys.executable, "-c", "import time; time.sleep(60)"], Path(sys.argv[1])) as child:
    print(child.pid, flush=True)
    time.sleep(60)
"""


def gone(pid: int) -> bool:
    """No such process, or only its exit status is left (a zombie, where nothing reaps the orphan)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_child_dies_when_the_trainer_is_killed(tmp_path: Path) -> None:
    cwd = Path(__file__).parents[2]
    argv = [sys.executable, "-c", PARENT, str(tmp_path / "child.log")]
    child = None
    with subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            assert not gone(child) and psutil.Process(child).ppid() == parent.pid
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait(timeout=10)
            deadline = time.monotonic() + 5
            while not gone(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gone(child), f"the child {child} outlived its killed parent"
        finally:
            parent.kill()
            if child is not None and not gone(child):
                os.kill(child, signal.SIGKILL)
