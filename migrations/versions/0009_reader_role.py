"""Postgres: the role ``lightning_store_reader``, which can read the store's tables and views and nothing else.

``store sql`` runs its statement as this role (``lightning_store/read_only_sql.py``): a read-only transaction
alone still lets a privileged user run ``COPY … TO PROGRAM``, ``pg_read_file`` or ``pg_terminate_backend``. Any
Postgres client can use it too: ``GRANT lightning_store_reader TO analyst`` (as a user that may grant it), then
``SET ROLE lightning_store_reader`` in the analyst's session, or log in as a user that is only its member.

Roles belong to the whole Postgres cluster, databases to one: the role is created once (when missing) and this
database's tables and views, now and later, become readable to it; the migrating user is made its member so that
``store sql`` may switch to it. A migrating user that may not create or grant roles gets a notice instead of an
error, and ``store sql`` then says that it runs as the connecting user. SQLite has no roles: nothing to do.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ROLE = "lightning_store_reader"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        DO $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                CREATE ROLE {ROLE} NOLOGIN;
            END IF;
        EXCEPTION
            WHEN insufficient_privilege OR duplicate_object THEN
                RAISE NOTICE 'role {ROLE} not created: %', SQLERRM;
        END $$
        """
    )
    op.execute(  # a statement of its own: asyncpg prepares one command at a time
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                EXECUTE format('GRANT USAGE ON SCHEMA %I TO {ROLE}', current_schema());
                EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO {ROLE}', current_schema());
                EXECUTE format(
                    'ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT ON TABLES TO {ROLE}', current_schema()
                );
                IF NOT pg_has_role(current_user, '{ROLE}', 'MEMBER') THEN
                    EXECUTE format('GRANT {ROLE} TO %I', current_user);
                END IF;
            END IF;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'role {ROLE} not granted: %', SQLERRM;
        END $$
        """
    )


def downgrade() -> None:
    """This database's grants are taken back; the role stays (other databases of the cluster may use it)."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
                EXECUTE format(
                    'ALTER DEFAULT PRIVILEGES IN SCHEMA %I REVOKE SELECT ON TABLES FROM {ROLE}', current_schema()
                );
                EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA %I FROM {ROLE}', current_schema());
                EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM {ROLE}', current_schema());
            END IF;
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE NOTICE 'grants to {ROLE} not revoked: %', SQLERRM;
        END $$
        """
    )
