"""A worker: dequeue a rollout, run the agent on it under the tracer with a hard timeout, report the attempt.

One worker runs one attempt at a time. It heartbeats while the agent runs and stops the agent as soon as the
store says the attempt is no longer its own (the watchdog timed it out, or a newer attempt exists), so that a
rollout never runs twice at the same time. Spans are flushed before the attempt's status is reported.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_store.contract import LightningStore
from lightning_store.errors import ConflictError
from lightning_store.models import AttemptedRollout, AttemptStatus
from runners.agent import RolloutAgent
from runners.attempts import end_if_current, outcome, tally
from runners.endpoint import bind_resources, main_llm
from runners.resilience import UNREACHABLE, persist
from tracers import Tracer, emit_exception, emit_reward

logger = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]

EXIT_HUNG = 75
"""Exit status of a worker process whose sync agent overran its timeout in a thread that cannot be stopped."""


class AgentHung(Exception):
    """A sync agent overran its timeout; its thread cannot be stopped, so the worker process must end."""


class AttemptLost(Exception):
    """The store no longer counts this attempt as running (timed out by the watchdog, or superseded)."""


@dataclass
class WorkerStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    started_at: float = field(default_factory=time.time)

    def as_heartbeat(self, current: str | None) -> dict[str, Any]:
        return {
            **tally(self.outcomes),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "uptime": round(time.time() - self.started_at, 1),
            "current_rollout_id": current,
        }


class Worker:
    """Runs attempts of ``agent`` from ``store`` until ``stop`` is set (after the attempt in flight).

    ``server_url`` is the ``store serve`` whose LLM proxy the agent's LLM goes through (None: call the LLM in
    the resources directly). ``default_timeout`` applies to rollouts whose config sets no ``timeout_seconds``.
    ``report`` receives ``claimed`` and ``finished`` events (the runner's supervisor listens to them).
    """

    def __init__(
        self,
        store: LightningStore,
        agent: RolloutAgent,
        *,
        worker_id: str,
        server_url: str | None = None,
        token: str | None = None,
        default_timeout: float | None = None,
        heartbeat_interval: float = 5.0,
        poll_timeout: float = 5.0,
        report: Report | None = None,
    ) -> None:
        self.store = store
        self.agent = agent
        self.worker_id = worker_id
        self.server_url = server_url
        self.token = token
        self.default_timeout = default_timeout
        self.heartbeat_interval = heartbeat_interval
        self.poll_timeout = poll_timeout
        self.report: Report = report or (lambda event: None)
        self.stats = WorkerStats()
        self.current: AttemptedRollout | None = None
        self._last_worker_heartbeat = -float("inf")

    async def run(self, stop: asyncio.Event, *, idle_exit: float | None = None) -> None:
        """Dequeue and run attempts until ``stop`` is set, or the queue stayed empty for ``idle_exit`` s."""
        tracer = Tracer(self.store)
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                if idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                    return
                claimed = await self._dequeue()
                if claimed is None:
                    continue
                await self.run_attempt(claimed, tracer)
                await persist(lambda: self._worker_heartbeat(due_only=True), what="worker heartbeat")
                idle_since = time.monotonic()
        finally:
            await tracer.shutdown()
        await persist(lambda: self._worker_heartbeat(due_only=False), what="worker heartbeat")

    async def _dequeue(self) -> AttemptedRollout | None:
        try:
            return await self.store.dequeue_rollout(worker_id=self.worker_id, timeout=self.poll_timeout)
        except UNREACHABLE as error:
            logger.warning("dequeue failed, store unreachable (%s); retrying", type(error).__name__)
            await asyncio.sleep(1.0)
            return None

    async def run_attempt(self, claimed: AttemptedRollout, tracer: Tracer) -> AttemptStatus:
        """Run one claimed attempt to its end and report its status (which is also returned)."""
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        timeout = claimed.config.timeout_seconds or self.default_timeout
        self.current = claimed
        self.report({"event": "claimed", "rollout_id": rollout_id, "attempt_id": attempt_id, "timeout": timeout})
        status: AttemptStatus = "failed"
        try:
            await persist(
                lambda: self.store.update_attempt(
                    rollout_id, attempt_id, status="running", last_heartbeat_time=time.time()
                ),
                what="start attempt",
            )
            with tracer.attempt(rollout_id, attempt_id):
                status, hung = await self._run_agent(claimed, timeout)
            if not await tracer.flush():
                logger.warning("spans of %s were not all written before the flush timed out", attempt_id)
            if hung:
                # The agent's thread cannot be stopped: the process must end before the attempt is reported,
                # or the rollout could run again while it still runs. The supervisor reports the timeout.
                raise AgentHung(f"agent of {rollout_id} overran its {timeout} s timeout in a thread")
            if lost := tracer.lost_spans(attempt_id):
                logger.warning("%d spans of %s could not be written", lost, attempt_id)
            await self._finish(rollout_id, attempt_id, status)
        except AttemptLost:
            status = "timeout"
            self.stats.outcomes[status] += 1
            logger.warning("attempt %s of %s is no longer ours; stopped it", attempt_id, rollout_id)
        finally:
            self.current = None
        self.report({"event": "finished", "rollout_id": rollout_id, "attempt_id": attempt_id, "status": status})
        return status

    async def _run_agent(self, claimed: AttemptedRollout, timeout: float | None) -> tuple[AttemptStatus, bool]:
        """Run the agent (and its heartbeats); the attempt status and whether a sync agent's thread hung."""
        resources = await self._resources(claimed)
        args, kwargs = self.agent.arguments(
            claimed.input, llm=main_llm(resources), resources=resources, rollout=claimed
        )
        if self.agent.is_async:
            work: asyncio.Future[Any] = asyncio.ensure_future(self.agent(*args, **kwargs))
        else:
            context = contextvars.copy_context()
            work = asyncio.get_running_loop().run_in_executor(None, lambda: context.run(self.agent, *args, **kwargs))
        watcher = asyncio.ensure_future(self._heartbeat(claimed))
        try:
            done, _ = await asyncio.wait({work, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                watcher.result()  # raises AttemptLost
            if work not in done:
                work.cancel()
                emit_exception(TimeoutError(f"agent ran over its {timeout} s timeout"))
                return "timeout", not self.agent.is_async
            result = work.result()
        except Exception as error:
            if isinstance(error, AttemptLost):
                raise
            emit_exception(error)
            logger.info("agent failed on %s: %s: %s", claimed.rollout_id, type(error).__name__, error)
            return "failed", False
        finally:
            watcher.cancel()
            work.cancel()  # a no-op once it is done; stops an async agent when the attempt is lost or cancelled
        if isinstance(result, bool) or not (result is None or isinstance(result, int | float)):
            emit_exception(TypeError(f"an agent returns a float reward or None, not {type(result).__name__}"))
            return "failed", False
        if result is not None:
            emit_reward(float(result))
        return "succeeded", False

    async def _resources(self, claimed: AttemptedRollout) -> dict[str, Any]:
        update = None
        if claimed.resources_id:
            update = await persist(lambda: self.store.get_resources_by_id(claimed.resources_id or ""), what="resources")
        if update is None:
            update = await persist(self.store.get_latest_resources, what="latest resources")
        return bind_resources(
            update.resources if update else {},
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            server_url=self.server_url,
            token=self.token,
        )

    async def _heartbeat(self, claimed: AttemptedRollout) -> None:
        """Heartbeat the attempt (and the worker, when due); raise AttemptLost once the attempt is no longer
        its rollout's active, latest attempt."""
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.store.update_attempt(
                    rollout_id, attempt_id, last_heartbeat_time=time.time(), if_current=True
                )
                await self._worker_heartbeat(due_only=True)
            except ConflictError:
                raise AttemptLost(attempt_id) from None
            except UNREACHABLE as error:
                logger.warning("heartbeat failed, store unreachable (%s)", type(error).__name__)

    async def _worker_heartbeat(self, *, due_only: bool) -> None:
        """Send the worker's stats; with ``due_only``, at most once per heartbeat interval (a request per
        attempt would cost throughput for a display that refreshes every few seconds)."""
        now = time.monotonic()
        if due_only and now - self._last_worker_heartbeat < self.heartbeat_interval:
            return
        self._last_worker_heartbeat = now
        current = self.current.rollout_id if self.current else None
        await self.store.update_worker(self.worker_id, heartbeat_stats=self.stats.as_heartbeat(current))

    async def _finish(self, rollout_id: str, attempt_id: str, status: AttemptStatus) -> None:
        if not await persist(lambda: end_if_current(self.store, rollout_id, attempt_id, status), what="report status"):
            raise AttemptLost(attempt_id)  # the watchdog decided first; its status stands
        self.stats.outcomes[outcome(status)] += 1
