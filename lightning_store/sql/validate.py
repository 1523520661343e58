"""Argument checks that turn a caller's mistake into an ``InvalidRequestError`` naming the field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from lightning_store.errors import InvalidRequestError
from lightning_store.limits import Id

M = TypeVar("M", bound=BaseModel)


def one_of(value: Any, allowed: tuple[str, ...], field: str) -> None:
    if value not in allowed:
        raise InvalidRequestError(f"{field} must be one of {', '.join(allowed)}; got {value!r}", field=field)


def all_of(values: Iterable[Any] | None, allowed: tuple[str, ...], field: str) -> None:
    if values is None:
        return
    if isinstance(values, str):
        raise InvalidRequestError(f"{field} must be a list of statuses, not a string", field=field)
    for i, value in enumerate(values):
        one_of(value, allowed, f"{field}.{i}")


def model(cls: type[M], value: Any, field: str) -> M:
    """``value`` as ``cls`` (accepting an instance or a mapping); a validation error names the first bad path."""
    try:
        return cls.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = ".".join(str(part) for part in (field, *error["loc"]) if part != "")
        raise InvalidRequestError(f"{path}: {error['msg']}", field=path) from None


def non_empty_id(value: Any, field: str) -> str:
    """An id the store is about to write: a string within :data:`lightning_store.limits.Id`'s rules."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field} must be a non-empty string", field=field)
    try:
        return _ID.validate_python(value)
    except ValidationError as exc:
        raise InvalidRequestError(f"{field}: {exc.errors()[0]['msg']}", field=field) from None


_ID: TypeAdapter[str] = TypeAdapter(Id)
