"""``Tracer``: capture the spans of an agent's attempts into a store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from lightning_store.contract import LightningStore
from lightning_store.spans import Span
from tracers import provider
from tracers.binding import AttemptBinding, bind_attempt
from tracers.exporter import StoreSpanExporter


class Tracer:
    """Spans started inside :meth:`attempt` blocks are batched and written to one store.

    Create it inside the event loop that owns the store. Every span an agent produces under ``attempt`` —
    through the emitters, an OpenTelemetry instrumentation, or ``opentelemetry.trace`` directly — is stamped
    with the rollout and attempt ids and written with a sequence id. :meth:`flush` returns once every span that
    ended before the call has been written (or has failed and been counted), so calling it before reporting an
    attempt finished guarantees its spans are in the store first.
    """

    def __init__(
        self,
        store: LightningStore | None = None,
        *,
        exporter: SpanExporter | None = None,
        schedule_delay: float = 0.5,
        max_batch: int = 512,
        max_queue: int = 16384,
    ) -> None:
        if (store is None) == (exporter is None):
            raise ValueError("give either a store or an exporter")
        if exporter is None:
            assert store is not None
            exporter = StoreSpanExporter(store, asyncio.get_running_loop())
        provider.install()
        self.exporter = exporter
        self._processor: SpanProcessor = BatchSpanProcessor(
            self.exporter,
            max_queue_size=max_queue,
            schedule_delay_millis=schedule_delay * 1000,
            max_export_batch_size=max_batch,
        )
        self._flush_calls = 0
        """How many :meth:`flush` calls have been made (each call's ticket)."""
        self._flush_run: asyncio.Future[bool] | None = None
        self._flush_run_covers = 0
        """The last ticket whose spans the flush run in progress is sure to write."""

    @classmethod
    def otlp(cls, server_url: str, *, token: str | None = None, schedule_delay: float = 0.5) -> Tracer:
        """A tracer that sends spans to ``store serve`` over OTLP/HTTP (``POST /v1/traces``); needs the
        ``otlp`` extra. The server allocates sequence ids."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        headers = {"Authorization": f"Bearer {token}"} if token else None
        exporter = OTLPSpanExporter(endpoint=server_url.rstrip("/") + "/v1/traces", headers=headers)
        return cls(exporter=exporter, schedule_delay=schedule_delay)

    @contextlib.contextmanager
    def attempt(self, rollout_id: str, attempt_id: str) -> Iterator[AttemptBinding]:
        """Bind the block, and the tasks and threads it starts, to one attempt."""
        with bind_attempt(rollout_id, attempt_id, self._processor) as binding:
            yield binding

    async def flush(self, timeout: float = 60.0) -> bool:
        """Write every finished span now; False if that did not complete within ``timeout``.

        Calls made while a flush runs share the next one (group flushing): a worker with many attempts in
        flight ends many at once, and a flush per attempt would queue each behind the others' exports.
        """
        self._flush_calls += 1
        ticket = self._flush_calls
        while True:
            run = self._flush_run
            if run is None:
                # A run started now writes every span that ended before this call, and those of every call
                # waiting for it.
                self._flush_run_covers = self._flush_calls
                run = self._flush_run = asyncio.ensure_future(self._flush_once(timeout))
                run.add_done_callback(self._flush_done)
            if self._flush_run_covers >= ticket:
                return await asyncio.shield(run)
            # The run in progress began before this call: wait for it to end, then join (or start) the next.
            await asyncio.wait({run})

    async def _flush_once(self, timeout: float) -> bool:
        # force_flush blocks until the exporter is done, and the exporter needs this loop: call it off the loop.
        return await asyncio.to_thread(self._processor.force_flush, int(timeout * 1000))

    def _flush_done(self, run: asyncio.Future[bool]) -> None:
        # Registered first, so it runs before the waiters wake: they find no run and start the next one.
        if self._flush_run is run:
            self._flush_run = None

    async def last_spans(self, attempt_id: str, timeout: float = 60.0) -> tuple[list[Span], bool]:
        """:meth:`flush`, except that the attempt's spans not written yet are returned instead (for the caller to
        send with the attempt's end, one request where it made two), and whether the flush completed. With an
        exporter other than the store's, a plain flush: no spans are returned."""
        if not isinstance(self.exporter, StoreSpanExporter):
            return [], await self.flush(timeout)
        self.exporter.hold(attempt_id)
        try:
            flushed = await self.flush(timeout)
        finally:
            kept = self.exporter.take(attempt_id)
        return kept, flushed

    def lost_spans(self, attempt_id: str) -> int:
        """Spans of the attempt the store refused or could not be reached for (since the last call)."""
        if isinstance(self.exporter, StoreSpanExporter):
            return self.exporter.take_failures(attempt_id)
        return 0

    async def shutdown(self) -> None:
        """Flush and stop the batching thread."""
        await asyncio.to_thread(self._processor.shutdown)
