"""The store contract: one async interface, implemented by the SQL store (``lightning_store.sql.SqlStore``, on
Postgres and SQLite) and by the HTTP client (``lightning_store.client.HttpStore``, against ``store serve``).

Names and semantics follow the Agent Lightning 0.3 ``LightningStore``; additions are keyword arguments or new
methods, never changed meanings. Errors: an unknown id raises :class:`~lightning_store.errors.NotFoundError`, a
malformed argument :class:`~lightning_store.errors.InvalidRequestError`; a method that raises has written nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from opentelemetry.sdk.trace import ReadableSpan

from lightning_store.llm_calls import LlmCall
from lightning_store.models import (
    Attempt,
    AttemptedRollout,
    AttemptEnd,
    AttemptStatus,
    Claim,
    EnqueueRolloutRequest,
    FilterLogic,
    PaginatedResult,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    SortOrder,
    TaskInput,
    Worker,
    WorkerStatus,
)
from lightning_store.resources import NamedResources, ResourcesUpdate
from lightning_store.spans import Span


class _Unset(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset.UNSET
"""Marks an update argument as omitted, as distinct from an explicit ``None``."""
Unset = Literal[_Unset.UNSET]


class StoreStatistics(TypedDict, total=False):
    name: str
    total_rollouts: int
    total_attempts: int
    total_spans: int
    total_resources: int
    total_workers: int
    uptime: float
    rollouts_by_status: dict[str, int]


@runtime_checkable
class LightningStore(Protocol):
    """The durable control plane that rollouts, runners and algorithms share. Every method is safe to call
    concurrently from many tasks and processes."""

    async def statistics(self) -> StoreStatistics: ...

    # Rollouts --------------------------------------------------------------------------------------------

    async def start_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> AttemptedRollout:
        """Create a rollout already claimed (``preparing``) with its first attempt, bypassing the queue."""
        ...

    async def enqueue_rollout(
        self,
        input: TaskInput,
        mode: RolloutMode | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
    ) -> Rollout:
        """Append a ``queuing`` rollout to the queue. With ``rollout_id``, idempotent: an existing rollout of
        that id is returned unchanged."""
        ...

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> Sequence[Rollout]:
        """Enqueue all of ``rollouts`` in one transaction, in order; all or none are written."""
        ...

    async def dequeue_rollout(
        self, worker_id: str | None = None, *, timeout: float | None = None
    ) -> AttemptedRollout | None:
        """Claim the oldest queued rollout and create its attempt in one transaction.

        Returns ``None`` when the queue is empty; with ``timeout`` (an addition) it first waits up to that many
        seconds for a rollout to arrive.
        """
        ...

    async def dequeue_many_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> Sequence[AttemptedRollout]:
        """Claim up to ``limit`` rollouts in FIFO order in one transaction."""
        ...

    async def claim_rollouts(
        self, *, limit: int = 1, worker_id: str | None = None, timeout: float | None = None
    ) -> Sequence[Claim]:
        """**Addition.** ``dequeue_many_rollouts``, each claim with the resources its attempt runs with (as
        ``get_attempt_resources`` would answer): a runner's one call per batch of claims instead of two."""
        ...

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        """Create a new (``preparing``) attempt for an existing rollout outside the queue."""
        ...

    async def query_rollouts(
        self,
        *,
        status_in: Sequence[RolloutStatus] | None = None,
        rollout_id_in: Sequence[str] | None = None,
        rollout_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
        status: Sequence[RolloutStatus] | None = None,
        rollout_ids: Sequence[str] | None = None,
        mode_in: Sequence[RolloutMode] | None = None,
        metadata_match: dict[str, Any] | None = None,
        start_time_from: float | None = None,
        start_time_to: float | None = None,
    ) -> PaginatedResult[Rollout]:
        """Rollouts matching the filters (those with attempts as :class:`AttemptedRollout`).

        ``filter_logic`` combines ``status_in``, ``rollout_id_in`` and ``rollout_id_contains``; the additions
        ``mode_in``, ``metadata_match`` (each key equal to its value), ``start_time_from`` and ``start_time_to``
        always apply with AND. ``status`` and ``rollout_ids`` are deprecated aliases.
        """
        ...

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None: ...

    async def update_rollout(
        self,
        rollout_id: str,
        input: TaskInput | Unset = UNSET,
        mode: RolloutMode | None | Unset = UNSET,
        resources_id: str | None | Unset = UNSET,
        status: RolloutStatus | Unset = UNSET,
        config: RolloutConfig | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
    ) -> Rollout:
        """Replace the given fields. A terminal status stamps ``end_time`` and wakes waiters; a queued status
        puts the rollout at the tail of the queue."""
        ...

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until every rollout is terminal or ``timeout`` passes; return the terminal ones."""
        ...

    # Attempts --------------------------------------------------------------------------------------------

    async def query_attempts(
        self,
        rollout_id: str,
        *,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Attempt]: ...

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None: ...

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | Unset = UNSET,
        worker_id: str | Unset = UNSET,
        last_heartbeat_time: float | Unset = UNSET,
        metadata: dict[str, Any] | None | Unset = UNSET,
        *,
        if_current: bool = False,
    ) -> Attempt:
        """Update an attempt (``attempt_id`` may be ``"latest"``). A status change of the latest attempt
        decides the rollout's status through the retry policy; the attempt's worker follows its status.

        With ``if_current`` (an addition) the update applies only while the attempt is its rollout's latest
        attempt and still active (``ACTIVE_ATTEMPT_STATUSES``); otherwise ``ConflictError`` is raised and
        nothing is written. Check and write are one transaction, so a runner's report can never overrule the
        watchdog or a newer attempt."""
        ...

    async def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Attempt | None]:
        """Report several attempts' final statuses in one transaction (an addition): each entry applies as
        ``update_attempt(rollout_id, attempt_id, status=…, metadata=…, if_current=True)`` would, and its result
        is the ended attempt, or None where the attempt was no longer current (nothing written for that entry).
        An invalid or unknown entry raises ``InvalidRequestError``/``NotFoundError`` naming it (``ends.3.status``)
        and nothing at all is written. At most 1000 entries per call.

        An entry's ``spans`` (the attempt's last spans: one request where a runner made two) are stored in the
        same transaction, whether or not the entry applied, as ``add_many_spans(spans,
        allocate_sequence_ids=True)`` stores them, except that they are not heartbeats (the end decides the
        attempt's status). Each must name the entry's rollout and attempt, and the entry its attempt by id (not
        ``latest``), or the call is refused naming the span (``ends.1.spans.0.attempt_id``).

        An entry with ``requeue`` releases its attempt (not at fault): its rollout goes back to ``requeuing``
        whatever its retry policy (a cancelled one stays cancelled), never passing through ``failed``."""
        ...

    # Spans -----------------------------------------------------------------------------------------------

    async def add_span(self, span: Span) -> Span | None:
        """Store one span; ``None`` when it is a duplicate. A span is a heartbeat of its attempt."""
        ...

    async def add_many_spans(self, spans: Sequence[Span], *, allocate_sequence_ids: bool = False) -> Sequence[Span]:
        """Store spans in one batch, ignoring duplicates; returns those that were new.

        With ``allocate_sequence_ids`` (an addition), each span's own ``sequence_id`` is ignored: it gets the next
        value of its rollout's counter, in the order given, in the same transaction as the write, and the spans
        returned carry those values. One call where :meth:`get_many_span_sequence_ids` then ``add_many_spans``
        would take two (a span writer's flush is one request)."""
        ...

    async def add_otel_span(
        self, rollout_id: str, attempt_id: str, readable_span: ReadableSpan, sequence_id: int | None = None
    ) -> Span | None: ...

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        """The next value of the rollout's strictly increasing span counter (``attempt_id`` may be ``"latest"``)."""
        ...

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> Sequence[int]: ...

    async def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | None = None,
        *,
        trace_id: str | None = None,
        trace_id_contains: str | None = None,
        span_id: str | None = None,
        span_id_contains: str | None = None,
        parent_id: str | None = None,
        parent_id_contains: str | None = None,
        name: str | None = None,
        name_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        limit: int = -1,
        offset: int = 0,
        sort_by: str | None = "sequence_id",
        sort_order: SortOrder = "asc",
    ) -> PaginatedResult[Span]:
        """Spans of a rollout, of one attempt, of its ``"latest"`` attempt, or of all (``None``)."""
        ...

    async def search_spans(
        self,
        *,
        rollout_ids: Sequence[str] | None = None,
        attempt_ids: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
        name_prefix: str | None = None,
        mode_in: Sequence[RolloutMode] | None = None,
        status_code: str | None = None,
        attributes_match: dict[str, Any] | None = None,
        start_time_from: float | None = None,
        start_time_to: float | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = 1000,
        offset: int = 0,
    ) -> PaginatedResult[Span]:
        """Spans across rollouts (a read-only addition). Every given filter applies (AND): ids and names from
        the lists, ``name_prefix``, the rollout's ``mode_in``, ``status_code`` (``UNSET``, ``OK``, ``ERROR``),
        ``attributes_match`` (each attribute key equal to its value), ``start_time`` within
        ``[start_time_from, start_time_to]``. Sorted by ``start_time``, ``end_time``, ``name`` or ``rollout_id``,
        by insertion order when ``sort_by`` is None; ties go in insertion order. ``limit`` defaults to 1000
        (``-1``: no limit) because the whole store can be large."""
        ...

    async def add_llm_calls(self, calls: Sequence[LlmCall]) -> None:
        """Record typed LLM calls (an addition) in one transaction; a call already recorded (same rollout,
        attempt and span id) is ignored. Each must name an existing attempt of its rollout."""
        ...

    async def query_llm_calls(self, rollout_ids: Sequence[str], *, attempt_id: str | None = None) -> list[LlmCall]:
        """The LLM calls of these rollouts (an addition), ordered by rollout and sequence id."""
        ...

    # Resources -------------------------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate: ...

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        """Replace a snapshot's resources and bump its version (creating it at version 1 when new); the
        snapshot becomes the latest."""
        ...

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None: ...

    async def get_latest_resources(self) -> ResourcesUpdate | None: ...

    async def get_attempt_resources(self, rollout_id: str, attempt_id: str) -> ResourcesUpdate | None:
        """The snapshot an attempt runs with: its rollout's (``resources_id``) when stored, else the latest (None
        when there is none). Raises NotFoundError (field ``rollout_id`` or ``attempt_id``) when the rollout, or
        that attempt of it, does not exist. An addition: the LLM proxy's one read per call."""
        ...

    async def query_resources(
        self,
        *,
        resources_id: str | None = None,
        resources_id_contains: str | None = None,
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[ResourcesUpdate]: ...

    # Workers ---------------------------------------------------------------------------------------------

    async def query_workers(
        self,
        *,
        status_in: Sequence[WorkerStatus] | None = None,
        worker_id_contains: str | None = None,
        filter_logic: FilterLogic = "and",
        sort_by: str | None = None,
        sort_order: SortOrder = "asc",
        limit: int = -1,
        offset: int = 0,
    ) -> PaginatedResult[Worker]: ...

    async def get_worker_by_id(self, worker_id: str) -> Worker | None: ...

    async def update_worker(self, worker_id: str, heartbeat_stats: dict[str, Any] | Unset = UNSET) -> Worker:
        """Record a heartbeat (and optionally stats) for a worker, creating it when new."""
        ...

    async def scan_unhealthy(self) -> int:
        """Run one watchdog scan now (an addition; the watchdog also runs on its own); returns how many attempts
        it marked timed out or unresponsive."""
        ...

    async def close(self) -> None:
        """Stop background tasks and release connections."""
        ...


@runtime_checkable
class DocumentReads(Protocol):
    """A store that can answer :meth:`LightningStore.query_spans` and :meth:`LightningStore.query_rollouts` with
    each item as its JSON document rather than a model (the SQL store): the server sends the documents as they are,
    which saves validating each item and dumping it again, a third or more of its CPU on a page. A document holds
    every field of its model (a rollout's ``attempt`` where it has one), as the model would dump it up to key
    order; arguments and errors are those of the model-returning method."""

    async def query_span_documents(
        self, rollout_id: str, attempt_id: str | None = None, **filters: Any
    ) -> PaginatedResult[str]: ...

    async def query_rollout_documents(self, **filters: Any) -> PaginatedResult[str]: ...
