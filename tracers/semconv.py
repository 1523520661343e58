"""Moved to :mod:`lightning_store.semconv` (the adapters read these names too); kept while callers move."""

from lightning_store.semconv import *  # noqa: F403
