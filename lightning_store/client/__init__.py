"""The client room: ``HttpStore``, the store contract over HTTP against ``store serve``, so that code takes "a
store" and cannot tell an in-process SQL store from a remote one (ADR 0026).

- :mod:`~lightning_store.client.store`: ``HttpStore``, the contract method by method, with its retry rules;
- :mod:`~lightning_store.client.transport`: its requests, JSON over aiohttp's connection pool, failures reported
  as httpx's errors (ADR 0023).

May import the centre (the contract and its models) and ``server/wire.py``'s long-poll cap, the one number both
sides of the wire must agree on; nothing else of the core, and nothing imports the command line from here.
"""

from lightning_store.client.store import HttpStore, retry_safe_id

__all__ = ["HttpStore", "retry_safe_id"]
