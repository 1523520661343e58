"""Store calls that outlast a server restart: retried with backoff while the store cannot be reached."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from sqlalchemy.exc import OperationalError

T = TypeVar("T")
logger = logging.getLogger(__name__)

UNREACHABLE: tuple[type[BaseException], ...] = (httpx.TransportError, httpx.HTTPStatusError, OperationalError)
"""Errors that mean "the store is not there right now" (connection refused or reset, a 5xx, a database down).
Client mistakes (``StoreError``) are not among them: retrying cannot fix those."""


async def persist(call: Callable[[], Awaitable[T]], *, what: str, patience: float = 120.0) -> T:
    """``await call()``, retried with backoff (0.2 s doubling to 5 s) while the store is unreachable, for up to
    ``patience`` seconds; then the last error is raised."""
    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return await call()
        except UNREACHABLE as error:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("%s: store unreachable (%s); retrying in %.1f s", what, type(error).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
