"""``training_steps_v`` continues a resumed run with the newest run *of the same algorithm*.

Revision 0002's view gave a resumed training-run rollout (one whose first write is neither step 0 nor a step 1
with training metrics) to the newest run started before it, whatever its algorithm: GRPO, then an APO run, then
the GRPO run resumed put the resumed steps under the APO run's ``run_id``. Now only runs of the same algorithm
are candidates, and "the store's first training-run rollout" starts a run per algorithm. The columns are
unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_training_views = importlib.import_module("migrations.versions.0002_training_views")


def _replace(by_algorithm: bool) -> None:
    j = _training_views.Json(op.get_bind().dialect.name)
    op.execute("DROP VIEW IF EXISTS training_steps_v")
    op.execute(f"CREATE VIEW training_steps_v AS {_training_views._training_steps(j, by_algorithm=by_algorithm)}")


def upgrade() -> None:
    _replace(by_algorithm=True)


def downgrade() -> None:
    _replace(by_algorithm=False)
