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

Each record stands or falls alone: a batch that fails for any reason but an outage is written again one record
at a time, so one record the store refuses costs no other (and a record whose build raises, a bug, is logged
and dropped before the batch is written). :class:`RecordCounts` counts what was written, what of it is not
trainable, and what was lost, for ``/metrics``.

An outage loses nothing it outlasts: the agents have their answers and the records exist only here, so a batch
the database could not take is written again (after 0.1 s, then longer, up to 2 s apart) for ``patience``
seconds (a Postgres restart takes a second or two, a failover tens) before it counts as lost. The attempts'
ends wait for it, as above. Only :meth:`CallRecorder.close` (the server stopping) cuts the patience short: a
server stops within its bound, and what it could not write is logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, Metric

from lightning_store.contract import LightningStore
from lightning_store.errors import DatabaseUnavailableError, NotFoundError
from lightning_store.llm_calls import LlmCall, numbered_calls
from lightning_store.spans import Span

logger = logging.getLogger(__name__)
RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)
"""Seconds between the writes of a batch the database could not take; the last repeats."""
PATIENCE = 60.0
"""How long a batch is tried again while the database is unavailable before it counts as lost."""
MAX_BATCH = 256
"""Records that end a window early: a batch is one transaction, and the records wait in memory until it commits."""


@dataclass(frozen=True)
class CallRecord:
    """One proxied call, complete but for its span sequence id: ``build(sequence_id)`` gives the span and,
    unless the call failed, its LLM-call record."""

    rollout_id: str
    attempt_id: str
    build: Callable[[int], tuple[Span, LlmCall | None]]


@dataclass(eq=False)  # hashable by identity: the Prometheus registry keys its collectors by them
class RecordCounts:
    """What a server process's recorder did since it started; a Prometheus collector of itself."""

    recorded: int = 0
    """LLM-call records written (a call that got an answer)."""
    untrainable: int = 0
    """Of those, records whose answer could not be read as a transition (their ``error`` says why)."""
    lost: int = 0
    """Records of proxied calls (spans, with their LLM calls) that could not be written."""

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "lightning_store_llm_calls_recorded", "LLM-call records the proxy wrote", value=self.recorded
        )
        yield CounterMetricFamily(
            "lightning_store_llm_calls_untrainable",
            "LLM-call records written whose answer could not be read as a training transition",
            value=self.untrainable,
        )
        yield CounterMetricFamily(
            "lightning_store_llm_call_records_lost",
            "records of proxied calls that could not be written (logged with the reason)",
            value=self.lost,
        )


class CallRecorder:
    """Queues :class:`CallRecord` values and writes them to ``store`` in batches (see the module docstring)."""

    def __init__(
        self,
        store: LightningStore,
        *,
        window: float = 0.0,
        counts: RecordCounts | None = None,
        patience: float = PATIENCE,
    ) -> None:
        self.store = store
        self.window = window
        """Seconds a batch gathers records before it is written."""
        self.counts = counts if counts is not None else RecordCounts()
        self.patience = patience
        """Seconds a batch is tried again while the database is unavailable."""
        self._closing = asyncio.Event()
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
        """Write what is queued, at once; a batch waiting for the database gets one more try, not its patience."""
        self._closing.set()
        self._hurry()
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _write_queued(self) -> None:
        while self._queue:
            await self._gather()
            batch, self._queue, self._hurried = self._queue, [], False
            built = [one for one in map(self._built, batch) if one is not None]
            try:
                await self._write_through_outage(built)
            except DatabaseUnavailableError as exc:
                self.counts.lost += len(built)
                logger.warning("could not record %d LLM calls: %s", len(built), exc)  # no traceback for an outage
            except Exception:
                # A record of the batch was refused (its attempt deleted with its rollout, or a value the store
                # cannot hold): each is written alone, so that the others still land.
                for one in built:
                    await self._write_alone(one)
            finally:
                async with self._written:
                    self._unwritten.subtract(record.attempt_id for record in batch)
                    self._unwritten += Counter()  # drops the attempts at zero
                    self._written.notify_all()

    async def _write_through_outage(self, batch: Sequence[_Built]) -> None:
        """:meth:`_write`, tried again while the database is unavailable, for ``patience`` seconds or until
        :meth:`close`; then the outage is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.patience
        for tries in itertools.count():
            try:
                await self._write(batch)
            except DatabaseUnavailableError as exc:
                delay = RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)]
                if self._closing.is_set() or loop.time() + delay > deadline:
                    raise
                if tries == 0:
                    logger.warning("%d LLM-call records wait for the database: %s", len(batch), exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), delay)  # a stop cuts the wait short
            else:
                if tries:
                    logger.info("recorded %d LLM calls after %d tries", len(batch), tries + 1)
                return

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

    def _built(self, record: CallRecord) -> _Built | None:
        try:
            return _Built(record, *record.build(0))
        except Exception:  # a bug in a record's build: that record is lost, not its batch
            self.counts.lost += 1
            logger.exception("could not build the record of an LLM call of attempt %s", record.attempt_id)
            return None

    async def _write(self, batch: Sequence[_Built]) -> None:
        built = [(one.span, one.call) for one in batch]
        calls = [one.call for one in batch if one.call is not None]
        await self._store(built)
        self.counts.recorded += len(calls)
        self.counts.untrainable += sum(call.error is not None for call in calls)

    async def _store(self, built: list[tuple[Span, LlmCall | None]]) -> None:
        record_llm_calls = getattr(self.store, "record_llm_calls", None)
        if record_llm_calls is not None:  # the SQL store: spans and calls in one transaction
            await record_llm_calls(built)
            return
        added = await self.store.add_many_spans([span for span, _ in built], allocate_sequence_ids=True)
        if calls := numbered_calls(built, added):
            await self.store.add_llm_calls(calls)

    async def _write_alone(self, one: _Built) -> None:
        try:
            await self._write([one])
        except NotFoundError as exc:  # its attempt is gone: nothing to record it under
            self.counts.lost += 1
            logger.warning("dropped the record of an LLM call: %s", exc)
        except Exception:
            # The agent already has its answer; a failed record is logged, never raised into a request.
            self.counts.lost += 1
            ids = one.record.rollout_id, one.record.attempt_id
            logger.exception("could not record the LLM call of rollout %s attempt %s", *ids)


@dataclass(frozen=True)
class _Built:
    record: CallRecord
    span: Span
    call: LlmCall | None


def _close(window: asyncio.Future[None]) -> None:
    if not window.done():
        window.set_result(None)
