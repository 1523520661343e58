"""Writes the LLM proxy's call records in batches, after the answers have gone out.

Each proxied call needs a span sequence id, a span and an :class:`~lightning_store.llm_calls.LlmCall`: two
write transactions, and on SQLite every write waits for the one before it. With many attempts calling the LLM
at once that made the proxy the store's busiest writer. The recorder queues the records and one task writes
whatever has queued up, in one write transaction per batch: the spans (allocating their sequence ids) and the LLM
calls (the SQL store's ``record_llm_calls``; another store gets two writes, spans then calls).

A batch gathers for ``window`` seconds before it is written (ADR 0017). Without a window, batches grow only when
writes are the bottleneck: a server with a few calls in flight wrote each record in a transaction of its own,
about half of what a proxied call cost it. An attempt's end cuts the window short (below), as does a batch of
:data:`MAX_BATCH` records; ``window=0`` writes each batch at once.

An attempt's records must be in the store before its final status is, or a trainer that wakes on the status could
read the rollout without its LLM calls: :meth:`settled` writes an attempt's queued records at once and waits for
them, and the server calls it before it applies an attempt status. It covers the calls this server process
proxied: with several server processes, a call proxied by another one may still land a moment after the status,
which is why ``store serve`` gathers with a window only when it runs one process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_store.contract import LightningStore
from lightning_store.errors import DatabaseUnavailableError, NotFoundError
from lightning_store.llm_calls import LlmCall, numbered_calls
from lightning_store.spans import Span

logger = logging.getLogger(__name__)
MAX_BATCH = 256
"""Records that end a window early: a batch is one transaction, and the records wait in memory until it commits."""


@dataclass(frozen=True)
class CallRecord:
    """One proxied call, complete but for its span sequence id: ``build(sequence_id)`` gives the span and,
    unless the call failed, its LLM-call record."""

    rollout_id: str
    attempt_id: str
    build: Callable[[int], tuple[Span, LlmCall | None]]


class CallRecorder:
    """Queues :class:`CallRecord` values and writes them to ``store`` in batches (see the module docstring)."""

    def __init__(self, store: LightningStore, *, window: float = 0.0) -> None:
        self.store = store
        self.window = window
        """Seconds a batch gathers records before it is written."""
        self._queue: list[CallRecord] = []
        self._hurried = False
        self._gathering: asyncio.Future[None] | None = None
        self._unwritten: Counter[str] = Counter()
        self._written = asyncio.Condition()
        self._writer: asyncio.Task[None] | None = None

    def add(self, record: CallRecord) -> None:
        """Queue ``record``; it is written soon, without the caller waiting for it."""
        self._queue.append(record)
        self._unwritten[record.attempt_id] += 1
        if len(self._queue) >= MAX_BATCH:
            self._hurry()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())

    async def settled(self, attempt_id: str) -> None:
        """Return once no record of ``attempt_id`` is waiting to be written (written, or failed and logged); its
        queued records are written without waiting for the window to close."""
        if self._unwritten[attempt_id]:
            self._hurry()
        async with self._written:
            await self._written.wait_for(lambda: self._unwritten[attempt_id] == 0)

    async def close(self) -> None:
        """Write what is queued, at once."""
        self._hurry()
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_queued(self) -> None:
        while self._queue:
            await self._gather()
            batch, self._queue, self._hurried = self._queue, [], False
            try:
                await self._write(batch)
            except NotFoundError:
                # An attempt of the batch is gone (deleted with its rollout): the others still land.
                for record in batch:
                    await self._write_alone(record)
            except DatabaseUnavailableError as exc:
                logger.warning("could not record %d LLM calls: %s", len(batch), exc)  # no traceback for an outage
            except Exception:
                logger.exception("could not record %d LLM calls", len(batch))
            finally:
                async with self._written:
                    self._unwritten.subtract(record.attempt_id for record in batch)
                    self._unwritten += Counter()  # drops the attempts at zero
                    self._written.notify_all()

    async def _gather(self) -> None:
        """Wait for the window to close, or for :meth:`_hurry`."""
        if self.window <= 0 or self._hurried:
            return
        loop = asyncio.get_running_loop()
        self._gathering = loop.create_future()
        timer = loop.call_later(self.window, _close, self._gathering)
        try:
            await self._gathering
        finally:
            timer.cancel()
            self._gathering = None

    def _hurry(self) -> None:
        """Write the queued records without waiting for the window to close."""
        self._hurried = True
        if self._gathering is not None:
            _close(self._gathering)

    async def _write(self, batch: Sequence[CallRecord]) -> None:
        built = [record.build(0) for record in batch]
        record_llm_calls = getattr(self.store, "record_llm_calls", None)
        if record_llm_calls is not None:  # the SQL store: spans and calls in one transaction
            await record_llm_calls(built)
            return
        added = await self.store.add_many_spans([span for span, _ in built], allocate_sequence_ids=True)
        if calls := numbered_calls(built, added):
            await self.store.add_llm_calls(calls)

    async def _write_alone(self, record: CallRecord) -> None:
        try:
            await self._write([record])
        except Exception:
            # The agent already has its answer; a failed record is logged, never raised into a request.
            ids = record.rollout_id, record.attempt_id
            logger.exception("could not record the LLM call of rollout %s attempt %s", *ids)


def _close(window: asyncio.Future[None]) -> None:
    if not window.done():
        window.set_result(None)
