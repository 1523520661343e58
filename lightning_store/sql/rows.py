"""Conversions between table rows and models."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from lightning_store.models import Attempt, AttemptedRollout, Rollout, RolloutConfig, Worker
from lightning_store.resources import ResourcesUpdate

ROLLOUT_COLUMNS = ("rollout_id", "input", "start_time", "end_time", "mode", "resources_id", "status", "metadata")
ATTEMPT_COLUMNS = tuple(Attempt.model_fields)
WORKER_COLUMNS = tuple(Worker.model_fields)


def new_id(prefix: str, nbytes: int = 6) -> str:
    """Random ids in the Agent Lightning style: ``ro-`` rollouts, ``at-`` attempts, ``rs-`` resources."""
    return f"{prefix}-{secrets.token_hex(nbytes)}"


Row = sa.RowMapping | Mapping[str, Any]


def _rollout_fields(row: Row) -> dict[str, Any]:
    fields: dict[str, Any] = {name: row[name] for name in ROLLOUT_COLUMNS}
    fields["config"] = RolloutConfig.model_validate(row["config"])
    return fields


def rollout_from_row(row: Row, attempt: Attempt | None = None) -> Rollout:
    """The rollout, as an ``AttemptedRollout`` when its latest ``attempt`` is given."""
    return Rollout.model_validate(_rollout_fields(row)) if attempt is None else attempted_from_row(row, attempt)


def attempted_from_row(row: Row, attempt: Attempt) -> AttemptedRollout:
    return AttemptedRollout.model_validate({**_rollout_fields(row), "attempt": attempt})


def attempt_from_row(row: sa.RowMapping, prefix: str = "") -> Attempt:
    return Attempt.model_validate({name: row[prefix + name] for name in ATTEMPT_COLUMNS})


def worker_from_row(row: sa.RowMapping) -> Worker:
    return Worker.model_validate({name: row[name] for name in WORKER_COLUMNS})


def resources_from_row(row: sa.RowMapping) -> ResourcesUpdate:
    return ResourcesUpdate.model_validate(
        {name: row[name] for name in ("resources_id", "create_time", "update_time", "version", "resources")}
    )
