"""The HTTP server (``store serve``): the store contract over REST, OTLP ingest, health and metrics."""

from lightning_store.server.app import create_app

__all__ = ["create_app"]
