"""Views for training questions: the resources version, training step and task of every rollout and reward
(``rollouts_v``, ``rewards_v``), the error message of a span (``spans_v``), and ``training_steps_v``: one row per
training run and step with the common metrics as columns, a resumed run's repeated writes folded in.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STEP_SPAN = "lightning_store.train.step"
"""The span ``store train`` writes per step (``algorithms.session.STEP_SPAN``), frozen here as of this revision."""
METRIC_COLUMNS = (
    "reward_mean",
    "reward_std",
    "val_reward",
    "val_rollouts",
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "grad_norm",
    "trained_transitions",
    "step_seconds",
)
"""Metrics of ``training_steps_v`` that are columns of their own (every metric is in its ``metrics`` JSON)."""
REPLACED = ("rollouts_v", "spans_v", "rewards_v")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    views = _views(dialect)
    for name in REPLACED:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in views.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW IF EXISTS training_steps_v")
    initial: Callable[[str], dict[str, str]] = importlib.import_module("migrations.versions.0001_initial")._views
    previous = initial(dialect)
    for name in REPLACED:
        op.execute(f"DROP VIEW IF EXISTS {name}")
        op.execute(f"CREATE VIEW {name} AS {previous[name]}")


class Json:
    """Portable reads of JSON columns: the same value (or NULL) on both backends, never an error, whatever a
    row holds: a value of another JSON type than the one asked for reads as NULL."""

    def __init__(self, dialect: str) -> None:
        self.postgres = dialect == "postgresql"

    def string(self, column: str, key: str) -> str:
        if self.postgres:
            return f"CASE WHEN jsonb_typeof({column} -> '{key}') = 'string' THEN {column} ->> '{key}' END"
        path = f"'$.\"{key}\"'"
        return f"CASE WHEN json_type({column}, {path}) = 'text' THEN json_extract({column}, {path}) END"

    def number(self, column: str, key: str) -> str:
        if self.postgres:
            return (
                f"CASE WHEN jsonb_typeof({column} -> '{key}') = 'number' "
                f"THEN ({column} ->> '{key}')::double precision END"
            )
        path = f"'$.\"{key}\"'"
        return (
            f"CASE WHEN json_type({column}, {path}) IN ('integer', 'real') "
            f"THEN CAST(json_extract({column}, {path}) AS REAL) END"
        )

    def integer(self, number: str) -> str:
        """A number expression as an integer when it is a whole number that fits 32 bits, else NULL."""
        whole = f"{number} = trunc({number})" if self.postgres else f"{number} = CAST({number} AS INTEGER)"
        return f"CASE WHEN abs({number}) < 2147483648 AND {whole} THEN CAST({number} AS INTEGER) END"

    def status_text(self, column: str, key: str) -> str:
        # OpenTelemetry status fields are strings or null: read as text, as 0001 reads status_code.
        if self.postgres:
            return f"({column} ->> '{key}')"
        return f"json_extract({column}, '$.\"{key}\"')"

    def numeric_members(self, column: str) -> str:
        """A FROM item ``m`` with one row per member of the JSON object ``column``: ``m.key``, and the
        conditions and expressions below for its value."""
        if self.postgres:
            return (
                f"CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof({column}) = 'object' "
                f"THEN {column} ELSE '{{}}'::jsonb END) AS m"
            )
        return f"CROSS JOIN json_each(CASE WHEN json_type({column}) = 'object' THEN {column} ELSE '{{}}' END) AS m"

    def member_is_number(self) -> str:
        return "jsonb_typeof(m.value) = 'number'" if self.postgres else "m.type IN ('integer', 'real')"

    def member_number(self) -> str:
        return "(m.value #>> '{}')::double precision" if self.postgres else "CAST(m.value AS REAL)"

    def member_json(self) -> str:
        """The member's value as JSON (SQLite: its text), the same number as in the span. SQLite would write a
        REAL back with 15 significant digits; 17 read back as the same double."""
        return "m.value" if self.postgres else "printf('%!.17g', CAST(m.value AS REAL))"

    def object_agg(self, key: str, value: str) -> str:
        """A JSON object of ``key`` → ``value`` (from :meth:`member_json`) over the group's rows with a key."""
        if self.postgres:
            return f"COALESCE(jsonb_object_agg({key}, {value}) FILTER (WHERE {key} IS NOT NULL), '{{}}'::jsonb)"
        # json() here, not where the text is made: SQLite's JSON marker does not survive a subquery's column.
        return f"COALESCE(json_group_object({key}, json({value})) FILTER (WHERE {key} IS NOT NULL), json_object())"


def _views(dialect: str) -> dict[str, str]:
    """The views this revision creates or replaces (docs/reference/sql.md), written once per dialect."""
    j = Json(dialect)
    # As in 0001: Agent Lightning 0.3 emitters write agentlightning.reward.0.value; older ones a plain "reward"
    # attribute on a span named agentlightning.reward.
    legacy = f"CASE WHEN s.name = 'agentlightning.reward' THEN {j.number('s.attributes', 'reward')} END"
    reward = f"COALESCE({j.number('s.attributes', 'agentlightning.reward.0.value')}, {legacy})"
    latest = "NOT EXISTS (SELECT 1 FROM attempts b WHERE b.rollout_id = a.rollout_id AND b.sequence_id > a.sequence_id)"
    # The version the attempt ran on: the proxy stamps each LLM call with the version of the rollout's resources
    # current at the call; an attempt's first call carries the lowest (versions only grow).
    version = "(SELECT min(c.resources_version) FROM llm_calls c WHERE c.rollout_id = {r} AND c.attempt_id = {a})"
    step = j.integer(j.number("r.metadata", "step"))
    task_id = j.string("r.metadata", "task_id")
    return {
        "rollouts_v": f"""
            SELECT r.rollout_id, r.status, r.mode, r.resources_id,
                   {version.format(r="r.rollout_id", a="a.attempt_id")} AS resources_version,
                   {step} AS step, {task_id} AS task_id, r.start_time, r.end_time,
                   r.end_time - r.start_time AS duration_seconds,
                   (SELECT count(*) FROM attempts c WHERE c.rollout_id = r.rollout_id) AS num_attempts,
                   a.attempt_id AS latest_attempt_id, a.status AS latest_attempt_status,
                   a.worker_id AS latest_worker_id, r.input, r.metadata, r.config
            FROM rollouts r LEFT JOIN attempts a ON a.rollout_id = r.rollout_id AND {latest}""",
        "spans_v": f"""
            SELECT s.rollout_id, s.attempt_id, a.sequence_id AS attempt_sequence_id, s.sequence_id, s.name,
                   s.trace_id, s.span_id, s.parent_id, {j.status_text("s.status", "status_code")} AS status_code,
                   {j.status_text("s.status", "description")} AS status_message,
                   s.start_time, s.end_time, s.end_time - s.start_time AS duration_seconds, s.attributes
            FROM spans s JOIN attempts a ON a.attempt_id = s.attempt_id""",
        "rewards_v": f"""
            SELECT s.rollout_id, s.attempt_id, s.sequence_id, s.span_id, r.mode, r.resources_id,
                   {version.format(r="s.rollout_id", a="s.attempt_id")} AS resources_version,
                   {step} AS step, {task_id} AS task_id,
                   {j.string("s.attributes", "agentlightning.reward.0.name")} AS reward_name, {reward} AS reward,
                   s.end_time AS time
            FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_id
            WHERE {reward} IS NOT NULL""",
        "training_steps_v": _training_steps(j),
    }


def _training_steps(j: Json, *, by_algorithm: bool = False) -> str:
    """``training_steps_v``: one row per (run, step).

    A training run is a rollout whose ``metadata.training_run`` names the algorithm; each write of a step is a
    ``STEP_SPAN`` span of it with the attributes ``step`` and ``metric.<name>``. ``store train`` run again on the
    same output resumes from the newest checkpoint under a new training-run rollout, whose first write is the
    evaluation of the step it resumes from (a second write of that step) or, without validation tasks, the step
    after it. A run starts at a training-run rollout whose first write is step 0, or step 1 with training metrics
    (``reward_mean``), and at the store's first training-run rollout; any other continues the newest run started
    before it. Within a run, each metric of a step is read from the newest write that has it (later rollout, then
    later span): a resumed step keeps its training metrics and takes the new evaluation.

    With ``by_algorithm`` (revision 0007), "the store's first" and "the newest run started before it" count only
    training-run rollouts of the same algorithm: a resumed GRPO run continues the newest GRPO run, not an APO run
    started in between. This revision's view is built without it.
    """
    same = "e.algorithm = f.algorithm AND " if by_algorithm else ""
    same_run = "t.algorithm = f.algorithm AND " if by_algorithm else ""
    newest_first = "w.run_start DESC, w.training_rollout_id DESC, w.sequence_id DESC"
    pivoted = ",\n                   ".join(
        f"max(CASE WHEN l.name = '{name}' THEN l.value END) AS {name}" for name in METRIC_COLUMNS
    )
    columns = ", ".join(f"f.{name}" for name in METRIC_COLUMNS)
    return f"""
        WITH writes AS (
            SELECT s.rollout_id AS training_rollout_id, r.start_time AS run_start,
                   {j.string("r.metadata", "training_run")} AS algorithm, s.sequence_id, s.end_time AS time,
                   {j.integer(j.number("s.attributes", "step"))} AS step,
                   {j.number("s.attributes", "metric.reward_mean")} AS reward_mean, s.attributes
            FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_id
            WHERE s.name = '{STEP_SPAN}'
        ),
        steps AS (SELECT * FROM writes WHERE algorithm IS NOT NULL AND step IS NOT NULL),
        firsts AS (
            SELECT f.training_rollout_id, f.run_start, f.algorithm,
                   CASE WHEN f.step = 0 OR (f.step = 1 AND f.reward_mean IS NOT NULL) THEN 1 ELSE 0 END AS fresh
            FROM steps f
            WHERE NOT EXISTS (
                SELECT 1 FROM steps e
                WHERE e.training_rollout_id = f.training_rollout_id AND e.sequence_id < f.sequence_id
            )
        ),
        starts AS (
            SELECT f.training_rollout_id, f.run_start, f.algorithm FROM firsts f
            WHERE f.fresh = 1 OR NOT EXISTS (
                SELECT 1 FROM firsts e
                WHERE {same}(e.run_start < f.run_start
                   OR (e.run_start = f.run_start AND e.training_rollout_id < f.training_rollout_id))
            )
        ),
        runs AS (
            SELECT f.training_rollout_id, (
                SELECT t.training_rollout_id FROM starts t
                WHERE {same_run}(t.run_start < f.run_start
                   OR (t.run_start = f.run_start AND t.training_rollout_id <= f.training_rollout_id))
                ORDER BY t.run_start DESC, t.training_rollout_id DESC LIMIT 1
            ) AS run_id
            FROM firsts f
        ),
        ranked AS (
            SELECT u.run_id, w.training_rollout_id, w.run_start, w.algorithm, w.sequence_id, w.time, w.step,
                   w.attributes, row_number() OVER (PARTITION BY u.run_id, w.step ORDER BY {newest_first}) AS newest
            FROM steps w JOIN runs u ON u.training_rollout_id = w.training_rollout_id
        ),
        metric_writes AS (
            SELECT w.run_id, w.step, substr(m.key, 8) AS name, {j.member_number()} AS value,
                   {j.member_json()} AS json_value,
                   row_number() OVER (PARTITION BY w.run_id, w.step, m.key ORDER BY {newest_first}) AS newest
            FROM ranked w {j.numeric_members("w.attributes")}
            WHERE substr(m.key, 1, 7) = 'metric.' AND {j.member_is_number()}
        ),
        latest AS (SELECT run_id, step, name, value, json_value FROM metric_writes WHERE newest = 1),
        folded AS (
            SELECT h.run_id, h.training_rollout_id, h.algorithm, h.step, h.time,
                   max(CASE WHEN l.name = 'version' THEN l.value END) AS version,
                   {pivoted},
                   {j.object_agg("l.name", "l.json_value")} AS metrics
            FROM ranked h LEFT JOIN latest l ON l.run_id = h.run_id AND l.step = h.step
            WHERE h.newest = 1
            GROUP BY h.run_id, h.training_rollout_id, h.algorithm, h.step, h.time
        )
        SELECT f.run_id, f.training_rollout_id, f.algorithm, f.step, {j.integer("f.version")} AS resources_version,
               f.time, {columns}, f.metrics
        FROM folded f"""
