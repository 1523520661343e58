"""Agents for the runner tests, importable by worker processes as ``tests.agents:name``.

``faulty`` does what its task says on the rollout's first attempt and succeeds on later ones, so a test can
inject every kind of failure and watch the retry policy recover.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from lightning_store.models import AttemptedRollout
from runners import rollout
from tracers import emit_message, operation


@rollout
def sync_agent(task: dict[str, Any]) -> float:
    with operation("double", tool=True) as op:
        op.record_output(task["x"] * 2)
    return float(task["x"])


@rollout
async def async_agent(task: dict[str, Any], rollout: AttemptedRollout) -> float:
    emit_message(f"attempt {rollout.attempt.sequence_id}")
    await asyncio.sleep(task.get("sleep", 0))
    return float(task["x"])


@rollout
async def faulty(task: dict[str, Any], rollout: AttemptedRollout) -> float:
    """``fault``: raise | hang_async | block_loop | sigkill | none; applied on the first attempt only.
    ``sleep``: seconds of work before that."""
    emit_message(f"attempt {rollout.attempt.sequence_id} of {task['i']}")
    await asyncio.sleep(task.get("sleep", 0))
    if rollout.attempt.sequence_id == 1:
        fault = task.get("fault", "none")
        if fault == "raise":
            raise RuntimeError(f"injected failure in {task['i']}")
        if fault == "hang_async":
            await asyncio.sleep(3600)
        if fault == "block_loop":
            time.sleep(3600)  # noqa: ASYNC251  # blocks the worker's event loop: only the supervisor can stop it
        if fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


@rollout
def faulty_sync(task: dict[str, Any], rollout: AttemptedRollout) -> float:
    """A sync agent whose first attempt hangs in a tool call (``fault: hang``) or raises (``fault: raise``)."""
    emit_message(f"attempt {rollout.attempt.sequence_id} of {task['i']}")
    if rollout.attempt.sequence_id == 1:
        if task.get("fault") == "hang":
            time.sleep(3600)
        if task.get("fault") == "raise":
            raise ValueError("injected")
    time.sleep(task.get("sleep", 0))
    return 1.0


@rollout
async def refused_span_agent(task: dict[str, Any]) -> float:
    """Emits a span the store refuses (a NUL character), one it takes, then a reward."""
    emit_message("before \x00 after")
    emit_message("kept")
    return float(task["x"])
