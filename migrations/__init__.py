"""Alembic environment and revisions: the only way the store's schema changes."""
