"""Resources history: ``resource_versions`` keeps every version of every resources id, and the view
``resource_versions_v`` reads it.

``resources`` holds only the latest content of an id (``update_resources`` overwrites it and bumps ``version``),
so nothing could show what a prompt template was before an update. From this revision on, the store writes one
row here in the same transaction as each ``add_resources`` and ``update_resources``. Versions written before it
are gone; the upgrade copies each id's latest version in, so the history starts there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

VIEW = "SELECT resources_id, version, time, resources FROM resource_versions"


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.create_table(
        "resource_versions",
        sa.Column("pk", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("resources_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("resources", json, nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_resource_versions"),
        sa.UniqueConstraint("resources_id", "version", name="uq_resource_versions_resources_id_version"),
    )
    op.execute(
        "INSERT INTO resource_versions (resources_id, version, time, resources) "
        "SELECT resources_id, version, update_time, resources FROM resources ORDER BY pk"
    )
    op.execute(f"CREATE VIEW resource_versions_v AS {VIEW}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS resource_versions_v")
    op.drop_table("resource_versions")
