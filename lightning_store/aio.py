"""Running a coroutine as a program's main: on uvloop where it is installed (a dependency on Linux and macOS);
and keeping the garbage collector's full passes short in the processes we start.

Why uvloop: a store client, a runner worker and ``store serve`` spend much of their CPU time in the event loop
itself (socket reads and writes, callbacks from the database driver's thread), which uvloop does in C. uvicorn
picks uvloop on its own; this gives the processes we start ourselves the same loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
from collections.abc import Coroutine, Iterator
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


def run_blocking(main: Coroutine[Any, Any, T], *, cancel_grace: float = 60.0) -> T:
    """``main``'s result, from synchronous code, whether or not this thread already runs an event loop.

    Without one, :func:`run` (Ctrl-C cancels ``main``, as ``asyncio.run`` does). With one (a Jupyter kernel's
    cell: ``asyncio.run`` refuses to start there), ``main`` runs on a loop of its own in a helper thread while this
    thread waits; a ``KeyboardInterrupt`` here (the kernel's interrupt) cancels ``main``, waits up to
    ``cancel_grace`` seconds for its cleanup, and is raised again."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run(main)
    started = threading.Event()
    running: dict[str, Any] = {}
    outcome: dict[str, Any] = {}

    async def hosted() -> T:
        running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await main

    def host() -> None:
        try:
            outcome["result"] = run(hosted())
        except BaseException as error:  # handed to the waiting thread, which raises it
            outcome["error"] = error
        finally:
            started.set()
            finished.set()

    # Waits are on events, not Thread.join: a join that a KeyboardInterrupt broke may later report the thread
    # ended while it still runs.
    finished = threading.Event()
    threading.Thread(target=host, name="run-blocking", daemon=True).start()
    try:
        with _interrupt_raises():
            while not finished.wait(0.2):  # a timed wait: a KeyboardInterrupt reaches this thread between waits
                pass
    except KeyboardInterrupt:
        started.wait()
        with contextlib.suppress(RuntimeError, KeyError):  # main had finished (its loop is closed) or never began
            running["loop"].call_soon_threadsafe(running["task"].cancel)
        finished.wait(cancel_grace)
        raise
    if "error" in outcome:
        raise outcome["error"]
    result: T = outcome["result"]
    return result


@contextlib.contextmanager
def _interrupt_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here meanwhile (on the main thread): the running loop's own handler, where
    it has one (``asyncio.run`` installs one that cancels its main task), would wait for this blocked thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
