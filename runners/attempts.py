"""Ending an attempt from the runner's side without overruling the store.

The watchdog may have timed an attempt out, or a newer attempt may exist, by the time a worker (or the
supervisor, for a dead worker) reports; then the store's verdict stands. Every report is a conditional update
(``if_current``) that the store checks and applies atomically: one at a time through :func:`end_if_current`, or
many in one request through :class:`EndBatcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from lightning_store.contract import UNSET, LightningStore
from lightning_store.errors import ConflictError, InvalidRequestError, NotFoundError
from lightning_store.models import Attempt, AttemptEnd, AttemptStatus, EndedAttemptStatus
from lightning_store.spans import Span
from runners.resilience import UNREACHABLE, persist

logger = logging.getLogger(__name__)


def outcome(status: str) -> str:
    """How the runner counts an attempt: ``succeeded``, ``timeout`` or ``failed``."""
    return status if status in ("succeeded", "timeout") else "failed"


def tally(counts: Counter[str]) -> dict[str, int]:
    return {name: counts[name] for name in ("succeeded", "failed", "timeout")}


async def end_if_current(
    store: LightningStore,
    rollout_id: str,
    attempt_id: str,
    status: AttemptStatus,
    metadata: dict[str, Any] | None = None,
) -> bool:
    """Set the attempt's final ``status`` (and ``metadata``) while it is still its rollout's latest, active
    attempt; False, and nothing written, otherwise."""
    try:
        await store.update_attempt(
            rollout_id, attempt_id, status=status, metadata=UNSET if metadata is None else metadata, if_current=True
        )
    except ConflictError:
        return False
    return True


async def release(store: LightningStore, rollout_id: str, attempt_id: str, reason: str) -> bool:
    """Give an attempt that was not allowed to finish back to the queue: the attempt is marked failed with the
    reason in its metadata and the rollout is requeued, whatever its retry policy (the agent was not at fault),
    in one transaction (``AttemptEnd.requeue``: a waiter never sees the rollout failed on its way back). Does
    nothing (False) when the attempt is no longer the rollout's active one, or the store cannot be reached."""
    try:
        [ended] = await store.end_attempts([_released(rollout_id, attempt_id, reason)])
    except NotFoundError:
        return False  # deleted meanwhile: nothing to give back
    except UNREACHABLE as error:
        logger.warning("could not release %s (%s); the watchdog will recover it", attempt_id, type(error).__name__)
        return False
    return ended is not None


RELEASE_SECONDS = 2.0
"""How long a stopping worker or runner tries to give its attempts back. A store that has not answered by then
(its server is gone) leaves them to the watchdog, rather than holding the stop up for HttpStore's retries."""
RELEASE_BATCH = 1000
"""The most attempts released in one request (``end_attempts`` takes at most 1000 ends)."""


async def release_all(
    store: LightningStore, attempts: Iterable[tuple[str, str]], reason: str, *, within: float = RELEASE_SECONDS
) -> None:
    """:func:`release` each ``(rollout_id, attempt_id)``, a thousand to a request, for at most ``within``
    seconds in all."""
    ends = [_released(rollout_id, attempt_id, reason) for rollout_id, attempt_id in attempts]
    if not ends:
        return
    batches = [ends[i : i + RELEASE_BATCH] for i in range(0, len(ends), RELEASE_BATCH)]
    pending = [asyncio.ensure_future(_release_batch(store, batch)) for batch in batches]
    _, late = await asyncio.wait(pending, timeout=within)
    for task in late:
        task.cancel()  # safe: each request is one transaction, applied whole or not at all
    for result in await asyncio.gather(*pending, return_exceptions=True):
        if isinstance(result, Exception):
            logger.warning("could not release attempts: %s: %s", type(result).__name__, result)
    if late:
        logger.warning(
            "could not release %d attempts within %.1f s (store unreachable); the watchdog will recover them",
            sum(len(batch) for batch, task in zip(batches, pending, strict=True) if task in late),
            within,
        )


async def _release_batch(store: LightningStore, ends: list[AttemptEnd]) -> None:
    try:
        await store.end_attempts(ends)
    except NotFoundError:  # one rollout deleted meanwhile refuses the batch: it must not keep the others out
        for end in ends:
            with contextlib.suppress(NotFoundError):
                await store.end_attempts([end])


def _released(rollout_id: str, attempt_id: str, reason: str) -> AttemptEnd:
    return AttemptEnd(
        rollout_id=rollout_id, attempt_id=attempt_id, status="failed", metadata={"released": reason}, requeue=True
    )


class EndBatcher:
    """Reports a worker's attempt ends in batches: every end that arrives while a request is in flight goes out
    together in the next one (``end_attempts``, one transaction). There is no waiting window, so a lone end
    goes out at once; a worker with many attempts in flight ends many at about the same time, and one request
    for them all costs the store a fraction of one each. A store that cannot be reached is retried (``persist``).
    """

    MAX_BATCH = 256

    def __init__(self, store: LightningStore) -> None:
        self.store = store
        self._queued: list[tuple[AttemptEnd, asyncio.Future[bool]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def end(
        self, rollout_id: str, attempt_id: str, status: EndedAttemptStatus, spans: list[Span] | None = None
    ) -> bool:
        """Report the attempt's final status, with its last ``spans`` (stored with it, see
        ``LightningStore.end_attempts``): True once the store took it, False when the attempt was no longer
        current (no status written; the store's verdict stands). Raises what the store raised for its batch."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        end = AttemptEnd(rollout_id=rollout_id, attempt_id=attempt_id, status=status, spans=spans or None)
        self._queued.append((end, future))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send())
        return await future

    async def _send(self) -> None:
        batch: list[tuple[AttemptEnd, asyncio.Future[bool]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued[: self.MAX_BATCH], self._queued[self.MAX_BATCH :]
                try:
                    ended = await self._report([end for end, _ in batch])
                except Exception as error:
                    _settle(batch, error)
                    continue
                for (_, future), attempt in zip(batch, ended, strict=True):
                    if not future.done():
                        future.set_result(attempt is not None)
        except BaseException as error:  # cancelled: nobody may wait forever
            _settle([*batch, *self._queued], error)
            self._queued = []
            raise
        finally:
            self._sender = None

    async def _report(self, ends: list[AttemptEnd]) -> list[Attempt | None]:
        try:
            return await persist(functools.partial(self.store.end_attempts, ends), what="report status")
        except InvalidRequestError as error:
            if not any(end.spans for end in ends):
                raise
            # A span the store refuses must not cost the batch its statuses, nor the attempt its other spans
            # (its reward among them): the spans go apart, then the statuses.
            logger.warning("the store refused the spans sent with %d attempt ends (%s); sent apart", len(ends), error)
            for end in ends:
                await self._write_apart(end.spans or [])
            bare = [end.model_copy(update={"spans": None}) for end in ends]
            return await persist(functools.partial(self.store.end_attempts, bare), what="report status")

    async def _write_apart(self, spans: list[Span]) -> None:
        """``spans`` in one write, or else one by one, leaving out (and logging) only those the store refuses."""
        if not spans:
            return
        try:
            await self._write_spans(spans)
            return
        except (InvalidRequestError, NotFoundError):
            pass
        for span in spans:
            try:
                await self._write_spans([span])
            except (InvalidRequestError, NotFoundError) as refused:
                logger.warning("the store refused a span of %s: %s", span.attempt_id, refused)

    async def _write_spans(self, spans: list[Span]) -> None:
        await persist(functools.partial(self.store.add_many_spans, spans, allocate_sequence_ids=True), what="spans")


def _settle(entries: list[tuple[AttemptEnd, asyncio.Future[bool]]], error: BaseException) -> None:
    for _, future in entries:
        if not future.done():
            future.set_exception(error if isinstance(error, Exception) else RuntimeError("status report cancelled"))
