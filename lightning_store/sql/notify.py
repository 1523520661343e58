"""Wake-ups for blocking dequeue and ``wait_for_rollouts``.

Two topics: ``queue`` (a rollout entered the queue) and ``done`` (a rollout reached a terminal status). Writers
in this process signal their topic after commit. On Postgres, writers also ``pg_notify`` inside their
transaction (delivered at commit, to every process), and a listener connection relays notifications to the
local topics; spans never notify. Waiters always re-check the database after a wake-up or a short interval,
so a lost notification costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from lightning_store import waits
from lightning_store.sql.engine import CONNECT_TIMEOUT

logger = logging.getLogger(__name__)

CHANNEL = "lightning_store"
TOPICS = ("queue", "done")


class Topic:
    """A broadcast wake-up: every ``wait`` in progress returns when ``signal`` is called."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def signal(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        """Return on the next ``signal``, after ``timeout`` seconds, or once the enclosing
        :func:`lightning_store.waits.until` ends."""
        await waits.sleep(self._event, timeout)


def notify_clause(topic: str) -> sa.TextClause:
    """The statement a Postgres writer runs in its transaction to wake other processes at commit."""
    return sa.text("SELECT pg_notify(:channel, :topic)").bindparams(channel=CHANNEL, topic=topic)


class PostgresListener:
    """Relays ``LISTEN lightning_store`` notifications to local topics, reconnecting when the link drops."""

    def __init__(self, url: URL, topics: dict[str, Topic], retry_interval: float = 1.0) -> None:
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._topics = topics
        self._retry_interval = retry_interval
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lightning-store-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        topic = self._topics.get(payload)
        if topic is not None:
            topic.signal()

    async def _run(self) -> None:
        import asyncpg

        failing = False  # connecting has failed since the last connection: logged once, not every retry
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notification)
                if failing:
                    logger.info("store listener reconnected to Postgres")
                    failing = False
                self.connected.set()
                # Whatever happened while we were away may have been missed: wake everyone to re-check.
                for topic in self._topics.values():
                    topic.signal()
                await lost.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    logger.warning(
                        "store listener lost its Postgres connection (%s: %s); retrying every %g s",
                        type(exc).__name__,
                        exc,
                        self._retry_interval,
                    )
                    failing = True
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await asyncio.shield(conn.close(timeout=1))
            await asyncio.sleep(self._retry_interval)
