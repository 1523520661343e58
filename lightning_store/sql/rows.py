"""Conversions between table rows and models."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from pydantic_core import to_json

from lightning_store.models import Attempt, AttemptedRollout, Rollout, RolloutConfig, Worker
from lightning_store.resources import ResourcesUpdate
from lightning_store.sql.schema import attempts, rollouts

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


_ROLLOUT_JSON_COLUMNS = ("input", "config", "metadata")
_ROLLOUT_SCALAR_COLUMNS = tuple(name for name in ROLLOUT_COLUMNS if name not in _ROLLOUT_JSON_COLUMNS)
_ATTEMPT_SCALAR_COLUMNS = tuple(name for name in ATTEMPT_COLUMNS if name != "metadata")


def json_text(dialect: str, column: sa.Column[Any]) -> sa.ColumnElement[Any]:
    """A JSON column read as the text the database keeps, under its own name."""
    text = sa.cast(column, sa.Text) if dialect == "postgresql" else sa.type_coerce(column, sa.Text)
    return text.label(column.name)


@functools.cache
def rollout_text_columns(dialect: str) -> tuple[sa.ColumnElement[Any], ...]:
    """What to select for :func:`rollout_from_text_row`: the scalar columns, and the JSON ones as their text."""
    texts = (json_text(dialect, rollouts.c[name]) for name in _ROLLOUT_JSON_COLUMNS)
    return (*(rollouts.c[name] for name in _ROLLOUT_SCALAR_COLUMNS), *texts)


@functools.cache
def attempt_text_columns(dialect: str) -> tuple[sa.ColumnElement[Any], ...]:
    """What to select for :func:`attempt_document`."""
    return (*(attempts.c[name] for name in _ATTEMPT_SCALAR_COLUMNS), json_text(dialect, attempts.c.metadata))


def _document(row: Row, scalars: tuple[str, ...], texts: tuple[str, ...]) -> str:
    # The scalars in one call of pydantic's encoder, braces cut off; SQL NULL in a JSON column reads as JSON null,
    # as it does when decoded.
    parts = [to_json({name: row[name] for name in scalars}).decode()[1:-1]]
    parts += [f'"{name}":{"null" if row[name] is None else row[name]}' for name in texts]
    return "{" + ",".join(parts) + "}"


def attempt_document(row: Row) -> str:
    """The attempt of a row selected with :func:`attempt_text_columns`, as the JSON of an ``Attempt``."""
    return _document(row, _ATTEMPT_SCALAR_COLUMNS, ("metadata",))


def rollout_document(row: Row, attempt: str | None = None) -> str:
    """The JSON of the rollout of a row selected with :func:`rollout_text_columns`, with its latest ``attempt`` (an
    :func:`attempt_document`) where it has one: what its model would dump, up to key order."""
    document = _document(row, _ROLLOUT_SCALAR_COLUMNS, _ROLLOUT_JSON_COLUMNS)
    return document if attempt is None else f'{document[:-1]},"attempt":{attempt}}}'


def rollout_from_text_row(row: Row, attempt: str | None = None) -> Rollout:
    """The rollout of a row selected with :func:`rollout_text_columns`, validated from its one JSON document (as
    :mod:`lightning_store.sql.span_rows` reads spans); with its latest ``attempt`` (an :func:`attempt_document`), an
    ``AttemptedRollout``. Why: decoding each JSON column, then validating dicts, took a third of the server's CPU on
    a page of 100 rollouts."""
    model = Rollout if attempt is None else AttemptedRollout
    return model.model_validate_json(rollout_document(row, attempt))


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
