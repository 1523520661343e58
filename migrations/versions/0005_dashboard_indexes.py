"""Indexes for the dashboard's rollouts table: reward spans by reward and by attempt, LLM calls by version.

The page filters and sorts by a rollout's reward (``rewards_v``) and by its resources version (``rollouts_v``),
over stores of 100k rollouts and more, and must answer within a few hundred milliseconds:

* ``ix_spans_reward`` is a partial index of the reward spans only, on ``rewards_v``'s own reward expression
  (then the span's end time, rollout, attempt and sequence id). Without it every reward read parses the JSON
  attributes of every span: 0.7 s for ``SELECT count(*) FROM rewards_v`` over 550k spans on SQLite. With it, a
  page sorted by reward reads about a page of the index, and a reward range reads only the spans in it. The
  databases use it only when a query's reward expression is the index's, token for token: it is built from
  0002's expression code, and a revision that changes ``rewards_v``'s reward must rebuild it. Every span
  written evaluates the expression (a JSON lookup of one attribute) to know whether it belongs here; that
  did not measurably slow down inserting 200k spans on SQLite.
* ``ix_spans_reward_attempt`` holds the same spans by rollout, attempt and sequence id: the reward of a
  rollout's latest attempt, or the fact that it has none, without parsing each of its spans (a filter on
  reward checks it for every rollout it walks past).
* ``ix_llm_calls_resources_version`` finds the rollouts that called the LLM at a version without reading the
  LLM-call records, whose token ids make a scan of them slow (0.2 s and up per filter over 190k calls).

Building them reads both tables once; on Postgres it blocks writes to them while it runs.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import importlib

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_training_views = importlib.import_module("migrations.versions.0002_training_views")


def reward_expression(dialect: str) -> str:
    """``rewards_v``'s reward (revision 0002) over the ``spans`` table's columns, unqualified."""
    j = _training_views.Json(dialect)
    legacy = f"CASE WHEN name = 'agentlightning.reward' THEN {j.number('attributes', 'reward')} END"
    return f"COALESCE({j.number('attributes', 'agentlightning.reward.0.value')}, {legacy})"


def upgrade() -> None:
    reward = reward_expression(op.get_bind().dialect.name)
    op.execute(
        f"CREATE INDEX ix_spans_reward ON spans (({reward}), end_time, rollout_id, attempt_id, sequence_id) "
        f"WHERE {reward} IS NOT NULL"
    )
    op.execute(
        "CREATE INDEX ix_spans_reward_attempt ON spans (rollout_id, attempt_id, sequence_id) "
        f"WHERE {reward} IS NOT NULL"
    )
    op.create_index("ix_llm_calls_resources_version", "llm_calls", ["resources_version", "rollout_id"])


def downgrade() -> None:
    op.drop_index("ix_llm_calls_resources_version", table_name="llm_calls")
    op.drop_index("ix_spans_reward_attempt", table_name="spans")
    op.drop_index("ix_spans_reward", table_name="spans")
