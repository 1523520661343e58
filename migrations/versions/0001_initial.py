"""Initial schema: rollouts, attempts, spans, resources, workers, llm_calls and the read-only views.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
QUEUED = "status IN ('queuing', 'requeuing')"


def _pk() -> sa.Column[int]:
    return sa.Column("pk", BigId, primary_key=True, autoincrement=True)


def upgrade() -> None:
    op.create_table(
        "rollouts",
        _pk(),
        sa.Column("rollout_id", sa.String(128), nullable=False),
        sa.Column("input", Json, nullable=True),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("mode", sa.String(16), nullable=True),
        sa.Column("resources_id", sa.String(128), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("config", Json, nullable=False),
        sa.Column("metadata", Json, nullable=True),
        sa.Column("enqueue_time", sa.Double(), nullable=True),
        sa.Column("last_span_seq", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("pk", name="pk_rollouts"),
        sa.UniqueConstraint("rollout_id", name="uq_rollouts_rollout_id"),
    )
    op.create_index(
        "ix_rollouts_queue",
        "rollouts",
        ["enqueue_time", "pk"],
        postgresql_where=sa.text(QUEUED),
        sqlite_where=sa.text(QUEUED),
    )
    op.create_index("ix_rollouts_status", "rollouts", ["status"])
    op.create_index("ix_rollouts_start_time", "rollouts", ["start_time"])

    op.create_table(
        "attempts",
        _pk(),
        sa.Column("rollout_id", sa.String(128), nullable=False),
        sa.Column("attempt_id", sa.String(128), nullable=False),
        sa.Column("sequence_id", sa.Integer(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.String(128), nullable=True),
        sa.Column("last_heartbeat_time", sa.Double(), nullable=True),
        sa.Column("metadata", Json, nullable=True),
        sa.PrimaryKeyConstraint("pk", name="pk_attempts"),
        sa.ForeignKeyConstraint(
            ["rollout_id"], ["rollouts.rollout_id"], name="fk_attempts_rollout_id_rollouts", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("attempt_id", name="uq_attempts_attempt_id"),
        sa.UniqueConstraint("rollout_id", "sequence_id", name="uq_attempts_rollout_id_sequence_id"),
    )

    op.create_table(
        "spans",
        _pk(),
        sa.Column("rollout_id", sa.String(128), nullable=False),
        sa.Column("attempt_id", sa.String(128), nullable=False),
        sa.Column("sequence_id", sa.BigInteger(), nullable=False),
        sa.Column("trace_id", sa.String(64), nullable=False),
        sa.Column("span_id", sa.String(64), nullable=False),
        sa.Column("parent_id", sa.String(64), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("status", Json, nullable=False),
        sa.Column("attributes", Json, nullable=False),
        sa.Column("events", Json, nullable=False),
        sa.Column("links", Json, nullable=False),
        sa.Column("start_time", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("context", Json, nullable=True),
        sa.Column("parent", Json, nullable=True),
        sa.Column("resource", Json, nullable=False),
        sa.Column("extra", Json, nullable=True),
        sa.PrimaryKeyConstraint("pk", name="pk_spans"),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.attempt_id"], name="fk_spans_attempt_id_attempts", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("rollout_id", "attempt_id", "span_id", name="uq_spans_rollout_id_attempt_id_span_id"),
    )
    op.create_index("ix_spans_rollout_id_sequence_id", "spans", ["rollout_id", "sequence_id"])
    op.create_index("ix_spans_name", "spans", ["name"])

    op.create_table(
        "resources",
        _pk(),
        sa.Column("resources_id", sa.String(128), nullable=False),
        sa.Column("create_time", sa.Double(), nullable=False),
        sa.Column("update_time", sa.Double(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("resources", Json, nullable=False),
        sa.PrimaryKeyConstraint("pk", name="pk_resources"),
        sa.UniqueConstraint("resources_id", name="uq_resources_resources_id"),
    )
    op.create_index("ix_resources_update_time", "resources", ["update_time"])

    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("heartbeat_stats", Json, nullable=True),
        sa.Column("last_heartbeat_time", sa.Double(), nullable=True),
        sa.Column("last_dequeue_time", sa.Double(), nullable=True),
        sa.Column("last_busy_time", sa.Double(), nullable=True),
        sa.Column("last_idle_time", sa.Double(), nullable=True),
        sa.Column("current_rollout_id", sa.String(128), nullable=True),
        sa.Column("current_attempt_id", sa.String(128), nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name="pk_workers"),
    )

    op.create_table(
        "llm_calls",
        _pk(),
        sa.Column("rollout_id", sa.String(128), nullable=False),
        sa.Column("attempt_id", sa.String(128), nullable=False),
        sa.Column("span_id", sa.String(64), nullable=True),
        sa.Column("sequence_id", sa.BigInteger(), nullable=True),
        sa.Column("agent_name", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("resources_id", sa.String(128), nullable=True),
        sa.Column("resources_version", sa.Integer(), nullable=True),
        sa.Column("prompt_token_ids", Json, nullable=False),
        sa.Column("response_token_ids", Json, nullable=False),
        sa.Column("response_logprobs", Json, nullable=True),
        sa.Column("request", Json, nullable=True),
        sa.Column("response", Json, nullable=True),
        sa.Column("sampling_parameters", Json, nullable=True),
        sa.Column("finish_reason", sa.String(32), nullable=True),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("latency_seconds", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("pk", name="pk_llm_calls"),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.attempt_id"], name="fk_llm_calls_attempt_id_attempts", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("rollout_id", "attempt_id", "span_id", name="uq_llm_calls_rollout_id_attempt_id_span_id"),
    )
    op.create_index("ix_llm_calls_rollout_id_sequence_id", "llm_calls", ["rollout_id", "sequence_id"])

    for name, sql in _views(op.get_bind().dialect.name).items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in reversed(list(_views(op.get_bind().dialect.name))):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for table in ("llm_calls", "workers", "resources", "spans", "attempts", "rollouts"):
        op.drop_table(table)


def _views(dialect: str) -> dict[str, str]:
    """The documented read-only views (docs/reference/sql.md), written once per dialect's JSON syntax."""

    def text(column: str, key: str) -> str:
        if dialect == "postgresql":
            return f"({column} ->> '{key}')"
        return f"json_extract({column}, '$.\"{key}\"')"

    def number(column: str, key: str) -> str:
        # NULL unless the value is a JSON number, so one malformed span cannot break (or skew) the view.
        if dialect == "postgresql":
            return (
                f"CASE WHEN jsonb_typeof({column} -> '{key}') = 'number' "
                f"THEN ({column} ->> '{key}')::double precision END"
            )
        path = f"'$.\"{key}\"'"
        return (
            f"CASE WHEN json_type({column}, {path}) IN ('integer', 'real') "
            f"THEN CAST(json_extract({column}, {path}) AS REAL) END"
        )

    array_length = "jsonb_array_length" if dialect == "postgresql" else "json_array_length"
    # Agent Lightning 0.3 emitters write agentlightning.reward.0.value; older ones a plain "reward" attribute on a
    # span named agentlightning.reward (only there: other spans may use "reward" for something else).
    legacy = f"CASE WHEN s.name = 'agentlightning.reward' THEN {number('s.attributes', 'reward')} END"
    reward = f"COALESCE({number('s.attributes', 'agentlightning.reward.0.value')}, {legacy})"
    latest = "NOT EXISTS (SELECT 1 FROM attempts b WHERE b.rollout_id = a.rollout_id AND b.sequence_id > a.sequence_id)"
    return {
        "rollouts_v": f"""
            SELECT r.rollout_id, r.status, r.mode, r.resources_id, r.start_time, r.end_time,
                   r.end_time - r.start_time AS duration_seconds,
                   (SELECT count(*) FROM attempts c WHERE c.rollout_id = r.rollout_id) AS num_attempts,
                   a.attempt_id AS latest_attempt_id, a.status AS latest_attempt_status,
                   a.worker_id AS latest_worker_id, r.input, r.metadata, r.config
            FROM rollouts r LEFT JOIN attempts a ON a.rollout_id = r.rollout_id AND {latest}""",
        "attempts_v": """
            SELECT a.rollout_id, a.attempt_id, a.sequence_id, a.status, a.worker_id, a.start_time, a.end_time,
                   a.end_time - a.start_time AS duration_seconds, a.last_heartbeat_time, r.mode, a.metadata
            FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id""",
        "spans_v": f"""
            SELECT s.rollout_id, s.attempt_id, a.sequence_id AS attempt_sequence_id, s.sequence_id, s.name,
                   s.trace_id, s.span_id, s.parent_id, {text("s.status", "status_code")} AS status_code,
                   s.start_time, s.end_time, s.end_time - s.start_time AS duration_seconds, s.attributes
            FROM spans s JOIN attempts a ON a.attempt_id = s.attempt_id""",
        "llm_calls_v": f"""
            SELECT c.rollout_id, c.attempt_id, c.span_id, c.sequence_id, c.agent_name, c.model, c.resources_id,
                   c.resources_version, r.mode, {array_length}(c.prompt_token_ids) AS prompt_tokens,
                   {array_length}(c.response_token_ids) AS response_tokens, c.prompt_token_ids,
                   c.response_token_ids, c.response_logprobs, c.finish_reason, c.start_time, c.end_time,
                   c.latency_seconds
            FROM llm_calls c JOIN rollouts r ON r.rollout_id = c.rollout_id""",
        "rewards_v": f"""
            SELECT s.rollout_id, s.attempt_id, s.sequence_id, s.span_id, r.mode, r.resources_id,
                   {text("s.attributes", "agentlightning.reward.0.name")} AS reward_name, {reward} AS reward,
                   s.end_time AS time
            FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_id
            WHERE {reward} IS NOT NULL""",
    }
