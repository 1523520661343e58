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
