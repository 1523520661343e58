"""Running a coroutine as a program's main: on uvloop where it is installed (a dependency on Linux and macOS).

Why uvloop: a store client, a runner worker and ``store serve`` spend much of their CPU time in the event loop
itself (socket reads and writes, callbacks from the database driver's thread), which uvloop does in C. uvicorn
picks uvloop on its own; this gives the processes we start ourselves the same loop.
"""

from __future__ import annotations

import asyncio
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
