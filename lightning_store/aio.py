"""Running a coroutine as a program's main: on uvloop where it is installed (a dependency on Linux and macOS);
and keeping the garbage collector's full passes short in the processes we start.

Why uvloop: a store client, a runner worker and ``store serve`` spend much of their CPU time in the event loop
itself (socket reads and writes, callbacks from the database driver's thread), which uvloop does in C. uvicorn
picks uvloop on its own; this gives the processes we start ourselves the same loop.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, on a uvloop event loop when uvloop can be imported."""
    try:
        import uvloop
    except ImportError:  # Windows, or an environment without it: the standard loop works the same, slower
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result


def freeze_startup_heap() -> None:
    """Exempt every object alive now from the garbage collector's full passes (``gc.freeze()``).

    Call it once a process has started up (imports done, models loaded, store open). The objects made until
    then (modules, classes, a model's parameters' wrappers, SQLAlchemy's tables) live as long as the process,
    yet a full collection walked all of them: 160,000 to 540,000 objects in ``store serve``, a runner worker and
    the trainer, 90-300 ms each time on a 2-core machine, during which the process's event loop stood still.
    In a GRPO step of the tiny model such a pause landed in one step of two or three. Objects made later are
    collected as before; only the frozen ones are never freed, and nothing frees them before exit anyway.
    """
    gc.collect()  # what is already garbage is freed now rather than frozen
    gc.freeze()


SERVER_YOUNG_GENERATION = 50_000
"""Allocations between the young generation's collections in ``store serve`` (Python's default is 700)."""


def collect_requests_young() -> None:
    """Collect a server's young objects every :data:`SERVER_YOUNG_GENERATION` allocations, not every 700.

    Why: a request's objects (its decoded body, models, rows) live for the milliseconds it takes; with Python's
    default threshold a collection ran every few spans of a batch, found them still alive, and promoted them
    to older generations, whose collections then walked them again. With 100-span batches over HTTP the
    collector took 1.1 s of 9 s of the server's CPU; with this threshold 0.17 s (``gc.callbacks``, Postgres,
    2 vCPUs). What it costs: cyclic garbage waits longer to be freed (the young generation holds up to
    this many objects, a few MB). The older generations keep their defaults. Runners and trainers keep
    Python's threshold (their objects, tensors among them, should not wait)."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(SERVER_YOUNG_GENERATION, older, oldest)
