"""Views for prompt optimization (APO) runs: ``prompt_candidates_v`` (one row per candidate prompt a run
proposed, with its scores and whether it won) and ``apo_runs_v`` (one row per run: its result and budget as
reported, next to what the store holds); ``llm_calls_v`` gains the token counts of the response's ``usage``
(hosted LLMs report usage but no token ids).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CANDIDATE_SPAN = "lightning_store.apo.candidate"
RESULT_SPAN = "lightning_store.apo.result"
"""The spans an APO run writes on its run rollout (algorithms/apo/SPEC.md), frozen here as of this revision."""
REPLACED = ("llm_calls_v",)
CREATED = ("prompt_candidates_v", "apo_runs_v")

_training_views = importlib.import_module("migrations.versions.0002_training_views")


class Json(_training_views.Json):
    """0002's portable JSON reads, and two more: a number at a nested path, and whole numbers beyond 32 bits."""

    def number_at(self, column: str, *keys: str) -> str:
        """The number at ``column``'s path ``keys`` (objects within objects), else NULL."""
        if self.postgres:
            path = "'{" + ",".join(f'"{key}"' for key in keys) + "}'"
            return (
                f"CASE WHEN jsonb_typeof({column} #> {path}) = 'number' "
                f"THEN ({column} #>> {path})::double precision END"
            )
        path = "'$" + "".join(f'."{key}"' for key in keys) + "'"
        return (
            f"CASE WHEN json_type({column}, {path}) IN ('integer', 'real') "
            f"THEN CAST(json_extract({column}, {path}) AS REAL) END"
        )

    def big_integer(self, number: str) -> str:
        """A number expression as a BIGINT when it is a whole number a double holds exactly (|n| ≤ 2⁵³), else
        NULL: token counts and seeds may not fit 32 bits."""
        whole = f"{number} = trunc({number})" if self.postgres else f"{number} = CAST({number} AS INTEGER)"
        return f"CASE WHEN abs({number}) <= 9007199254740992 AND {whole} THEN CAST({number} AS BIGINT) END"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for name in REPLACED:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for name, sql in _views(dialect).items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for name in reversed(CREATED):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    initial: Callable[[str], dict[str, str]] = importlib.import_module("migrations.versions.0001_initial")._views
    previous = {**initial(dialect), **_training_views._views(dialect)}
    for name in REPLACED:
        op.execute(f"DROP VIEW IF EXISTS {name}")
        op.execute(f"CREATE VIEW {name} AS {previous[name]}")


def _views(dialect: str) -> dict[str, str]:
    """The views this revision creates or replaces (docs/reference/sql.md), written once per dialect."""
    j = Json(dialect)
    array_length = "jsonb_array_length" if j.postgres else "json_array_length"

    def usage(key: str) -> str:
        return j.integer(j.number_at("c.response", "usage", key))

    return {
        # 0001's llm_calls_v, two columns added at the end.
        "llm_calls_v": f"""
            SELECT c.rollout_id, c.attempt_id, c.span_id, c.sequence_id, c.agent_name, c.model, c.resources_id,
                   c.resources_version, r.mode, {array_length}(c.prompt_token_ids) AS prompt_tokens,
                   {array_length}(c.response_token_ids) AS response_tokens, c.prompt_token_ids,
                   c.response_token_ids, c.response_logprobs, c.finish_reason, c.start_time, c.end_time,
                   c.latency_seconds, {usage("prompt_tokens")} AS usage_prompt_tokens,
                   {usage("completion_tokens")} AS usage_completion_tokens
            FROM llm_calls c JOIN rollouts r ON r.rollout_id = c.rollout_id""",
        "prompt_candidates_v": _prompt_candidates(j),
        "apo_runs_v": _apo_runs(j),
    }


def _newest_results() -> str:
    """The newest result span of each run rollout (a run writes one; a re-written one is not told apart)."""
    return f"""
            SELECT s.rollout_id AS run_id, s.attributes,
                   row_number() OVER (PARTITION BY s.rollout_id ORDER BY s.sequence_id DESC, s.pk DESC) AS newest
            FROM spans s WHERE s.name = '{RESULT_SPAN}'"""


def _prompt_candidates(j: Json) -> str:
    """``prompt_candidates_v``: one row per candidate span (per run rollout and span id: the newest write)."""

    def text(key: str) -> str:
        return j.string("s.attributes", f"apo.{key}")

    def number(key: str) -> str:
        return j.number("s.attributes", f"apo.{key}")

    return f"""
        WITH writes AS (
            SELECT s.rollout_id AS run_id, s.end_time AS time,
                   {number("round")} AS round, {number("candidate")} AS candidate, {text("origin")} AS origin,
                   {text("template")} AS template_name, {text("status")} AS status, {text("reason")} AS reason,
                   {text("resources_id")} AS resources_id, {text("parent")} AS parent_resources_id,
                   {text("parents")} AS parents, {text("critique")} AS critique,
                   {number("minibatch_score")} AS minibatch_score,
                   {number("parent_minibatch_score")} AS parent_minibatch_score,
                   {number("val_score")} AS val_score, {number("val_tasks")} AS val_tasks,
                   {text("templates")} AS templates, {number("rollouts_spent")} AS rollouts_spent,
                   {number("optimizer_calls_spent")} AS optimizer_calls_spent,
                   {number("optimizer_tokens_spent")} AS optimizer_tokens_spent,
                   row_number() OVER (
                       PARTITION BY s.rollout_id, s.span_id ORDER BY s.sequence_id DESC, s.pk DESC
                   ) AS newest
            FROM spans s WHERE s.name = '{CANDIDATE_SPAN}'
        ),
        results AS ({_newest_results()}
        ),
        bests AS (
            SELECT x.run_id, {j.integer(j.number("x.attributes", "apo.best_candidate"))} AS best_candidate
            FROM results x WHERE x.newest = 1
        )
        SELECT w.run_id, {j.integer("w.round")} AS round, {j.integer("w.candidate")} AS candidate, w.origin,
               NULLIF(w.template_name, '') AS template_name, w.status, w.reason,
               NULLIF(w.resources_id, '') AS resources_id, NULLIF(w.parent_resources_id, '') AS parent_resources_id,
               w.parents, w.critique, w.minibatch_score, w.parent_minibatch_score, w.val_score,
               {j.integer("w.val_tasks")} AS val_tasks, w.templates,
               CASE WHEN b.run_id IS NULL THEN NULL
                    WHEN b.best_candidate = {j.integer("w.candidate")} THEN 1 ELSE 0 END AS is_best,
               {j.integer("w.rollouts_spent")} AS rollouts_spent,
               {j.integer("w.optimizer_calls_spent")} AS optimizer_calls_spent,
               {j.big_integer("w.optimizer_tokens_spent")} AS optimizer_tokens_spent, w.time
        FROM writes w LEFT JOIN bests b ON b.run_id = w.run_id
        WHERE w.newest = 1"""


def _apo_runs(j: Json) -> str:
    """``apo_runs_v``: one row per APO run rollout; what its result span reports (NULL without one) next to
    what the store holds: the agent rollouts and optimizer LLM calls of the run."""

    def text(key: str) -> str:
        return j.string("x.attributes", f"apo.{key}")

    def number(key: str) -> str:
        return j.number("x.attributes", f"apo.{key}")

    numbers = (
        "seed",
        "best_candidate",
        "published_version",
        "seed_val_score",
        "best_val_score",
        "seed_test_score",
        "best_test_score",
        "test_tasks",
        "max_rollouts",
        "rollouts_spent",
        "test_rollouts_spent",
        "max_optimizer_calls",
        "optimizer_calls_spent",
        "optimizer_tokens_spent",
        "max_optimizer_tokens",
    )
    reported = ",\n                   ".join(f"{number(name)} AS {name}" for name in numbers)
    apo_run = j.string("r.metadata", "apo_run")
    split = j.string("r.metadata", "apo_split")
    tokens = j.big_integer(j.number_at("c.response", "usage", "total_tokens"))
    return f"""
        WITH runs AS (
            SELECT r.rollout_id AS run_id, r.status FROM rollouts r
            WHERE {j.string("r.metadata", "training_run")} = 'apo'
        ),
        results AS ({_newest_results()}
        ),
        reports AS (
            SELECT x.run_id, {text("search")} AS search, {text("best_resources_id")} AS best_resources_id,
                   {text("published_resources_id")} AS published_resources_id,
                   {reported}
            FROM results x WHERE x.newest = 1
        ),
        agents AS (
            SELECT {apo_run} AS run_id,
                   sum(CASE WHEN {split} IN ('train', 'val') THEN 1 ELSE 0 END) AS rollouts,
                   sum(CASE WHEN {split} = 'test' THEN 1 ELSE 0 END) AS test_rollouts
            FROM rollouts r WHERE {apo_run} IS NOT NULL GROUP BY {apo_run}
        )
        SELECT u.run_id, u.status, p.search, {j.big_integer("p.seed")} AS seed,
               {j.integer("p.best_candidate")} AS best_candidate,
               NULLIF(p.best_resources_id, '') AS best_resources_id,
               NULLIF(p.published_resources_id, '') AS published_resources_id,
               {j.integer("p.published_version")} AS published_version, p.seed_val_score, p.best_val_score,
               p.seed_test_score, p.best_test_score, {j.integer("p.test_tasks")} AS test_tasks,
               {j.integer("p.max_rollouts")} AS max_rollouts, {j.integer("p.rollouts_spent")} AS rollouts_spent,
               COALESCE(g.rollouts, 0) AS rollouts_in_store,
               {j.integer("p.test_rollouts_spent")} AS test_rollouts_spent,
               COALESCE(g.test_rollouts, 0) AS test_rollouts_in_store,
               {j.integer("p.max_optimizer_calls")} AS max_optimizer_calls,
               {j.integer("p.optimizer_calls_spent")} AS optimizer_calls_spent,
               (SELECT count(*) FROM llm_calls c WHERE c.rollout_id = u.run_id) AS optimizer_calls_in_store,
               {j.big_integer("p.optimizer_tokens_spent")} AS optimizer_tokens_spent,
               (SELECT COALESCE(CAST(sum({tokens}) AS BIGINT), 0) FROM llm_calls c
                WHERE c.rollout_id = u.run_id) AS optimizer_tokens_in_store,
               {j.big_integer("p.max_optimizer_tokens")} AS max_optimizer_tokens
        FROM runs u LEFT JOIN reports p ON p.run_id = u.run_id LEFT JOIN agents g ON g.run_id = u.run_id"""
