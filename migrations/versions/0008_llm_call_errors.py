"""LLM calls say when they are not trainable (``llm_calls.error``) and which llm resource served them
(``llm_calls.llm_resource``), both also in ``llm_calls_v``; the records an upstream's malformed answer broke are
repaired.

Before this revision the proxy stored what an upstream answered as it came: a logprob of ``NaN`` or ``-Infinity``
became a JSON ``null`` inside ``response_logprobs`` (Postgres), or text that is not JSON (SQLite), and reading
that rollout's calls failed from then on (``llm_calls/search`` answered 500, export crashed). A call recorded
without logprobs kept a JSON ``null`` where SQL ``NULL`` was meant, which export read as a broken array. The
upgrade:

- adds ``error`` (text, nullable): why a call is not a training transition, NULL for a trainable one, and
  ``llm_resource`` (varchar 128, nullable): the name of the llm resource that served the call;
- turns a JSON ``null`` in the nullable JSON columns into SQL ``NULL``;
- marks a call whose ``response_logprobs`` or token ids hold anything but finite numbers (token ids: integers in
  ``[0, 2³¹)``), or whose JSON columns are not valid JSON (SQLite), as not trainable: its ids emptied, its
  logprobs NULL, a JSON column that is not valid JSON kept as ``{"raw": <its text>}``, and ``error`` saying so;
- re-creates ``llm_calls_v`` with ``error`` and ``llm_resource`` as its last columns.

Downgrade drops the columns (the repaired values stay repaired).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

REPAIRED = "not trainable: recorded before revision 0008 with a malformed answer (logprobs or token ids)"
JSON_COLUMNS = ("response_logprobs", "request", "response", "sampling_parameters")
_apo_views = importlib.import_module("migrations.versions.0003_prompt_candidates")


def _view(dialect: str, *, with_error: bool) -> str:
    sql: str = _apo_views._views(dialect)["llm_calls_v"]
    if not with_error:
        return sql
    head, tail = sql.split("\n            FROM llm_calls c")
    return f"{head}, c.error, c.llm_resource\n            FROM llm_calls c{tail}"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW IF EXISTS llm_calls_v")
    op.add_column("llm_calls", sa.Column("error", sa.Text(), nullable=True))
    op.add_column("llm_calls", sa.Column("llm_resource", sa.String(128), nullable=True))
    if dialect == "postgresql":
        _repair_postgres()
    else:
        _repair_sqlite()
    op.execute(f"CREATE VIEW llm_calls_v AS {_view(dialect, with_error=True)}")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW IF EXISTS llm_calls_v")
    for column in ("llm_resource", "error"):  # SQLite too (3.35+), without rebuilding the table
        op.execute(f"ALTER TABLE llm_calls DROP COLUMN {column}")
    op.execute(f"CREATE VIEW llm_calls_v AS {_view(dialect, with_error=False)}")


def _repair_postgres() -> None:
    for column in JSON_COLUMNS:
        op.execute(f"UPDATE llm_calls SET {column} = NULL WHERE jsonb_typeof({column}) = 'null'")
    bad_id = '$[*] ? (@.type() != "number" || @ < 0 || @ > 2147483647 || @ != @.floor())'
    op.execute(
        f"""UPDATE llm_calls SET prompt_token_ids = '[]', response_token_ids = '[]', response_logprobs = NULL,
                error = '{REPAIRED}'
            WHERE jsonb_path_exists(response_logprobs, '$[*] ? (@.type() != "number")')
               OR jsonb_path_exists(prompt_token_ids, '{bad_id}')
               OR jsonb_path_exists(response_token_ids, '{bad_id}')"""
    )


def _repair_sqlite() -> None:
    for column in JSON_COLUMNS:
        op.execute(f"UPDATE llm_calls SET {column} = NULL WHERE {column} = 'null'")

    def broken_numbers(column: str, good: str) -> str:
        return (
            f"(CASE WHEN json_valid({column}) THEN EXISTS (SELECT 1 FROM json_each({column}) WHERE NOT ({good})) "
            "ELSE 1 END)"
        )

    token = "type = 'integer' AND value BETWEEN 0 AND 2147483647"
    number = "type IN ('integer', 'real')"
    invalid = " OR ".join(f"({column} IS NOT NULL AND NOT json_valid({column}))" for column in JSON_COLUMNS)
    op.execute(
        f"""UPDATE llm_calls SET error = '{REPAIRED}'
            WHERE ({invalid})
               OR (response_logprobs IS NOT NULL AND {broken_numbers("response_logprobs", number)})
               OR {broken_numbers("prompt_token_ids", token)} OR {broken_numbers("response_token_ids", token)}"""
    )
    op.execute(
        "UPDATE llm_calls SET prompt_token_ids = '[]', response_token_ids = '[]', response_logprobs = NULL "
        f"WHERE error = '{REPAIRED}'"
    )
    for column in ("request", "response", "sampling_parameters"):
        op.execute(
            f"UPDATE llm_calls SET {column} = json_object('raw', {column}) "
            f"WHERE {column} IS NOT NULL AND NOT json_valid({column})"
        )
