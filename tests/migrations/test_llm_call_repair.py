"""Revision 0008 repairs the LLM-call records that malformed upstream answers broke before it (issue 39, defects
2 and 3): what the proxy stored then (a JSON null inside ``response_logprobs`` on Postgres, ``NaN`` text on
SQLite, a JSON ``null`` for "no logprobs") reads back after the upgrade, through the store and ``store export``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from lightning_store import migrate
from lightning_store.sql import open_store
from lightning_store.sql.engine import make_engine
from tests.export_store import read_jsonl, run_export
from tests.postgres import TemplateDatabases

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
async def url(request: pytest.FixtureRequest, tmp_path: Path, pg_templates: TemplateDatabases | None) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    return await pg_templates.clone(migrated=False)


async def test_0008_makes_broken_records_readable_and_marks_them_not_trainable(url: str, tmp_path: Path) -> None:
    store = await open_store(url, migrate=True, watchdog=False)
    rollout = await store.start_rollout({"task": 1})
    postgres = store.engine.dialect.name == "postgresql"
    await store.close()
    engine = make_engine(url)
    try:
        await migrate.downgrade(engine, "0007")
        # What the proxy wrote before 0008: Postgres had a JSON null where NaN was; SQLite had NaN as text.
        nan_logprobs = "[-0.5, null]" if postgres else "[-0.5, NaN]"
        nan_response = '{"choices": [{"logprobs": {"content": [{"logprob": null}]}}]}'
        if not postgres:
            nan_response = nan_response.replace("null", "NaN")
        cast = "CAST(:{0} AS jsonb)" if postgres else ":{0}"
        columns = ("prompt_token_ids", "response_token_ids", "response_logprobs", "request", "response")
        values = ", ".join(cast.format(c) for c in columns)
        insert = sa.text(
            f"INSERT INTO llm_calls (rollout_id, attempt_id, span_id, sequence_id, {', '.join(columns)}, start_time) "
            f"VALUES (:rollout_id, :attempt_id, :span_id, :sequence_id, {values}, 1.0)"
        )
        ids = {"rollout_id": rollout.rollout_id, "attempt_id": rollout.attempt.attempt_id}
        rows = [
            # trainable, recorded without logprobs (a JSON null, not SQL NULL)
            {"span_id": "plain", "sequence_id": 1, "prompt_token_ids": "[1, 2]", "response_token_ids": "[3]",
             "response_logprobs": "null", "request": "{}", "response": "null"},
            # a NaN logprob
            {"span_id": "nan", "sequence_id": 2, "prompt_token_ids": "[1, 2]", "response_token_ids": "[3, 4]",
             "response_logprobs": nan_logprobs, "request": "{}", "response": nan_response},
            # a token id beyond 32 bits
            {"span_id": "big", "sequence_id": 3, "prompt_token_ids": "[1, 4294967296]",
             "response_token_ids": "[3]", "response_logprobs": "[-1.0]", "request": "{}", "response": "{}"},
        ]  # fmt: skip
        async with engine.begin() as conn:
            await conn.execute(insert, [{**ids, **row} for row in rows])
        await migrate.upgrade(engine)
    finally:
        await engine.dispose()

    store = await open_store(url, migrate=False, watchdog=False)
    try:
        calls = {c.span_id: c for c in await store.query_llm_calls([rollout.rollout_id])}
    finally:
        await store.close()
    assert calls["plain"].error is None and calls["plain"].response_logprobs is None
    assert calls["plain"].response_token_ids == [3] and calls["plain"].response is None
    for broken in ("nan", "big"):
        assert "revision 0008" in (calls[broken].error or "")
        assert calls[broken].prompt_token_ids == [] == calls[broken].response_token_ids
        assert calls[broken].response_logprobs is None
    if not postgres:  # the text that was not JSON is kept, as a string
        assert calls["nan"].response == {"raw": nan_response}

    out = tmp_path / "export"
    result = await asyncio.to_thread(run_export, url, out, "--what", "llm_calls", "--format", "jsonl", quick=True)
    assert result.returncode == 0, result.stdout + result.stderr
    exported = {row["span_id"]: row for row in read_jsonl(out / "llm_calls.jsonl")}
    assert exported["plain"]["response_logprobs"] is None and exported["nan"]["error"] == calls["nan"].error
    assert json.loads(json.dumps(exported))  # plain JSON throughout
