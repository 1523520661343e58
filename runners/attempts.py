"""Ending an attempt from the runner's side without overruling the store.

The watchdog may have timed an attempt out, or a newer attempt may exist, by the time a worker (or the
supervisor, for a dead worker) reports; then the store's verdict stands. Every report goes through
:func:`end_if_current`, a conditional update (``if_current``) that the store checks and applies atomically.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from lightning_store.contract import UNSET, LightningStore
from lightning_store.errors import ConflictError
from lightning_store.models import AttemptStatus
from runners.resilience import UNREACHABLE

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
    reason in its metadata and the rollout is requeued, whatever its retry policy (the agent was not at fault).
    Does nothing (False) when the attempt is no longer the rollout's active one."""
    try:
        if not await end_if_current(store, rollout_id, attempt_id, "failed", {"released": reason}):
            return False
        await store.update_rollout(rollout_id, status="requeuing")
    except UNREACHABLE as error:
        logger.warning("could not release %s (%s); the watchdog will recover it", attempt_id, type(error).__name__)
        return False
    return True
