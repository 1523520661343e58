"""One way to reach a store from a URL: a served store over HTTP, or a database opened in process."""

from __future__ import annotations

import re

from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.sql.store import open_store

_HOST_PORT = re.compile(r"^\[?[\w.:-]+\]?:\d+/?$")
"""``127.0.0.1:4747``, ``localhost:4747``, ``[::1]:4747``: a server's address written without its scheme."""
API_SUFFIXES = ("/v1/agl", "/v1")
"""What a server URL may end with when copied from an API route: the store's root is what is meant."""


def is_server_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def store_target(target: str) -> str:
    """``target`` as :func:`connect` reads it: a server URL without a trailing ``/v1/agl`` or ``/v1`` (the
    routes live under the root, which is what a client is given), anything else unchanged. A server address
    without its scheme is an :class:`InvalidRequestError` (field ``store``) that says what to write."""
    if is_server_url(target):
        root = target.rstrip("/")
        for suffix in API_SUFFIXES:
            root = root.removesuffix(suffix)
        return root
    if _HOST_PORT.match(target):
        raise InvalidRequestError(
            f"{target!r} has no scheme: a store serve is http://{target.rstrip('/')}, a database a URL such as "
            "sqlite:///lightning_store.db",
            field="store",
        )
    return target


async def connect(target: str, *, token: str | None = None, timeout: float = 30.0) -> LightningStore:
    """``http(s)://host:port`` is a ``store serve`` (an :class:`HttpStore`, with ``token`` as its bearer token);
    anything else is a database URL (``sqlite:///…``, ``postgresql://…``) opened in this process without a
    watchdog, which the serving process or ``store serve`` runs. Close the store when done. The target is read
    by :func:`store_target` first. ``timeout``: the server's answers' (see :class:`HttpStore`)."""
    target = store_target(target)
    if is_server_url(target):
        return HttpStore(target, token=token, timeout=timeout)
    return await open_store(target, watchdog=False)
