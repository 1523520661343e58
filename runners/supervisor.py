"""The runner: N worker processes, supervised.

The supervisor learns from each worker which attempts it holds. A worker that dies (an exception that escaped,
SIGKILL, an out-of-memory kill) has its attempts marked ``failed``; a worker that overruns an attempt's timeout
by ``kill_after`` seconds (a hung agent, or a blocked event loop) is killed and that attempt marked ``timeout``;
in both cases the retry policy decides whether the rollout is requeued, and a fresh worker takes the slot. The
other attempts a hung worker held (with ``concurrency`` above 1) were not at fault: they are released, their
rollouts requeued whatever the policy. A death with no culprit fails every attempt the worker held, since any of
them may have caused it. SIGINT/SIGTERM stop the workers gracefully (see :mod:`runners.process`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from lightning_store.connect import connect, store_target
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptStatus
from runners.agent import AgentNotLoadable
from runners.attempts import RELEASE_SECONDS, end_if_current, outcome, release_all
from runners.process import WorkerConfig, worker_main
from runners.progress import ProgressView
from runners.resilience import UNREACHABLE
from runners.worker import EXIT_HUNG

logger = logging.getLogger(__name__)

CRASH_LOOP_SECONDS = 5.0
"""A worker that dies this soon after starting without claiming any attempt, several times in a row, means the
runner cannot work (the agent does not import, the store does not answer). Deaths during attempts are the
agents' faults, recovered one by one, and do not count."""
CRASH_LOOP_LIMIT = 5
FORCED_RELEASE_SECONDS = 1.0
"""How long a runner stopped at once (a second signal) tries to release the killed workers' attempts."""


@dataclass
class InFlight:
    """An attempt a worker holds, as its ``claimed`` event told."""

    rollout_id: str
    attempt_id: str
    deadline: float | None
    """When the supervisor kills the worker over it: the attempt's timeout plus ``kill_after``."""
    hung: bool = False
    """The worker said this attempt's sync agent overran its timeout (and exited over it)."""


@dataclass
class Slot:
    """One worker position; its process is replaced when it dies."""

    index: int
    config: WorkerConfig
    process: BaseProcess | None = None
    conn: Connection | None = None
    started_at: float = 0.0
    claims: int = 0
    attempts: dict[str, InFlight] = field(default_factory=dict)
    quick_deaths: int = 0
    finished: bool = False


@dataclass
class RunSummary:
    statuses: Counter[str] = field(default_factory=Counter)
    """Attempts by outcome: ``succeeded``, ``failed``, ``timeout``."""
    worker_restarts: int = 0
    forced: bool = False
    """Stopped by a second SIGINT/SIGTERM: the workers were killed rather than stopped."""

    @property
    def succeeded(self) -> int:
        return self.statuses["succeeded"]

    @property
    def failed(self) -> int:
        return self.statuses["failed"]

    @property
    def timeout(self) -> int:
        return self.statuses["timeout"]


class Runner:
    """Runs ``workers`` worker processes of ``agent`` against ``store_url`` until stopped (or idle)."""

    def __init__(
        self,
        agent: str,
        store_url: str,
        *,
        workers: int = 1,
        concurrency: int = 1,
        token: str | None = None,
        default_timeout: float | None = None,
        kill_after: float = 10.0,
        heartbeat_interval: float = 5.0,
        poll_timeout: float = 5.0,
        grace: float = 30.0,
        idle_exit: float | None = None,
        progress: bool | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.store_url = store_target(store_url)  # InvalidRequestError for a server address without its scheme
        self.token = token
        self.kill_after = kill_after
        self.grace = grace
        self.progress = ProgressView(enabled=progress)
        self.summary = RunSummary()
        self._stopping = False
        self._now = asyncio.Event()
        """Set by a second :meth:`stop`: stop at once."""
        self._context = multiprocessing.get_context("spawn")  # no inherited event loops, locks or connections
        prefix = f"{socket.gethostname()}:{os.getpid()}"
        base = WorkerConfig(
            agent=agent,
            store_url=self.store_url,
            worker_id="",
            token=token,
            default_timeout=default_timeout,
            heartbeat_interval=heartbeat_interval,
            poll_timeout=poll_timeout,
            concurrency=concurrency,
            grace=grace,
            idle_exit=idle_exit,
            parent_pid=os.getpid(),
            log_level=logging.getLogger().getEffectiveLevel(),
            cwd_on_path=os.getcwd(),
        )
        self.slots = [Slot(i, dataclasses.replace(base, worker_id=f"{prefix}:{i}")) for i in range(workers)]

    def stop(self) -> None:
        """Stop gracefully: workers finish (or release) their attempts and exit. Called again (a second
        SIGINT/SIGTERM), stop now: the workers are killed at once and their attempts released as far as the
        store answers within a second."""
        if self._stopping:
            if not self._now.is_set():
                logger.warning("stopping now: killing the workers")
                self.summary.forced = True
                self._now.set()
                for slot in self.slots:
                    if slot.process is not None and slot.process.is_alive():
                        slot.process.kill()
            return
        self._stopping = True
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive() and slot.process.pid:
                os.kill(slot.process.pid, signal.SIGTERM)

    async def run(self) -> RunSummary:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
        store = await connect(self.store_url, token=self.token)
        try:
            with self.progress:
                for slot in self.slots:
                    self._spawn(slot)
                supervising = asyncio.ensure_future(self._supervise(store))
                now = asyncio.ensure_future(self._now.wait())
                try:
                    await asyncio.wait({supervising, now}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    now.cancel()
                    if not supervising.done():  # stopped now (or this task was cancelled)
                        supervising.cancel()
                        await asyncio.gather(supervising, return_exceptions=True)
                if supervising.cancelled():
                    await self._kill_all(store, within=FORCED_RELEASE_SECONDS)
                else:
                    supervising.result()
        except BaseException:
            await self._kill_all(store)  # the attempts in flight are released, not left to the watchdog
            raise
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await store.close()
        return self.summary

    async def _supervise(self, store: LightningStore) -> None:
        stop_deadline: float | None = None
        while any(not slot.finished for slot in self.slots):
            for slot in self.slots:
                await self._tend(slot, store)
            if self._stopping:
                stop_deadline = stop_deadline or time.monotonic() + self.grace + 10.0
                if time.monotonic() > stop_deadline:
                    await self._kill_all(store)
            await asyncio.sleep(0.05)

    def _spawn(self, slot: Slot) -> None:
        parent, child = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=worker_main, args=(slot.config, child), name=f"worker-{slot.index}", daemon=False
        )
        process.start()
        child.close()
        slot.process, slot.conn, slot.started_at, slot.claims = process, parent, time.monotonic(), 0
        slot.attempts = {}

    async def _tend(self, slot: Slot, store: LightningStore) -> None:
        if slot.finished or slot.process is None or slot.conn is None:
            return
        self._drain(slot)
        if slot.process.is_alive():
            now = time.monotonic()
            if any(a.deadline is not None and now > a.deadline for a in slot.attempts.values()):
                logger.warning("worker %s overran an attempt's timeout; killing it", slot.config.worker_id)
                slot.process.kill()
                slot.process.join()
                self._drain(slot)
                await self._settle_hung(store, slot)
                self._restart(slot)
            return
        slot.process.join()
        self._drain(slot)
        code = slot.process.exitcode
        if slot.attempts:
            logger.warning("worker %s died (exit %s) during an attempt", slot.config.worker_id, code)
            if self._stopping:
                await self._release(store, slot)
            elif code == EXIT_HUNG:
                await self._settle_hung(store, slot)
            else:
                for attempt in list(slot.attempts.values()):
                    await self._settle(store, slot, attempt, "failed")
        if code == 0:
            slot.finished = True  # stopped, or idle long enough (idle_exit)
            return
        self._restart(slot)

    def _restart(self, slot: Slot) -> None:
        """Start a fresh worker in the slot of one that ended; a stopping runner starts none (a worker spawned
        after :meth:`stop` would never be told to stop)."""
        if self._stopping:
            slot.finished = True
            return
        quick = slot.claims == 0 and time.monotonic() - slot.started_at < CRASH_LOOP_SECONDS
        slot.quick_deaths = slot.quick_deaths + 1 if quick else 0
        if slot.quick_deaths >= CRASH_LOOP_LIMIT:
            raise RuntimeError(
                f"worker {slot.config.worker_id} died {CRASH_LOOP_LIMIT} times within {CRASH_LOOP_SECONDS} s of "
                "starting without claiming a rollout; see its log (can the agent be imported? does the store answer?)"
            )
        self.summary.worker_restarts += 1
        self._spawn(slot)

    def _drain(self, slot: Slot) -> None:
        assert slot.conn is not None
        try:
            while slot.conn.poll():
                self._on_event(slot, slot.conn.recv())
        except (EOFError, OSError):
            pass

    def _on_event(self, slot: Slot, event: dict[str, Any]) -> None:
        if event["event"] == "claimed":
            timeout, now = event.get("timeout"), time.monotonic()
            slot.attempts[event["attempt_id"]] = InFlight(
                event["rollout_id"],
                event["attempt_id"],
                deadline=None if timeout is None else now + timeout + self.kill_after,
            )
            slot.claims += 1
            self.progress.claimed()
        elif event["event"] == "hung" and event["attempt_id"] in slot.attempts:
            slot.attempts[event["attempt_id"]].hung = True
        elif event["event"] == "finished":
            slot.attempts.pop(event["attempt_id"], None)
            self._count(event["status"], event["rollout_id"], slot, event.get("reward"))
        elif event["event"] == "released":  # the worker gave it back (or tried to) as it stopped
            slot.attempts.pop(event["attempt_id"], None)
        elif event["event"] == "unloadable":  # no worker will ever run it: stop everything, say why once
            raise AgentNotLoadable(event["reason"])

    def _count(self, status: str, rollout_id: str, slot: Slot, reward: float | None = None) -> None:
        self.summary.statuses[outcome(status)] += 1
        self.progress.finished(outcome(status), rollout_id=rollout_id, worker_id=slot.config.worker_id, reward=reward)

    async def _settle_hung(self, store: LightningStore, slot: Slot) -> None:
        """A hung worker is gone: the attempts it hung on timed out, the others are released (not their fault).
        Where the culprit is unknown (the worker's word was lost), every attempt counts as timed out."""
        now = time.monotonic()
        culprits = [a for a in slot.attempts.values() if a.hung or (a.deadline is not None and now > a.deadline)]
        for attempt in culprits or list(slot.attempts.values()):
            await self._settle(store, slot, attempt, "timeout")
        await self._release(store, slot, reason="worker ended over another attempt")

    async def _settle(self, store: LightningStore, slot: Slot, attempt: InFlight, status: AttemptStatus) -> None:
        """Mark a dead worker's attempt with ``status`` unless the store already moved on."""
        slot.attempts.pop(attempt.attempt_id, None)
        try:
            await end_if_current(store, attempt.rollout_id, attempt.attempt_id, status, {"worker": "lost"})
        except UNREACHABLE as error:
            reason = type(error).__name__
            logger.warning("could not mark %s %s (%s); the watchdog will", attempt.attempt_id, status, reason)
        self._count(status, attempt.rollout_id, slot)

    async def _release(self, store: LightningStore, slot: Slot, reason: str = "runner stopped") -> None:
        ids = [(attempt.rollout_id, attempt.attempt_id) for attempt in slot.attempts.values()]
        slot.attempts = {}
        await release_all(store, ids, reason)

    async def _kill_all(self, store: LightningStore, *, within: float = RELEASE_SECONDS) -> None:
        """Kill every worker and release the attempts they held, for at most ``within`` seconds."""
        ids: list[tuple[str, str]] = []
        for slot in self.slots:
            if slot.process is not None and (slot.process.is_alive() or slot.attempts):
                slot.process.kill()
                slot.process.join()
                if slot.conn is not None:
                    self._drain(slot)
                ids += [(attempt.rollout_id, attempt.attempt_id) for attempt in slot.attempts.values()]
                slot.attempts = {}
            slot.finished = True
        await release_all(store, ids, "runner stopped", within=within)
