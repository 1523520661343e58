"""The Alembic revisions: one head, a clean upgrade/downgrade cycle, models that match the migrated schema, and
read-only views that compute what their column names say. Every check runs on SQLite and on Postgres."""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from lightning_store import migrate
from lightning_store.models import RolloutConfig
from lightning_store.spans import Span, TraceStatus
from lightning_store.sql import SqlStore, open_store
from lightning_store.sql.engine import make_engine
from lightning_store.sql.schema import llm_calls, metadata, resource_versions
from lightning_store.sql.schema import resources as resources_table
from tests.postgres import TemplateDatabases

TABLES = {"rollouts", "attempts", "spans", "resources", "workers", "llm_calls", "resource_versions"}
VIEWS = {
    "rollouts_v",
    "attempts_v",
    "spans_v",
    "llm_calls_v",
    "rewards_v",
    "training_steps_v",
    "prompt_candidates_v",
    "apo_runs_v",
    "resource_versions_v",
}
APO_VIEWS = {"prompt_candidates_v", "apo_runs_v"}
HISTORY = ({"resource_versions"}, {"resource_versions_v"})
"""What revision 0006 adds: the resources history table and its view."""
EXPRESSION_INDEX = "ix_spans_reward"
BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
async def empty_engine(
    request: pytest.FixtureRequest, tmp_path: Path, pg_templates: TemplateDatabases | None
) -> AsyncIterator[AsyncEngine]:
    """An engine over a database with nothing in it: no tables, no alembic_version."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
        yield engine
        await engine.dispose()
        return
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = await pg_templates.clone(migrated=False)
    engine = make_engine(url)
    yield engine
    await engine.dispose()
    await pg_templates.drop(url)


@pytest.fixture
async def view_store(database_url: str) -> AsyncIterator[SqlStore]:
    store = await open_store(database_url, migrate=True, watchdog=False)
    yield store
    await store.close()


async def schema_objects(engine: AsyncEngine) -> tuple[set[str], set[str]]:
    """The (tables, views) of the database's default schema, alembic's own bookkeeping table left out."""

    def inspect(conn: Connection) -> tuple[set[str], set[str]]:
        inspector = sa.inspect(conn)
        return set(inspector.get_table_names()) - {"alembic_version"}, set(inspector.get_view_names())

    async with engine.connect() as conn:
        return await conn.run_sync(inspect)


async def assert_migrated(engine: AsyncEngine) -> None:
    assert await migrate.current_revision(engine) == migrate.head_revision()
    tables, views = await schema_objects(engine)
    assert tables == TABLES
    assert views == VIEWS
    async with engine.connect() as conn:
        for name in sorted(TABLES | VIEWS):
            assert (await conn.execute(sa.text(f"SELECT count(*) FROM {name}"))).scalar_one() == 0


# (a) -----------------------------------------------------------------------------------------------------------


def test_there_is_exactly_one_head() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    heads = script.get_heads()
    assert len(heads) == 1, f"several Alembic heads, merge them: {heads}"
    assert heads[0] == migrate.head_revision()
    # Every revision is reachable from the head down to base: no orphaned branch.
    assert {rev.revision for rev in script.walk_revisions()} == {
        rev.revision for rev in script.iterate_revisions(heads[0], "base")
    }


# (b) -----------------------------------------------------------------------------------------------------------


async def test_upgrade_downgrade_upgrade(empty_engine: AsyncEngine) -> None:
    assert await migrate.current_revision(empty_engine) is None
    assert await schema_objects(empty_engine) == (set(), set())

    await migrate.upgrade(empty_engine)
    await assert_migrated(empty_engine)

    await migrate.downgrade(empty_engine, "base")
    assert await migrate.current_revision(empty_engine) is None
    assert await schema_objects(empty_engine) == (set(), set())

    await migrate.upgrade(empty_engine)
    await assert_migrated(empty_engine)


async def test_upgrade_is_a_no_op_at_head(empty_engine: AsyncEngine) -> None:
    await migrate.upgrade(empty_engine)
    await migrate.upgrade(empty_engine)
    await assert_migrated(empty_engine)


async def view_columns(engine: AsyncEngine, view: str) -> list[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda sync_conn: [c["name"] for c in sa.inspect(sync_conn).get_columns(view)])


async def test_downgrade_to_0001_restores_its_views(empty_engine: AsyncEngine) -> None:
    # 0002 replaces three of 0001's views and adds training_steps_v; stepping back gives 0001's views unchanged.
    await migrate.upgrade(empty_engine)
    assert "resources_version" in await view_columns(empty_engine, "rewards_v")
    await migrate.downgrade(empty_engine, "0001")
    assert await migrate.current_revision(empty_engine) == "0001"
    assert await schema_objects(empty_engine) == (
        TABLES - HISTORY[0],
        VIEWS - APO_VIEWS - HISTORY[1] - {"training_steps_v"},
    )
    assert await view_columns(empty_engine, "rewards_v") == [
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "span_id",
        "mode",
        "resources_id",
        "reward_name",
        "reward",
        "time",
    ]
    assert "status_message" not in await view_columns(empty_engine, "spans_v")
    assert "step" not in await view_columns(empty_engine, "rollouts_v")
    await migrate.upgrade(empty_engine)
    await assert_migrated(empty_engine)


async def test_downgrade_to_0002_restores_its_views(empty_engine: AsyncEngine) -> None:
    # 0003 adds the APO views and two columns at the end of llm_calls_v (0008 one more after them); stepping back
    # gives 0002's views.
    await migrate.upgrade(empty_engine)
    usage = ["usage_prompt_tokens", "usage_completion_tokens", "error", "llm_resource"]
    assert (await view_columns(empty_engine, "llm_calls_v"))[-4:] == usage
    await migrate.downgrade(empty_engine, "0002")
    assert await migrate.current_revision(empty_engine) == "0002"
    assert await schema_objects(empty_engine) == (TABLES - HISTORY[0], VIEWS - APO_VIEWS - HISTORY[1])
    columns = await view_columns(empty_engine, "llm_calls_v")
    assert columns[-1] == "latency_seconds" and not set(usage) & set(columns)
    await migrate.upgrade(empty_engine)
    await assert_migrated(empty_engine)


async def test_0006_starts_the_resources_history_at_each_ids_latest_version(empty_engine: AsyncEngine) -> None:
    # Before 0006 the store kept only the latest content of an id: the upgrade copies that in, nothing more.
    await migrate.upgrade(empty_engine, "0005")
    rows = [
        {"resources_id": "prompts", "create_time": 10.0, "update_time": 30.0, "version": 3, "resources": {"p": 1}},
        {"resources_id": "rs-1", "create_time": 20.0, "update_time": 20.0, "version": 1, "resources": {}},
    ]
    async with empty_engine.begin() as conn:
        await conn.execute(sa.insert(resources_table), rows)
    await migrate.upgrade(empty_engine)
    async with empty_engine.connect() as conn:
        history = (await conn.execute(sa.select(resource_versions).order_by(resource_versions.c.pk))).mappings().all()
    assert [(h["resources_id"], h["version"], h["time"], h["resources"]) for h in history] == [
        ("prompts", 3, 30.0, {"p": 1}),
        ("rs-1", 1, 20.0, {}),
    ]
    await migrate.downgrade(empty_engine, "0005")
    assert await schema_objects(empty_engine) == (TABLES - HISTORY[0], VIEWS - HISTORY[1])


# (c) -----------------------------------------------------------------------------------------------------------


async def test_models_match_the_migrated_schema(empty_engine: AsyncEngine) -> None:
    await migrate.upgrade(empty_engine)

    def compare(conn: Connection) -> list[Any]:
        # compare_server_default is off by default; ask for it so that a drifted default is caught too. One
        # object is left out: ix_spans_reward (revision 0005), an index on rewards_v's reward expression, which
        # the metadata cannot state once for both dialects and SQLAlchemy does not reflect on SQLite. (Alembic
        # ignores views and does not compare partial-index predicates, so neither adds noise.)
        def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
            return not (type_ == "index" and name == EXPRESSION_INDEX)

        opts = {"compare_type": True, "compare_server_default": True, "include_object": include}
        context = MigrationContext.configure(conn, opts=opts)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", f"Skipped unsupported reflection of expression-based index {EXPRESSION_INDEX}"
            )
            return list(compare_metadata(context, metadata))

    async with empty_engine.connect() as conn:
        differences = await conn.run_sync(compare)
    assert differences == []


# (d) -----------------------------------------------------------------------------------------------------------


async def rows(store: SqlStore, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with store.engine.connect() as conn:
        return [dict(row) for row in (await conn.execute(sa.text(sql), params)).mappings()]


def span(rollout_id: str, attempt_id: str, sequence_id: int, name: str, **fields: Any) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id="0" * 31 + "1",
        span_id=f"{sequence_id:016x}",
        name=name,
        start_time=1000.0 + sequence_id,
        end_time=1000.5 + sequence_id,
        **fields,
    )


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_views_compute_what_they_claim(view_store: SqlStore) -> None:
    store = view_store
    config = RolloutConfig(max_attempts=2, retry_condition=["failed"])
    rollout = await store.enqueue_rollout({"q": "2+2"}, mode="train", config=config)

    first = await store.dequeue_rollout(worker_id="w1")
    assert first is not None and first.rollout_id == rollout.rollout_id
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="failed")
    second = await store.dequeue_rollout(worker_id="w2")
    assert second is not None and second.rollout_id == rollout.rollout_id
    attempt_id = second.attempt.attempt_id
    # Enqueued last so that the requeued rollout is the one dequeued above (a requeue goes to the tail).
    waiting = await store.enqueue_rollout({"q": "3+3"}, mode="val")

    reward = span(
        rollout.rollout_id,
        attempt_id,
        1,
        "agentlightning.annotation",
        status=TraceStatus(status_code="OK"),
        attributes={"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5},
    )
    failed = span(rollout.rollout_id, attempt_id, 2, "tool", status=TraceStatus(status_code="ERROR"))
    plain = span(rollout.rollout_id, attempt_id, 3, "llm", attributes={"gen_ai.request.model": "m"})
    assert len(await store.add_many_spans([reward, failed, plain])) == 3
    await store.update_attempt(rollout.rollout_id, attempt_id, status="succeeded")

    async with store.engine.begin() as conn:
        await conn.execute(
            sa.insert(llm_calls).values(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt_id,
                span_id=plain.span_id,
                sequence_id=3,
                model="m",
                prompt_token_ids=[1, 2, 3, 4],
                response_token_ids=[5, 6],
                start_time=time.time(),
            )
        )

    stored = await store.get_rollout_by_id(rollout.rollout_id)
    assert stored is not None and stored.status == "succeeded" and stored.end_time is not None

    assert await rows(store, "SELECT rollout_id, attempt_id, span_id, mode, reward_name, reward FROM rewards_v") == [
        {
            "rollout_id": rollout.rollout_id,
            "attempt_id": attempt_id,
            "span_id": reward.span_id,
            "mode": "train",
            "reward_name": "primary",
            "reward": 0.5,
        }
    ]

    by_rollout = {
        row["rollout_id"]: row
        for row in await rows(
            store,
            "SELECT rollout_id, status, num_attempts, latest_attempt_id, latest_attempt_status, latest_worker_id,"
            " duration_seconds FROM rollouts_v",
        )
    }
    assert set(by_rollout) == {rollout.rollout_id, waiting.rollout_id}
    done = by_rollout[rollout.rollout_id]
    assert done["status"] == "succeeded"
    assert done["num_attempts"] == 2
    assert done["latest_attempt_id"] == attempt_id
    assert done["latest_attempt_status"] == "succeeded"
    assert done["latest_worker_id"] == "w2"
    assert done["duration_seconds"] == pytest.approx(stored.end_time - stored.start_time)
    assert done["duration_seconds"] >= 0
    assert by_rollout[waiting.rollout_id] == {
        "rollout_id": waiting.rollout_id,
        "status": "queuing",
        "num_attempts": 0,
        "latest_attempt_id": None,
        "latest_attempt_status": None,
        "latest_worker_id": None,
        "duration_seconds": None,
    }

    attempt_rows = await rows(store, "SELECT sequence_id, status, worker_id, mode FROM attempts_v ORDER BY sequence_id")
    assert attempt_rows == [
        {"sequence_id": 1, "status": "failed", "worker_id": "w1", "mode": "train"},
        {"sequence_id": 2, "status": "succeeded", "worker_id": "w2", "mode": "train"},
    ]

    span_rows = await rows(
        store,
        "SELECT sequence_id, name, status_code, attempt_sequence_id, duration_seconds FROM spans_v"
        " ORDER BY sequence_id",
    )
    assert span_rows == [
        {
            "sequence_id": 1,
            "name": "agentlightning.annotation",
            "status_code": "OK",
            "attempt_sequence_id": 2,
            "duration_seconds": 0.5,
        },
        {"sequence_id": 2, "name": "tool", "status_code": "ERROR", "attempt_sequence_id": 2, "duration_seconds": 0.5},
        {"sequence_id": 3, "name": "llm", "status_code": "UNSET", "attempt_sequence_id": 2, "duration_seconds": 0.5},
    ]

    assert await rows(store, "SELECT rollout_id, span_id, mode, prompt_tokens, response_tokens FROM llm_calls_v") == [
        {
            "rollout_id": rollout.rollout_id,
            "span_id": plain.span_id,
            "mode": "train",
            "prompt_tokens": 4,
            "response_tokens": 2,
        }
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_rewards_view_reads_a_legacy_reward_span(view_store: SqlStore) -> None:
    # Older emitters put a plain "reward" attribute on a span named agentlightning.reward; the same attribute on
    # any other span is not a reward (it may mean something else there).
    store = view_store
    await store.enqueue_rollout({"q": 1})
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
    await store.add_many_spans(
        [
            span(rollout_id, attempt_id, 1, "agentlightning.reward", attributes={"reward": 1.0}),
            span(rollout_id, attempt_id, 2, "judge", attributes={"reward": 0.25}),
        ]
    )
    assert await rows(store, "SELECT sequence_id, reward_name, reward FROM rewards_v") == [
        {"sequence_id": 1, "reward_name": None, "reward": 1.0}
    ]


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_rewards_view_ignores_non_numeric_rewards(view_store: SqlStore) -> None:
    # Before the guard in _views() one such span made the whole view fail on Postgres ("invalid input syntax for
    # type double precision") and showed up as a 0.0 reward on SQLite.
    store = view_store
    await store.enqueue_rollout({"q": 1})
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
    await store.add_many_spans(
        [
            span(rollout_id, attempt_id, 1, "agentlightning.reward", attributes={"reward": "high"}),
            span(rollout_id, attempt_id, 2, "judge", attributes={"agentlightning.reward.0.value": "0.9"}),
            span(rollout_id, attempt_id, 3, "judge", attributes={"agentlightning.reward.0.value": [1]}),
            span(rollout_id, attempt_id, 4, "reward", attributes={"agentlightning.reward.0.value": 0.5}),
        ]
    )
    assert await rows(store, "SELECT sequence_id, reward FROM rewards_v") == [{"sequence_id": 4, "reward": 0.5}]
