"""An OpenTelemetry ``SpanExporter`` that writes spans into a store through the store contract.

The batching processor calls ``export`` from its own thread, while the store is async and bound to the event
loop it was opened in; each batch is therefore run on that loop and waited for. Works with any store: the SQL
store in process, or ``HttpStore`` (one ``/spans/batch`` request per batch).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from lightning_store import semconv
from lightning_store.contract import LightningStore
from lightning_store.errors import NotFoundError
from lightning_store.spans import Span

logger = logging.getLogger(__name__)


class StoreSpanExporter(SpanExporter):
    """Writes spans stamped with rollout and attempt ids; spans without them are skipped.

    Sequence ids come from the span's ``agentlightning.span_sequence_id`` attribute when set, else from the
    rollout's counter in the store, in the order the spans ended (allocated by the write itself: one request per
    batch). A batch naming an attempt the store does not know is written attempt by attempt so that the others
    still land; spans that could not be written are counted per attempt (:meth:`take_failures`).

    An attempt can be *held* (:meth:`hold`): its spans that come through without a sequence id of their own are
    then kept back instead of written, until :meth:`take` hands them over (a runner sends them with the attempt's
    end: one request where it made two).
    """

    def __init__(self, store: LightningStore, loop: asyncio.AbstractEventLoop, *, timeout: float = 60.0) -> None:
        self._store = store
        self._loop = loop
        self._timeout = timeout
        self._failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._holding: set[str] = set()
        self._held: defaultdict[str, list[Span]] = defaultdict(list)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        bound = self._keep_held([s for s in spans if s.attributes and semconv.ATTEMPT_ID in s.attributes])
        if not bound:
            return SpanExportResult.SUCCESS
        if self._loop.is_closed():
            self._count_failed(bound)
            return SpanExportResult.FAILURE
        future = asyncio.run_coroutine_threadsafe(self._write(bound), self._loop)
        try:
            future.result(self._timeout)
        except Exception:
            future.cancel()
            logger.exception("could not write %d spans to the store", len(bound))
            self._count_failed(bound)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def hold(self, attempt_id: str) -> None:
        """Keep the attempt's spans back from now on (those without a sequence id of their own)."""
        with self._lock:
            self._holding.add(attempt_id)

    def take(self, attempt_id: str) -> list[Span]:
        """The attempt's spans kept back since :meth:`hold`, in the order they ended (sequence id 0: the store
        allocates them); from now on its spans are written again."""
        with self._lock:
            self._holding.discard(attempt_id)
            return self._held.pop(attempt_id, [])

    def _keep_held(self, bound: list[ReadableSpan]) -> list[ReadableSpan]:
        """``bound`` less the spans of held attempts, which are kept back."""
        with self._lock:
            if not self._holding:
                return bound
            written = []
            for span in bound:
                attempt_id = _ids(span)[1]
                if attempt_id in self._holding and _sequence_id(span) is None:
                    self._held[attempt_id].append(_converted(span, 0))
                else:
                    written.append(span)
            return written

    def take_failures(self, attempt_id: str) -> int:
        """How many spans of this attempt could not be written since the last call (and reset the count)."""
        with self._lock:
            return self._failures.pop(attempt_id, 0)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    async def _write(self, batch: list[ReadableSpan]) -> None:
        try:
            await self._add(batch)
        except NotFoundError:
            groups: defaultdict[str, list[ReadableSpan]] = defaultdict(list)
            for span in batch:
                groups[_ids(span)[1]].append(span)
            for group in groups.values():
                try:
                    await self._add(group)
                except NotFoundError:
                    logger.warning("dropped %d spans of unknown attempt %s", len(group), _ids(group[0])[1])
                    self._count_failed(group)

    async def _add(self, batch: list[ReadableSpan]) -> None:
        """One write for the spans that carry their own sequence ids, one (allocating them) for the others."""
        numbers = [(span, _sequence_id(span)) for span in batch]
        numbered = [_converted(span, n) for span, n in numbers if n is not None]
        unnumbered = [_converted(span, 0) for span, n in numbers if n is None]
        if numbered:
            await self._store.add_many_spans(numbered)
        if unnumbered:
            await self._store.add_many_spans(unnumbered, allocate_sequence_ids=True)

    def _count_failed(self, spans: Sequence[ReadableSpan]) -> None:
        with self._lock:
            self._failures.update(_ids(span)[1] for span in spans)


def _ids(span: ReadableSpan) -> tuple[str, str]:
    attributes = span.attributes or {}
    return str(attributes[semconv.ROLLOUT_ID]), str(attributes[semconv.ATTEMPT_ID])


def _converted(span: ReadableSpan, sequence_id: int) -> Span:
    rollout_id, attempt_id = _ids(span)
    return Span.from_opentelemetry(span, rollout_id, attempt_id, sequence_id)


def _sequence_id(span: ReadableSpan) -> int | None:
    value = (span.attributes or {}).get(semconv.SPAN_SEQUENCE_ID)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
