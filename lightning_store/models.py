"""Rollouts, attempts, workers and their statuses.

Names and semantics follow the Agent Lightning 0.3 ``LightningStore`` data model, so that objects serialize to
the same JSON on the wire. Timestamps are seconds since the epoch (floats).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lightning_store.limits import Id
from lightning_store.resources import ResourcesUpdate
from lightning_store.spans import Span

RolloutStatus = Literal["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "unresponsive", "timeout"]
EndedAttemptStatus = Literal["succeeded", "failed", "timeout"]
"""The statuses an attempt ends with (see ``ENDED_ATTEMPT_STATUSES``)."""
RolloutMode = Literal["train", "val", "test"]
WorkerStatus = Literal["idle", "busy", "unknown"]
SortOrder = Literal["asc", "desc"]
FilterLogic = Literal["and", "or"]

ROLLOUT_STATUSES: tuple[str, ...] = get_args(RolloutStatus)
ATTEMPT_STATUSES: tuple[str, ...] = get_args(AttemptStatus)
WORKER_STATUSES: tuple[str, ...] = get_args(WorkerStatus)
ROLLOUT_MODES: tuple[str, ...] = get_args(RolloutMode)

QUEUED_ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = ("queuing", "requeuing")
"""A rollout is in the queue exactly when its status is one of these (the queue is not a separate list)."""
ACTIVE_ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = ("preparing", "running")
"""Rollouts the watchdog inspects: claimed by a worker and not finished."""
TERMINAL_ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = ("succeeded", "failed", "cancelled")
ENDED_ATTEMPT_STATUSES: tuple[AttemptStatus, ...] = get_args(EndedAttemptStatus)
"""Attempt statuses that stamp ``end_time``; an ``unresponsive`` attempt may still come back."""
ACTIVE_ATTEMPT_STATUSES: tuple[AttemptStatus, ...] = ("preparing", "running", "unresponsive")
"""An attempt in one of these may still report: it has not ended."""

TaskInput = Any


class RolloutConfig(BaseModel):
    """Retry and health policy of one rollout."""

    timeout_seconds: float | None = Field(default=None, gt=0, description="Longest an attempt may run.")
    unresponsive_seconds: float | None = Field(
        default=None, gt=0, description="Longest an attempt may go without a heartbeat or span."
    )
    max_attempts: int = Field(default=1, ge=1, description="Attempts allowed in total, the first included.")
    retry_condition: list[AttemptStatus] = Field(
        default_factory=list, description="Attempt statuses that trigger a retry while attempts remain."
    )


class Attempt(BaseModel):
    """One execution of a rollout by a worker."""

    rollout_id: str
    attempt_id: str
    sequence_id: int
    start_time: float
    end_time: float | None = None
    status: AttemptStatus = "preparing"
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None


class Rollout(BaseModel):
    """A unit of work: one task input run by an agent, possibly over several attempts."""

    rollout_id: str
    input: TaskInput
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus = "queuing"
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] | None = None


class AttemptedRollout(Rollout):
    """A rollout together with its latest attempt."""

    attempt: Attempt

    @model_validator(mode="after")
    def _check_consistency(self) -> AttemptedRollout:
        if self.attempt.rollout_id != self.rollout_id:
            raise ValueError("Inconsistent rollout_id between Rollout and Attempt")
        return self


class Claim(BaseModel):
    """A rollout just claimed (with its new attempt) and the resources snapshot that attempt runs with: the
    rollout's ``resources_id`` when the store has it, else the latest (as ``get_attempt_resources``); None when
    the store holds no resources. An addition: what a runner needs to start an attempt, in one call."""

    rollout: AttemptedRollout
    resources: ResourcesUpdate | None = None


class EnqueueRolloutRequest(BaseModel):
    """What a caller supplies to enqueue a rollout.

    ``rollout_id`` is an addition to the Agent Lightning request: when given, enqueueing is idempotent (a second
    enqueue with the same id returns the stored rollout and changes nothing).
    """

    model_config = ConfigDict(extra="forbid")

    input: TaskInput
    mode: RolloutMode | None = None
    resources_id: Id | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    rollout_id: Id | None = None


class AttemptEnd(BaseModel):
    """An attempt's final status, as a runner reports it (:meth:`LightningStore.end_attempts`, an addition);
    ``metadata``, when given, replaces the attempt's. ``spans``, when given, are the attempt's last spans, stored
    in the same transaction (see ``end_attempts``): each names this entry's rollout and attempt, and its own
    ``sequence_id`` is ignored (it gets the next value of its rollout's counter). ``requeue``: the attempt was
    not at fault (its runner released it: it stopped, or its worker was killed over another attempt), so its
    rollout is requeued whatever its retry policy, in the same transaction; a rollout never passes through
    ``failed`` on its way back to the queue, where a waiter could take it as finished."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: Id
    attempt_id: Id
    status: EndedAttemptStatus
    metadata: dict[str, Any] | None = None
    spans: list[Span] | None = None
    requeue: bool = False


class Worker(BaseModel):
    """A runner worker as the store sees it, driven by dequeues, attempt updates and heartbeats."""

    worker_id: str
    status: WorkerStatus = "unknown"
    heartbeat_stats: dict[str, Any] | None = None
    last_heartbeat_time: float | None = None
    last_dequeue_time: float | None = None
    last_busy_time: float | None = None
    last_idle_time: float | None = None
    current_rollout_id: str | None = None
    current_attempt_id: str | None = None


T = TypeVar("T")


class PaginatedResult(BaseModel, Sequence[T], Generic[T]):
    """A page of query results that also behaves as a sequence of its items.

    ``total`` counts every match, ignoring ``limit`` and ``offset``; ``limit == -1`` means unlimited.
    """

    items: list[T]
    limit: int
    offset: int
    total: int

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: Any) -> Any:
        return self.items[index]

    def __iter__(self) -> Iterator[T]:  # type: ignore[override,unused-ignore]
        return iter(self.items)
