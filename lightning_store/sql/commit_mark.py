"""Whether a request's writes may have reached the database: what a 503 must tell the client.

A write whose database went away before its ``COMMIT`` was sent did nothing, and any request may be sent again. One
that went away after (the connection cut while the commit's answer was on its way) may have committed: a client
that sends a non-idempotent request again then does it twice (two rollouts started, two claims). The store marks the
request when a write starts to commit (:func:`committing`); the server's 503 says so (``maybe_written``), and
:class:`~lightning_store.client.HttpStore` sends again only what is idempotent or was surely not written.

The mark is a mutable object in a context variable, set by the server per request (:func:`track`): the request's
handler may run in a copy of the context (a dependency, a task), and a copy shares the object. A batch that serves
several requests at once (:mod:`~lightning_store.sql.coalesce`) marks every one of them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class CommitMark:
    """``started``: a write of this request has sent its ``COMMIT`` (or a statement that commits on its own)."""

    started: bool = False


_CURRENT: ContextVar[CommitMark | None] = ContextVar("lightning_store_commit_mark", default=None)


def track() -> CommitMark:
    """A fresh mark for the request now being served (by the server, before the request is handled)."""
    mark = CommitMark()
    _CURRENT.set(mark)
    return mark


def current() -> CommitMark | None:
    """The current request's mark (None outside a tracked request)."""
    return _CURRENT.get()


def committing() -> None:
    """Mark the current request (if any is tracked) as one whose write may have committed."""
    mark = _CURRENT.get()
    if mark is not None:
        mark.started = True


def may_have_written() -> bool:
    """Whether the current request may have written, as far as this process knows."""
    mark = _CURRENT.get()
    return mark is not None and mark.started
