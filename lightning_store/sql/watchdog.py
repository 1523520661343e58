"""The watchdog: marks timed-out and unresponsive attempts whether or not anyone calls the store.

One scan is one transaction. On Postgres, ``pg_try_advisory_xact_lock`` lets a single process scan at a time
(others skip that round), so several server processes do not race each other over the same attempts. While the
database cannot be reached, the rounds keep trying: one WARNING line when the outage starts, one INFO line when
it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

import sqlalchemy as sa

from lightning_store import lifecycle
from lightning_store.errors import DatabaseUnavailableError
from lightning_store.models import ACTIVE_ROLLOUT_STATUSES, RolloutConfig
from lightning_store.sql import transitions
from lightning_store.sql.attempts import AttemptOps
from lightning_store.sql.schema import rollouts

logger = logging.getLogger(__name__)

ADVISORY_LOCK_KEY = 0x4C53_5744  # "LSWD"


class WatchdogOps(AttemptOps):
    _watchdog_task: asyncio.Task[None] | None = None

    async def scan_unhealthy(self) -> int:
        """Run one scan now; returns how many attempts it marked."""
        now = time.time()
        marked = 0
        async with self._write() as (conn, wakeups):
            if not self.is_sqlite:
                got = await conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(ADVISORY_LOCK_KEY)))
                if not got.scalar_one():
                    return 0
            active = list(
                (
                    await conn.execute(
                        sa.select(rollouts.c.rollout_id, rollouts.c.status, rollouts.c.config)
                        .where(rollouts.c.status.in_(ACTIVE_ROLLOUT_STATUSES))
                        .order_by(rollouts.c.rollout_id)
                        .with_for_update(skip_locked=True)
                    )
                ).mappings()
            )
            configs = {row["rollout_id"]: RolloutConfig.model_validate(row["config"]) for row in active}
            watched = [row for row in active if _has_health_limits(configs[row["rollout_id"]])]
            latest = await self._latest_attempts(conn, [row["rollout_id"] for row in watched])
            for row in watched:
                attempt = latest.get(row["rollout_id"])
                if attempt is None:
                    continue
                config = configs[row["rollout_id"]]
                verdict = lifecycle.unhealthy_status(attempt, config, now)
                if verdict is None:
                    continue
                await transitions.set_attempt_status(
                    conn,
                    wakeups,
                    self.dialect,
                    attempt=attempt,
                    status=verdict,
                    rollout_status=row["status"],
                    config=config,
                    is_latest=True,
                    now=now,
                )
                marked += 1
        return marked

    def start_watchdog(self, interval: float) -> None:
        if interval > 0 and self._watchdog_task is None:
            self._watchdog_task = asyncio.create_task(self._watch(interval), name="lightning-store-watchdog")

    async def stop_watchdog(self) -> None:
        task, self._watchdog_task = self._watchdog_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self, interval: float) -> None:
        outage_since: float | None = None  # set while scans fail because the database cannot be reached
        while True:
            await asyncio.sleep(interval)
            try:
                marked = await self.scan_unhealthy()
            except DatabaseUnavailableError as exc:
                # One line per outage, not a traceback per round: the next rounds retry until it is back.
                if outage_since is None:
                    outage_since = time.monotonic()
                    logger.warning("watchdog: cannot reach the database (%s); scans resume when it is back", exc.reason)
                continue
            except Exception:
                # The watchdog must outlive an unexpected error too; the next round retries.
                logger.exception("watchdog scan failed")
                continue
            if outage_since is not None:
                down = time.monotonic() - outage_since
                logger.info("watchdog: the database is reachable again after %.1f s; scans resumed", down)
                outage_since = None
            if marked:
                logger.info("watchdog marked %d attempt(s) timed out or unresponsive", marked)


def _has_health_limits(config: RolloutConfig) -> bool:
    return config.timeout_seconds is not None or config.unresponsive_seconds is not None
