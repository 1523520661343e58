"""Long waits that end early: a blocking dequeue or ``wait_for_rollouts`` run inside :func:`until` also stops
waiting once the given event is set, and returns what it has, as it would at its timeout.

Only the sleeping between checks of the database is cut short: a claim under way is never interrupted, so
ending a wait early cannot lose a rollout. ``store serve`` runs every long-poll inside one, set when the server
begins to shut down or when that long-poll's client disconnects (:mod:`lightning_store.server.shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

_until: ContextVar[asyncio.Event | None] = ContextVar("lightning_store_waits_until", default=None)


@contextlib.contextmanager
def until(event: asyncio.Event) -> Iterator[None]:
    """Waits of the store started in this context end early once ``event`` is set."""
    token = _until.set(event)
    try:
        yield
    finally:
        _until.reset(token)


def ended() -> bool:
    """Whether the event of the enclosing :func:`until` is set (False outside of one)."""
    event = _until.get()
    return event is not None and event.is_set()


async def sleep(wakeup: asyncio.Event, timeout: float) -> None:
    """Sleep until ``wakeup`` is set, ``timeout`` seconds pass, or the enclosing :func:`until` ends."""
    event = _until.get()
    if event is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout)
        return
    if event.is_set():
        return
    waiters = {asyncio.ensure_future(wakeup.wait()), asyncio.ensure_future(event.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def sleep_until(moment: float, deadline: float | None = None) -> None:
    """Sleep until ``time.monotonic()`` reaches ``moment`` (or ``deadline``, if earlier), or the enclosing
    :func:`until` ends."""
    end = moment if deadline is None else min(moment, deadline)
    if (delay := end - time.monotonic()) > 0:
        await sleep(asyncio.Event(), delay)
