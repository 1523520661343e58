"""Table definitions: the schema that Alembic's revisions create, kept here so queries can be written in Core.

The migration tests compare these tables with the migrated database, so a change here without a revision in
``migrations/versions`` fails CI.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# JSONB on Postgres (indexable, compact), JSON text on SQLite.
Json = sa.JSON().with_variant(JSONB(), "postgresql")
# The same, storing Python's None as SQL NULL rather than JSON null (for rows inserted from Python values).
JsonOrNull = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Seconds: sa.Double[float] = sa.Double()

QUEUED = "status IN ('queuing', 'requeuing')"

rollouts = sa.Table(
    "rollouts",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String(128), nullable=False, unique=True),
    sa.Column("input", Json, nullable=True),
    sa.Column("start_time", Seconds, nullable=False),
    sa.Column("end_time", Seconds, nullable=True),
    sa.Column("mode", sa.String(16), nullable=True),
    sa.Column("resources_id", sa.String(128), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("config", Json, nullable=False),
    sa.Column("metadata", Json, nullable=True),
    # Queue position: set on enqueue and on every requeue (the tail). FIFO is (enqueue_time, pk).
    sa.Column("enqueue_time", Seconds, nullable=True),
    # The rollout's span sequence counter (see get_next_span_sequence_id).
    sa.Column("last_span_seq", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Index(
        "ix_rollouts_queue",
        "enqueue_time",
        "pk",
        postgresql_where=sa.text(QUEUED),
        sqlite_where=sa.text(QUEUED),
    ),
    sa.Index("ix_rollouts_status", "status"),
    sa.Index("ix_rollouts_start_time", "start_time"),
)

attempts = sa.Table(
    "attempts",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "rollout_id",
        sa.String(128),
        sa.ForeignKey("rollouts.rollout_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("attempt_id", sa.String(128), nullable=False, unique=True),
    sa.Column("sequence_id", sa.Integer(), nullable=False),
    sa.Column("start_time", Seconds, nullable=False),
    sa.Column("end_time", Seconds, nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("worker_id", sa.String(128), nullable=True),
    sa.Column("last_heartbeat_time", Seconds, nullable=True),
    sa.Column("metadata", Json, nullable=True),
    sa.UniqueConstraint("rollout_id", "sequence_id"),
)

spans = sa.Table(
    "spans",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String(128), nullable=False),
    sa.Column(
        "attempt_id",
        sa.String(128),
        sa.ForeignKey("attempts.attempt_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("sequence_id", sa.BigInteger(), nullable=False),
    sa.Column("trace_id", sa.String(64), nullable=False),
    sa.Column("span_id", sa.String(64), nullable=False),
    sa.Column("parent_id", sa.String(64), nullable=True),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("status", Json, nullable=False),
    sa.Column("attributes", Json, nullable=False),
    sa.Column("events", Json, nullable=False),
    sa.Column("links", Json, nullable=False),
    sa.Column("start_time", Seconds, nullable=True),
    sa.Column("end_time", Seconds, nullable=True),
    sa.Column("context", Json, nullable=True),
    sa.Column("parent", Json, nullable=True),
    sa.Column("resource", Json, nullable=False),
    # Fields of the span model we do not know (extra="allow"), kept so nothing a client sent is lost.
    sa.Column("extra", Json, nullable=True),
    sa.UniqueConstraint("rollout_id", "attempt_id", "span_id"),
    sa.Index("ix_spans_rollout_id_sequence_id", "rollout_id", "sequence_id"),
    sa.Index("ix_spans_name", "name"),
    # The foreign key's column: deleting an attempt finds the spans it cascades to by it (revision 0004).
    sa.Index("ix_spans_attempt_id", "attempt_id"),
    # Partial: the reward spans only, on rewards_v's reward expression (revision 0005, which also adds
    # ix_spans_reward, an expression index that this metadata does not describe).
    sa.Index("ix_spans_reward_attempt", "rollout_id", "attempt_id", "sequence_id"),
)

resources = sa.Table(
    "resources",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("resources_id", sa.String(128), nullable=False, unique=True),
    sa.Column("create_time", Seconds, nullable=False),
    sa.Column("update_time", Seconds, nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("resources", Json, nullable=False),
    sa.Index("ix_resources_update_time", "update_time"),
)

# Every version ever written of every resources id, in the transaction that wrote it (revision 0006): the
# dashboard diffs a prompt against the version before it. ``resources`` keeps only the latest of each.
resource_versions = sa.Table(
    "resource_versions",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("resources_id", sa.String(128), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("time", Seconds, nullable=False),
    sa.Column("resources", Json, nullable=False),
    sa.UniqueConstraint("resources_id", "version"),
)

workers = sa.Table(
    "workers",
    metadata,
    sa.Column("worker_id", sa.String(128), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("heartbeat_stats", Json, nullable=True),
    sa.Column("last_heartbeat_time", Seconds, nullable=True),
    sa.Column("last_dequeue_time", Seconds, nullable=True),
    sa.Column("last_busy_time", Seconds, nullable=True),
    sa.Column("last_idle_time", Seconds, nullable=True),
    sa.Column("current_rollout_id", sa.String(128), nullable=True),
    sa.Column("current_attempt_id", sa.String(128), nullable=True),
)

llm_calls = sa.Table(
    "llm_calls",
    metadata,
    sa.Column("pk", BigId, primary_key=True, autoincrement=True),
    sa.Column("rollout_id", sa.String(128), nullable=False),
    sa.Column(
        "attempt_id",
        sa.String(128),
        sa.ForeignKey("attempts.attempt_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("span_id", sa.String(64), nullable=True),
    sa.Column("sequence_id", sa.BigInteger(), nullable=True),
    sa.Column("agent_name", sa.Text(), nullable=True),
    sa.Column("model", sa.Text(), nullable=True),
    sa.Column("resources_id", sa.String(128), nullable=True),
    sa.Column("resources_version", sa.Integer(), nullable=True),
    sa.Column("llm_resource", sa.String(128), nullable=True),
    sa.Column("prompt_token_ids", Json, nullable=False),
    sa.Column("response_token_ids", Json, nullable=False),
    sa.Column("response_logprobs", JsonOrNull, nullable=True),
    sa.Column("request", JsonOrNull, nullable=True),
    sa.Column("response", JsonOrNull, nullable=True),
    sa.Column("sampling_parameters", JsonOrNull, nullable=True),
    sa.Column("finish_reason", sa.String(32), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("start_time", Seconds, nullable=False),
    sa.Column("end_time", Seconds, nullable=True),
    sa.Column("latency_seconds", Seconds, nullable=True),
    sa.UniqueConstraint("rollout_id", "attempt_id", "span_id"),
    sa.Index("ix_llm_calls_rollout_id_sequence_id", "rollout_id", "sequence_id"),
    sa.Index("ix_llm_calls_attempt_id", "attempt_id"),
    # The dashboard's filter on resources version (revision 0005; also ix_spans_reward, an expression index
    # on spans that this metadata does not describe: see that revision).
    sa.Index("ix_llm_calls_resources_version", "resources_version", "rollout_id"),
)
