"""Typed store errors. Both subclass ``ValueError``, which the Agent Lightning contract raises."""

from __future__ import annotations


class StoreError(ValueError):
    """Base of the errors a store raises for a caller's mistake. ``field`` names the offending input."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFoundError(StoreError):
    """An id (rollout, attempt, resources) names nothing in the store."""


class InvalidRequestError(StoreError):
    """An argument is malformed or asks for a transition the store does not allow."""


class BadRequestError(InvalidRequestError):
    """An invalid argument of the kind Agent Lightning's server refuses with HTTP 400 rather than 422, where its
    clients and tests branch on the status: a page that cannot be served (a sort field the items do not have, a
    negative offset, a limit below -1) or ``null`` for a field an update cannot clear. Callers of the Python
    contract can treat it as any :class:`InvalidRequestError`."""


class ConflictError(StoreError):
    """The store's state no longer allows the change: a conditional update (``if_current``) of an attempt that
    is no longer its rollout's active, latest attempt. Nothing was written."""


class UnauthorizedError(StoreError):
    """The server wants a bearer token that the client did not send (or sent wrong)."""


class DatabaseUnavailableError(Exception):
    """The database cannot be reached now: the connection was refused, lost or timed out, the server is shutting
    down or full, or it turned the store's credentials away. Not the caller's mistake (so not a
    :class:`StoreError`): retry once the database is back (HTTP 503). An operation cut off mid-transaction was
    rolled back; one cut off during its commit may or may not have taken effect.

    ``reason`` is one line on what went wrong (``ConnectionRefusedError: [Errno 111] Connection refused``); the
    original exception is the ``__cause__``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"database unavailable: {reason}")
        self.reason = reason
