"""The rules of the rollout lifecycle, as pure functions over models.

Every backend applies these and nothing else, so that the retry policy, heartbeat recovery, the watchdog and
worker bookkeeping are specified once.
"""

from __future__ import annotations

from typing import Any

from lightning_store.models import (
    Attempt,
    AttemptStatus,
    RolloutConfig,
    RolloutStatus,
    WorkerStatus,
)


def rollout_status_from_attempt(status: AttemptStatus, sequence_id: int, config: RolloutConfig) -> RolloutStatus:
    """The rollout status implied by its latest attempt.

    ``preparing``, ``running`` and ``succeeded`` carry over. A ``failed``, ``timeout`` or ``unresponsive``
    attempt requeues the rollout when its status is in ``retry_condition`` and fewer than ``max_attempts``
    attempts have been made (``sequence_id`` counts them); otherwise the rollout has failed.
    """
    if status in ("preparing", "running", "succeeded"):
        return status
    if status in config.retry_condition and sequence_id < config.max_attempts:
        return "requeuing"
    return "failed"


def rollout_status_after_attempt(
    current: RolloutStatus, status: AttemptStatus, sequence_id: int, config: RolloutConfig
) -> RolloutStatus:
    """The rollout status once its latest attempt moved to ``status``: :func:`rollout_status_from_attempt`,
    except that a ``cancelled`` rollout stays cancelled.

    Why: cancelling says "do not run this any more"; a runner still working on the attempt it claimed earlier
    (it cannot be stopped from the store) must not turn the rollout back into ``succeeded`` or, worse, put it
    back in the queue by failing. The attempt itself still ends as its runner says. (Agent Lightning 0.3 lets
    the attempt overwrite the cancel: docs/reference/agent-lightning-wire.md, section 8.)
    """
    if current == "cancelled":
        return current
    return rollout_status_from_attempt(status, sequence_id, config)


def rollout_status_after_release(current: RolloutStatus) -> RolloutStatus:
    """The rollout status once its latest attempt was released (ended by its runner through no fault of its
    own: ``AttemptEnd.requeue``): back in the queue whatever the retry policy, except that a ``cancelled``
    rollout stays cancelled (see :func:`rollout_status_after_attempt`)."""
    return current if current == "cancelled" else "requeuing"


REVIVED_ATTEMPT_STATUSES: tuple[AttemptStatus, ...] = ("preparing", "unresponsive")
"""Attempt statuses that a span or heartbeat turns into ``running``."""
REVIVED_ROLLOUT_STATUSES: tuple[RolloutStatus, ...] = ("queuing", "preparing", "requeuing")
"""Rollout statuses that a heartbeat on the latest attempt turns into ``running``."""


def heartbeat_attempt_status(status: AttemptStatus) -> AttemptStatus:
    """A span or heartbeat revives an attempt that was preparing or unresponsive; other statuses stay."""
    return "running" if status in REVIVED_ATTEMPT_STATUSES else status


def heartbeat_rollout_status(status: RolloutStatus) -> RolloutStatus:
    """A heartbeat on the latest attempt marks a rollout running unless it has already finished.

    A ``requeuing`` rollout whose unresponsive attempt comes back is taken out of the queue this way.
    """
    return "running" if status in REVIVED_ROLLOUT_STATUSES else status


def unhealthy_status(attempt: Attempt, config: RolloutConfig, now: float) -> AttemptStatus | None:
    """What the watchdog should mark an active attempt as, or ``None`` when it is healthy.

    Timeout is measured from the attempt's start; unresponsiveness from its last heartbeat (or its start, when
    none arrived yet). An attempt already marked unresponsive is left as it is.
    """
    if config.timeout_seconds is not None and now - attempt.start_time > config.timeout_seconds:
        return "timeout"
    if config.unresponsive_seconds is not None and attempt.status != "unresponsive":
        last_sign_of_life = attempt.last_heartbeat_time or attempt.start_time
        if now - last_sign_of_life > config.unresponsive_seconds:
            return "unresponsive"
    return None


def worker_fields_for_attempt(attempt: Attempt, now: float) -> dict[str, Any]:
    """Worker columns to set when ``attempt`` (with a worker) changes status.

    Finished attempts free the worker (idle); timeout/unresponsive ones leave it ``unknown``; otherwise busy.
    """
    status: WorkerStatus
    if attempt.status in ("succeeded", "failed"):
        status = "idle"
    elif attempt.status in ("timeout", "unresponsive"):
        status = "unknown"
    else:
        return {
            "status": "busy",
            "last_busy_time": now,
            "current_rollout_id": attempt.rollout_id,
            "current_attempt_id": attempt.attempt_id,
        }
    return {"status": status, "last_idle_time": now, "current_rollout_id": None, "current_attempt_id": None}
