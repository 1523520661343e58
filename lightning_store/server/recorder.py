"""Writes the LLM proxy's call records in batches, after the answers have gone out.

Each proxied call needs a span sequence id, a span and an :class:`~lightning_store.llm_calls.LlmCall`: two
write transactions, and on SQLite every write waits for the one before it. With many attempts calling the LLM
at once that made the proxy the store's busiest writer. The recorder queues the records and one task writes
whatever has queued up, in one write transaction per batch: the spans (allocating their sequence ids) and the LLM
calls (the SQL store's ``record_llm_calls``; another store gets two writes, spans then calls). There is no batching
window: the first record is written at once, and the records that arrive while a batch is being
written form the next one, so batches grow only when writes are the bottleneck.

An attempt's records must be in the store before its final status is, or a trainer that wakes on the status could
read the rollout without its LLM calls: :meth:`settled` waits for an attempt's queued records, and the server
calls it before it applies an attempt status. (It covers the calls this server process proxied; with several
server processes, a call proxied by another one may still land a moment after the status.)
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


@dataclass(frozen=True)
class CallRecord:
    """One proxied call, complete but for its span sequence id: ``build(sequence_id)`` gives the span and,
    unless the call failed, its LLM-call record."""

    rollout_id: str
    attempt_id: str
    build: Callable[[int], tuple[Span, LlmCall | None]]


class CallRecorder:
    """Queues :class:`CallRecord` values and writes them to ``store`` in batches (see the module docstring)."""

    def __init__(self, store: LightningStore) -> None:
        self.store = store
        self._queue: list[CallRecord] = []
        self._unwritten: Counter[str] = Counter()
        self._written = asyncio.Condition()
        self._writer: asyncio.Task[None] | None = None

    def add(self, record: CallRecord) -> None:
        """Queue ``record``; it is written soon, without the caller waiting for it."""
        self._queue.append(record)
        self._unwritten[record.attempt_id] += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())

    async def settled(self, attempt_id: str) -> None:
        """Return once no record of ``attempt_id`` is waiting to be written (written, or failed and logged)."""
        async with self._written:
            await self._written.wait_for(lambda: self._unwritten[attempt_id] == 0)

    async def close(self) -> None:
        """Write what is queued."""
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
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
