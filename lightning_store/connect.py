"""One way to reach a store from a URL: a served store over HTTP, or a database opened in process."""

from __future__ import annotations

from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.sql.store import open_store


def is_server_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


async def connect(target: str, *, token: str | None = None) -> LightningStore:
    """``http(s)://host:port`` is a ``store serve`` (an :class:`HttpStore`, with ``token`` as its bearer token);
    anything else is a database URL (``sqlite:///…``, ``postgresql://…``) opened in this process without a
    watchdog, which the serving process or ``store serve`` runs. Close the store when done."""
    if is_server_url(target):
        return HttpStore(target, token=token)
    return await open_store(target, watchdog=False)
