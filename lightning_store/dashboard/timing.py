"""Where a dashboard page's time went, for its ``Server-Timing`` response header.

Browsers show the header in their network panel; ``bench/dashboard.py`` reads it too. ``db`` is the time spent in
the database (every statement and store call, one after another), ``app`` the whole handler, rendering
included.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from fastapi.responses import Response

from lightning_store.dashboard.reader import Reader

T = TypeVar("T")


class TimedReader(Reader):
    """A :class:`Reader` on the same engine that adds up the time its statements take."""

    def __init__(self, base: Reader) -> None:
        super().__init__(base.engine)
        self.seconds = 0.0
        self.statements = 0
        self.started = time.perf_counter()

    async def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        began = time.perf_counter()
        try:
            return await super().rows(sql, params)
        finally:
            self.seconds += time.perf_counter() - began
            self.statements += 1

    async def timed(self, work: Awaitable[T]) -> T:
        """``work`` (a store call the page makes besides its statements), its time counted as database time."""
        began = time.perf_counter()
        try:
            return await work
        finally:
            self.seconds += time.perf_counter() - began
            self.statements += 1

    def stamp(self, response: Response) -> Response:
        """``response`` with a ``Server-Timing`` header: database time and statement count, and the whole."""
        app = (time.perf_counter() - self.started) * 1000
        response.headers["Server-Timing"] = (
            f'db;dur={self.seconds * 1000:.1f};desc="{self.statements} statements", app;dur={app:.1f}'
        )
        return response
