"""The SQL store: one implementation over SQLAlchemy 2 async Core, for Postgres (asyncpg) and SQLite (aiosqlite)."""

from lightning_store.sql.store import SqlStore, open_store

__all__ = ["SqlStore", "open_store"]
