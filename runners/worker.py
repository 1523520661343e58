"""A worker: dequeue rollouts, run the agent on each under the tracer with a hard timeout, report the attempts.

A worker runs up to ``concurrency`` attempts at once (default 1): async agents as tasks of its event loop,
sync agents in a thread pool of that size. Several at once is what an I/O-bound agent wants: its LLM calls
overlap, so the policy server can decode them in one batch, and a claim, a span write or a worker heartbeat
serves many attempts. Each attempt heartbeats while its agent runs and is stopped as soon as the store says it is
no longer its own (the watchdog timed it out, or a newer attempt exists), so that a rollout never runs twice at
the same time. Spans are flushed before an attempt's status is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lightning_store.contract import LightningStore
from lightning_store.errors import ConflictError
from lightning_store.models import AttemptedRollout, Claim, EndedAttemptStatus
from lightning_store.resources import ResourcesUpdate
from lightning_store.spans import Span
from runners.agent import AgentSignatureError, RolloutAgent
from runners.attempts import RELEASE_SECONDS, EndBatcher, outcome, tally
from runners.current import attempt_resources
from runners.endpoint import MissingLLMError, agent_llm, bind_resources, missing_llm_message
from runners.resilience import UNREACHABLE, persist
from tracers import Tracer, emit_exception, emit_reward

logger = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]

EXIT_HUNG = 75
"""Exit status of a worker process whose sync agent overran its timeout in a thread that cannot be stopped."""
_LAST_HEARTBEAT_FAILED: tuple[type[BaseException], ...] = (*UNREACHABLE, TimeoutError)


class AgentHung(Exception):
    """A sync agent overran its timeout; its thread cannot be stopped, so the worker process must end."""

    def __init__(self, attempt_id: str, message: str) -> None:
        super().__init__(message)
        self.attempt_id = attempt_id


class AttemptLost(Exception):
    """The store no longer counts this attempt as running (timed out by the watchdog, or superseded)."""


@dataclass
class WorkerStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    started_at: float = field(default_factory=time.time)

    def as_heartbeat(self, in_flight: Collection[AttemptedRollout]) -> dict[str, Any]:
        return {
            **tally(self.outcomes),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "uptime": round(time.time() - self.started_at, 1),
            "current_rollout_id": next((c.rollout_id for c in in_flight), None),
            "in_flight": len(in_flight),
        }


class Worker:
    """Runs attempts of ``agent`` from ``store`` until ``stop`` is set (after the attempts in flight).

    ``server_url`` is the ``store serve`` whose LLM proxy the agent's LLM goes through (None: call the LLM in
    the resources directly). ``default_timeout`` applies to rollouts whose config sets no ``timeout_seconds``.
    ``concurrency`` is how many attempts run at once. ``report`` receives ``claimed`` and ``finished`` events
    (the runner's supervisor listens to them).
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
        concurrency: int = 1,
        report: Report | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.store = store
        self.agent = agent
        self.worker_id = worker_id
        self.server_url = server_url
        self.token = token
        self.default_timeout = default_timeout
        self.heartbeat_interval = heartbeat_interval
        self.poll_timeout = poll_timeout
        self.concurrency = concurrency
        self.report: Report = report or (lambda event: None)
        self.stats = WorkerStats()
        self.in_flight: dict[str, AttemptedRollout] = {}
        """The attempts running now, by attempt id."""
        """What the agent returned, by attempt id, until the attempt's ``finished`` event carries it."""
        self._threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="agent")
        self._ends = EndBatcher(store)
        self._last_worker_heartbeat = -float("inf")

    async def run(self, stop: asyncio.Event, *, idle_exit: float | None = None) -> None:
        """Dequeue and run attempts until ``stop`` is set, or the queue stayed empty for ``idle_exit`` s; then
        wait for the attempts in flight. :class:`AgentHung` ends it at once."""
        tracer = Tracer(self.store)
        running: set[asyncio.Task[EndedAttemptStatus]] = set()
        # Idle time counts only while nothing runs: from the start, then from the end of the last attempt (an
        # attempt longer than ``idle_exit`` must not end the worker with rollouts still queued).
        idle = _IdleClock()
        try:
            while not stop.is_set():
                done = {task for task in running if task.done()}
                running -= done
                _reraise(done)  # before claiming more: a hung agent ends the worker at once
                if len(running) >= self.concurrency:
                    done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    _reraise(done)
                    continue
                if not running and idle_exit is not None and idle.seconds() > idle_exit:
                    break
                claimed = await self._claim(self.concurrency - len(running))
                if not claimed:
                    await self._idle_heartbeat()
                for one in claimed:
                    self._hold(one.rollout)
                    task = asyncio.create_task(self.run_attempt(one.rollout, tracer, one.resources))
                    task.add_done_callback(idle.restart)
                    running.add(task)
            if running:
                _reraise((await asyncio.wait(running))[0])
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await tracer.shutdown()
            self._threads.shutdown(wait=False)
        final = functools.partial(self._worker_heartbeat, due_only=False)
        if not stop.is_set():
            await persist(final, what="worker heartbeat")
            return
        try:  # stopping: one try, bounded; a store that is gone must not hold the stop up
            await asyncio.wait_for(final(), RELEASE_SECONDS)
        except _LAST_HEARTBEAT_FAILED as error:
            logger.warning("could not send the last worker heartbeat (%s)", type(error).__name__)

    async def _claim(self, limit: int) -> Sequence[Claim]:
        """Claim up to ``limit`` rollouts, each with its resources (one request)."""
        try:
            return await self.store.claim_rollouts(limit=limit, worker_id=self.worker_id, timeout=self.poll_timeout)
        except UNREACHABLE as error:
            where = f"the store at {self.server_url}" if self.server_url else "the database"
            hint = " (is `store serve` running there?)" if self.server_url else ""
            logger.warning("dequeue failed: cannot reach %s (%s); retrying%s", where, type(error).__name__, hint)
            await asyncio.sleep(1.0)
            return []

    async def run_attempt(
        self, claimed: AttemptedRollout, tracer: Tracer, resources: ResourcesUpdate | None
    ) -> EndedAttemptStatus:
        """Run one claimed attempt to its end and report its status (which is also returned). ``resources``:
        the snapshot it runs with, as its claim carried it (None: the store has none)."""
        rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
        timeout = self._timeout(claimed)
        self._hold(claimed)
        status: EndedAttemptStatus = "failed"
        reward: float | None = None
        try:
            # No "running" write of its own: the attempt's first span or heartbeat marks it running (the store
            # revives a preparing attempt on either, as Agent Lightning's does), one write fewer per rollout.
            with tracer.attempt(rollout_id, attempt_id):
                status, hung, reward = await self._run_agent(claimed, timeout, resources)
            if hung:
                # The agent's thread cannot be stopped: the process must end before the attempt is reported,
                # or the rollout could run again while it still runs. The supervisor reports the timeout.
                if not await tracer.flush():
                    logger.warning("spans of %s were not all written before the flush timed out", attempt_id)
                raise AgentHung(attempt_id, f"agent of {rollout_id} overran its {timeout} s timeout in a thread")
            # The spans not written yet go with the status: one request (and transaction) instead of two.
            last_spans, flushed = await tracer.last_spans(attempt_id)
            if not flushed:
                logger.warning("spans of %s were not all written before the flush timed out", attempt_id)
            if lost := tracer.lost_spans(attempt_id):
                logger.warning("%d spans of %s could not be written", lost, attempt_id)
            await self._finish(rollout_id, attempt_id, status, last_spans)
        except AttemptLost:
            status, reward = "timeout", None  # not ours any more: its reward does not count
            self.stats.outcomes[status] += 1
            logger.warning("attempt %s of %s is no longer ours; stopped it", attempt_id, rollout_id)
        finally:
            del self.in_flight[attempt_id]
        finished = {"event": "finished", "rollout_id": rollout_id, "attempt_id": attempt_id, "status": status}
        self.report(finished | {"reward": reward})
        await persist(lambda: self._worker_heartbeat(due_only=True), what="worker heartbeat")
        return status

    def _hold(self, claimed: AttemptedRollout) -> None:
        """Count a claimed attempt as this worker's, and tell the runner, from the moment the claim answered.
        Why not when it starts: a worker that ends (hung, or stopped) between a claim and the start of its
        attempts must still give them back, and only attempts it holds are given back."""
        attempt_id = claimed.attempt.attempt_id
        if attempt_id in self.in_flight:
            return
        self.in_flight[attempt_id] = claimed
        event = {"rollout_id": claimed.rollout_id, "attempt_id": attempt_id, "timeout": self._timeout(claimed)}
        self.report({"event": "claimed"} | event)

    def _timeout(self, claimed: AttemptedRollout) -> float | None:
        return claimed.config.timeout_seconds or self.default_timeout

    async def _run_agent(
        self, claimed: AttemptedRollout, timeout: float | None, update: ResourcesUpdate | None
    ) -> tuple[EndedAttemptStatus, bool, float | None]:
        """Run the agent (and its heartbeats): the attempt status, whether a sync agent's thread hung, and the
        reward it returned (None when it returned none or did not succeed)."""
        resources = self._resources(claimed, update)
        try:
            args, kwargs = self._arguments(claimed, resources)
        except AgentSignatureError as error:  # the agent cannot be called for this rollout: its attempt fails
            emit_exception(error)
            logger.warning("cannot run the agent on %s: %s", claimed.rollout_id, error)
            return "failed", False, None
        with attempt_resources(resources):  # runners.current.prompt() reads them; the task or thread keeps them
            if self.agent.is_async:
                work: asyncio.Future[Any] = asyncio.ensure_future(self.agent(*args, **kwargs))
            else:
                context = contextvars.copy_context()
                call = functools.partial(context.run, self.agent, *args, **kwargs)
                work = asyncio.get_running_loop().run_in_executor(self._threads, call)
        watcher = asyncio.ensure_future(self._heartbeat(claimed))
        try:
            done, _ = await asyncio.wait({work, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                watcher.result()  # raises AttemptLost
            if work not in done:
                work.cancel()
                emit_exception(TimeoutError(f"agent ran over its {timeout} s timeout"))
                return "timeout", not self.agent.is_async, None
            result = work.result()
        except Exception as error:
            if isinstance(error, AttemptLost):
                raise
            emit_exception(error)
            logger.info("agent failed on %s: %s: %s", claimed.rollout_id, type(error).__name__, error)
            return "failed", False, None
        finally:
            watcher.cancel()
            work.cancel()  # a no-op once it is done; stops an async agent when the attempt is lost or cancelled
        if isinstance(result, bool) or not (result is None or isinstance(result, int | float)):
            emit_exception(TypeError(f"an agent returns a float reward or None, not {type(result).__name__}"))
            return "failed", False, None
        if result is not None:
            emit_reward(float(result))
        return "succeeded", False, None if result is None else float(result)

    def _arguments(
        self, claimed: AttemptedRollout, resources: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The agent's arguments for this attempt; raises :class:`AgentSignatureError` when they cannot be filled
        (:class:`MissingLLMError`: it requires an ``llm`` that neither the resources nor a server provide)."""
        llm = agent_llm(
            resources,
            rollout_id=claimed.rollout_id,
            attempt_id=claimed.attempt.attempt_id,
            server_url=self.server_url,
            token=self.token,
        )
        if llm is None and self.agent.requires("llm"):
            raise MissingLLMError(missing_llm_message(claimed.rollout_id))
        return self.agent.arguments(claimed.input, llm=llm, resources=resources, rollout=claimed)

    def _resources(self, claimed: AttemptedRollout, update: ResourcesUpdate | None) -> dict[str, Any]:
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

    async def _idle_heartbeat(self) -> None:
        """A worker waiting for work says it is alive too (at most once per heartbeat interval), so that one whose
        process died can be told from one with nothing to do: the dashboard marks a worker silent when its last
        heartbeat is old. A store out of reach is said by the claim's own warning."""
        with contextlib.suppress(*UNREACHABLE):
            await self._worker_heartbeat(due_only=True)

    async def _worker_heartbeat(self, *, due_only: bool) -> None:
        """Send the worker's stats; with ``due_only``, at most once per heartbeat interval (a request per
        attempt would cost throughput for a display that refreshes every few seconds)."""
        now = time.monotonic()
        if due_only and now - self._last_worker_heartbeat < self.heartbeat_interval:
            return
        self._last_worker_heartbeat = now
        stats = self.stats.as_heartbeat(list(self.in_flight.values()))
        await self.store.update_worker(self.worker_id, heartbeat_stats=stats)

    async def _finish(self, rollout_id: str, attempt_id: str, status: EndedAttemptStatus, spans: list[Span]) -> None:
        # Batched with the other attempts' ends (one request for all that end while one is in flight).
        if not await self._ends.end(rollout_id, attempt_id, status, spans):
            raise AttemptLost(attempt_id)  # the watchdog decided first; its status stands
        self.stats.outcomes[outcome(status)] += 1


class _IdleClock:
    """Seconds since the worker started or an attempt last ended, whichever is later."""

    def __init__(self) -> None:
        self.since = time.monotonic()

    def restart(self, _: object = None) -> None:
        self.since = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.since


def _reraise(done: Iterable[asyncio.Task[EndedAttemptStatus]]) -> None:
    """Re-raise what escaped a finished attempt (:class:`AgentHung`, a store that stayed unreachable): it ends
    the worker, as it would have with one attempt at a time."""
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            task.result()
