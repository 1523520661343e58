"""The dashboard's training-runs and resources pages against the views, on SQLite and Postgres: a real ``store
serve`` over a store that holds an RL run (resumed once) and an APO run written as the trainers write them
(``tests/integration/dashboard_fill.py``); every number a page shows is compared with SQL on the same database."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa

from algorithms.session import MetricsLog
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving
from tests.integration.dashboard_fill import (
    HOSTILE,
    INVALID_CLASSIFY,
    PUBLISH_ID,
    REWRITE_CHECKER,
    REWRITE_CLASSIFY,
    RL_RUN,
    SEED_CHECKER,
    SEED_CLASSIFY,
    UNTRAINED_STEP,
    Filled,
    fill,
)
from tests.integration.dashboard_html import Element, number, parse

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
STEP_COLUMNS = (
    *("reward_mean", "reward_std", "val_reward", "val_rollouts", "loss", "pg_loss", "kl", "entropy", "grad_norm"),
    *("trained_transitions", "step_seconds", "resources_version", "time", "step"),
)


@dataclass
class Site:
    store: SqlStore
    http: httpx.AsyncClient
    filled: Filled

    async def sql(self, statement: str, **params: Any) -> list[dict[str, Any]]:
        async with self.store.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(sa.text(statement), params)).mappings()]

    async def page(self, path: str, status: int = 200) -> Element:
        response = await self.http.get(path)
        assert response.status_code == status, (path, response.status_code, response.text[:500])
        assert response.headers["content-type"].startswith("text/html")
        return parse(response.text)


@pytest.fixture
async def site(database_url: str) -> AsyncIterator[Site]:
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    filled = await fill(store)
    async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield Site(store, http, filled)
    await store.close()


@pytest.fixture
async def empty_site(database_url: str) -> AsyncIterator[Site]:
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    async with serving(store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        yield Site(store, http, Filled())
    await store.close()


def metrics_of(row: dict[str, Any]) -> dict[str, Any]:
    value = row["metrics"]
    parsed: dict[str, Any] = json.loads(value) if isinstance(value, str) else value
    return parsed


def last(rows: Sequence[dict[str, Any]], read: Any) -> Any:
    values = [read(r) for r in rows if read(r) is not None]
    return values[-1] if values else None


async def test_the_runs_list_shows_both_runs_newest_first_as_the_views_count_them(site: Site) -> None:
    page = await site.page("/dashboard/runs")
    rows = page.testids("run-row")
    assert [(r.attrs["data-run-id"], r.attrs["data-kind"]) for r in rows] == [
        (site.filled.apo_run_id, "apo"),
        (site.filled.rl_run_id, "rl"),
    ]
    steps = await site.sql("SELECT * FROM training_steps_v WHERE run_id = :r ORDER BY step", r=site.filled.rl_run_id)
    rl = rows[1].cells()
    assert number(rl["steps"].attrs["data-value"]) == len(steps) == 5
    assert number(rl["last_reward_mean"].attrs["data-value"]) == last(steps, lambda r: r["reward_mean"])
    assert number(rl["best_val_reward"].attrs["data-value"]) == max(r["val_reward"] or 0 for r in steps)
    assert "succeeded" in rl["status"].text()  # the resumed rollout's, the newest of the run
    (apo_row,) = await site.sql("SELECT * FROM apo_runs_v")
    apo = rows[0].cells()
    assert number(apo["best_val_score"].attrs["data-value"]) == apo_row["best_val_score"]
    assert apo["optimizer_calls_spent"].text() == str(apo_row["optimizer_calls_spent"])
    assert f"/dashboard/runs/{site.filled.rl_run_id}" in page.hrefs()


async def test_an_rl_run_page_shows_every_step_and_latest_metric_of_training_steps_v(site: Site) -> None:
    run_id = site.filled.rl_run_id
    page = await site.page(f"/dashboard/runs/{run_id}")
    steps = await site.sql("SELECT * FROM training_steps_v WHERE run_id = :r ORDER BY step", r=run_id)
    rows = page.testids("step-row")
    assert [int(r.attrs["data-step"]) for r in rows] == [s["step"] for s in steps] == [0, 1, 2, 3, 4]
    for row, step in zip(rows, steps, strict=True):
        cells = row.cells()
        assert cells["training_rollout_id"].attrs["data-value"] == step["training_rollout_id"]
        for column in STEP_COLUMNS:
            assert number(cells[column].attrs["data-value"]) == step[column], (step["step"], column)
        shown = {e.attrs["data-metric"] for e in row.all(lambda e: "data-metric" in e.attrs)}
        assert shown == set(metrics_of(step))
    # Step 2 was written twice: its training metrics from the first rollout, its evaluation from the resumed one.
    assert steps[2]["training_rollout_id"] == site.filled.rl_resumed_id and steps[2]["val_reward"] == 0.45
    for name in ("reward_mean", "reward_std", "val_reward", "kl", "loss", "pg_loss", "entropy", "step_seconds"):
        shown_last = number(page.testid(f"metric-{name}-last").attrs["data-value"])
        assert shown_last == last(steps, lambda r, n=name: r[n]), name
    for name in ("staleness_max", "stale_dropped", "collect_seconds"):
        expected = last(steps, lambda r, n=name: metrics_of(r).get(n))
        assert number(page.testid(f"metric-{name}-last").attrs["data-value"]) == expected, name
    charts = {
        e.attrs["id"]: json.loads(e.text()) for e in page.all(lambda e: e.attrs.get("id", "").startswith("chart-"))
    }
    assert {e.attrs["data-chart"] for e in page.all(lambda e: "data-chart" in e.attrs)} == {c[6:] for c in charts}
    assert {"chart-reward", "chart-val", "chart-kl", "chart-loss", "chart-entropy", "chart-staleness"} <= set(charts)
    assert charts["chart-val"] == {
        "x": [0, 1, 2, 3, 4],
        "series": {"val_reward": [s["val_reward"] for s in steps]},
        "x_label": "step",
    }
    # Its rollouts (the first and the resumed one), and the spans of both, linked to the rollout page.
    listed = [li.attrs["data-rollout-id"] for li in page.testid("run-rollouts").all(lambda e: e.tag == "li")]
    assert listed == [run_id, site.filled.rl_resumed_id]
    spans = await site.sql(
        "SELECT rollout_id, span_id FROM spans_v WHERE rollout_id IN (:a, :b)", a=run_id, b=listed[1]
    )
    links = {e.attrs["href"] for e in page.testids("span-link")}
    assert links == {f"/dashboard/rollouts/{s['rollout_id']}#span-{s['span_id']}" for s in spans} and len(links) == 7
    assert page.testid("run-calls-empty")
    # What the run is: the options and what Trainer wrote beside them; the step that trained nothing stands out.
    options = {e.attrs["data-name"]: json.loads(e.text()) for e in page.testids("run-option")}
    assert options == {"learning_rate": 1e-5, "group_size": 2, "optimizer.betas": [0.9, 0.99]}
    assert page.testid("run-model").text() == RL_RUN["model"]
    assert page.testid("run-agent").text().startswith(f"{RL_RUN['agent']} (2 runner workers")
    assert page.testid("run-tasks").text() == "train 8 · val 4 · test 0"
    assert page.testid("run-untrained").attrs["data-value"] == "1"
    flagged = [int(r.attrs["data-step"]) for r in rows if r.attrs.get("data-untrained") == "1"]
    assert flagged == [UNTRAINED_STEP]
    # The resumed rollout's id leads to the run it continues.
    response = await site.http.get(f"/dashboard/runs/{site.filled.rl_resumed_id}")
    assert response.status_code == 307 and response.headers["location"] == f"/dashboard/runs/{run_id}"


async def test_an_apo_run_page_shows_its_candidates_rounds_and_budget_as_the_views_do(site: Site) -> None:
    run_id = site.filled.apo_run_id
    response = await site.http.get(f"/dashboard/runs/{run_id}")
    page = parse(response.text)
    candidates = await site.sql(
        "SELECT * FROM prompt_candidates_v WHERE run_id = :r ORDER BY round, candidate", r=run_id
    )
    rows = page.testids("candidate-row")
    assert [int(r.attrs["data-candidate"]) for r in rows] == [c["candidate"] for c in candidates] == [0, 1, 2, 3, 4, 5]
    for row, candidate in zip(rows, candidates, strict=True):
        cells = row.cells()
        for column in ("origin", "template_name", "status", "reason", "resources_id"):
            assert cells[column].attrs["data-value"] == (candidate[column] or ""), column
        for column in ("minibatch_score", "parent_minibatch_score", "val_score", "is_best"):
            assert number(cells[column].attrs["data-value"]) == candidate[column], column
        if candidate["resources_id"]:
            assert f"/dashboard/rollouts?resources_id={candidate['resources_id']}" in row.hrefs()
    assert [c["status"] for c in candidates] == ["seed", "accepted", "accepted", "invalid", "rejected", "accepted"]
    merge = rows[5].cells()["parents"]
    assert [e.attrs["href"] for e in merge.testids("parent-link")] == ["#candidate-1", "#candidate-2"]
    assert [
        (li.attrs["data-candidate"], li.attrs["data-depth"])
        for li in page.testid("lineage").all(lambda e: e.tag == "li")
    ] == [("0", "0"), ("1", "1"), ("3", "2"), ("4", "2"), ("5", "2"), ("2", "1")]
    # The critique and the templates are the model's text, shown as text: nothing of them is markup.
    assert "<script>alert" not in response.text and "<b>bold</b>" not in response.text
    critiques = [e.text() for e in page.testids("critique")]
    assert any(HOSTILE in text for text in critiques)
    shown = [e for e in page.all(lambda e: e.attrs.get("data-template") == "classify")]
    assert {e.text() for e in shown} == {SEED_CLASSIFY, REWRITE_CLASSIFY, INVALID_CLASSIFY}
    (apo,) = await site.sql("SELECT * FROM apo_runs_v WHERE run_id = :r", r=run_id)
    for column in ("seed_val_score", "best_val_score", "best_candidate"):
        assert number(page.testid(f"apo-{column}").attrs["data-value"]) == apo[column], column
    for column in ("optimizer_calls_spent", "optimizer_calls_in_store", "optimizer_tokens_spent", "rollouts_spent"):
        assert page.testid(f"apo-{column}").text() == str(apo[column]), column
    rounds = await site.sql("SELECT * FROM training_steps_v WHERE run_id = :r ORDER BY step", r=run_id)
    assert len(page.testids("step-row")) == len(rounds) == 6
    for name in ("candidates_accepted", "candidates_rejected", "candidates_invalid", "pool_size", "optimizer_calls"):
        expected = last(rounds, lambda r, n=name: metrics_of(r).get(n))
        assert number(page.testid(f"metric-{name}-last").attrs["data-value"]) == expected, name
    assert number(page.testid("metric-val_reward-last").attrs["data-value"]) == rounds[-1]["val_reward"] == 1.0
    calls = await site.sql(
        "SELECT span_id, agent_name FROM llm_calls_v WHERE rollout_id = :r ORDER BY start_time", r=run_id
    )
    shown_calls = page.testids("call-row")
    assert [c.attrs["data-span-id"] for c in shown_calls] == [c["span_id"] for c in calls] and len(calls) == 8
    assert [c.cells()["agent_name"].text() for c in shown_calls] == [c["agent_name"] for c in calls]
    assert {c["agent_name"] for c in calls} == {"apo.critique", "apo.edit"}
    assert {e.attrs["href"] for e in page.testids("call-link")} == {
        f"/dashboard/rollouts/{run_id}#call-{c['span_id']}" for c in calls
    }
    assert len(page.testids("span-row")) == 13  # 6 candidates, 6 rounds, 1 result


async def test_resources_pages_count_versions_and_rollouts_and_diff_the_prompts(site: Site) -> None:
    page = await site.page("/dashboard/resources")
    stored = await site.store.query_resources()
    counts = {
        r["resources_id"]: r["n"]
        for r in await site.sql("SELECT resources_id, count(*) AS n FROM rollouts_v GROUP BY resources_id")
    }
    rows = {r.attrs["data-resources-id"]: r.cells() for r in page.testids("resources-row")}
    assert set(rows) == {r.resources_id for r in stored.items}
    for snapshot in stored.items:
        cells = rows[snapshot.resources_id]
        assert int(cells["version"].attrs["data-value"]) == snapshot.version
        assert int(cells["rollouts"].attrs["data-value"]) == counts.get(snapshot.resources_id, 0)
    # The policy: one row per version something ran on, with the rollouts of rollouts_v.
    policy = await site.page("/dashboard/resources/policy")
    by_version = {
        r["resources_version"]: r["n"]
        for r in await site.sql(
            "SELECT resources_version, count(*) AS n FROM rollouts_v WHERE resources_id = 'policy' "
            "GROUP BY resources_version"
        )
    }
    shown = {
        r.attrs["data-version"]: int(r.cells()["rollouts"].attrs["data-value"]) for r in policy.testids("version-row")
    }
    # Every version the store wrote is listed (resource_versions_v), with what ran on it.
    written = {str(v): 0 for v in range(1, 8)}
    assert shown == written | {("" if v is None else str(v)): n for v, n in by_version.items()}
    assert "/dashboard/rollouts?resources_id=policy&resources_version=2" in policy.hrefs()
    assert not policy.testids("diff-parent") and not policy.testids("no-parent")  # no prompt templates
    # What the APO run published (version 2), against the version before it (the seed): exactly the changed lines.
    prompts = await site.page(f"/dashboard/resources/{PUBLISH_ID}")
    assert prompts.testid("parent-version-link").attrs["href"] == f"/dashboard/resources/{PUBLISH_ID}?version=1"
    diffs = {s.attrs["data-name"]: s for s in prompts.testids("resource") if s.attrs["data-type"] == "prompt_template"}
    assert [e.text() for e in diffs["classify"].testids("diff-added")] == REWRITE_CLASSIFY.splitlines()[1::2]
    assert [e.text() for e in diffs["classify"].testids("diff-removed")] == [SEED_CLASSIFY.splitlines()[1]]
    assert [e.text() for e in diffs["checker"].testids("diff-added")] == [REWRITE_CHECKER.splitlines()[0]]
    assert [e.text() for e in diffs["checker"].testids("diff-removed")] == [SEED_CHECKER.splitlines()[0]]
    # A candidate against its parent candidate: the accepted rewrite changed classify only.
    accepted = await site.page(f"/dashboard/resources/{site.filled.candidates['accepted']}")
    sections = {s.attrs["data-name"]: s for s in accepted.testids("resource")}
    assert [e.text() for e in sections["classify"].testids("diff-added")] == REWRITE_CLASSIFY.splitlines()[1::2]
    assert sections["checker"].testid("unchanged") and not sections["checker"].testids("diff-added")


async def test_pages_of_an_empty_store_say_how_to_fill_it(empty_site: Site) -> None:
    assert "store train" in (await empty_site.page("/dashboard/runs")).testid("runs-empty").text()
    assert "set-prompt" in (await empty_site.page("/dashboard/resources")).testid("resources-empty").text()
    log = await MetricsLog.start(empty_site.store, "grpo", {})
    runs = await empty_site.page("/dashboard/runs")
    (row,) = runs.testids("run-row")
    assert row.attrs["data-run-id"] == log.run.rollout_id and row.cells()["steps"].attrs["data-value"] == "0"
    assert (await empty_site.page(f"/dashboard/runs/{log.run.rollout_id}")).testid("steps-empty")
    apo = await MetricsLog.start(empty_site.store, "apo", {})  # an APO run that has recorded nothing yet
    page = await empty_site.page(f"/dashboard/runs/{apo.run.rollout_id}")
    assert page.testid("apo-no-result") and page.testid("candidates-empty") and page.testid("run-calls-empty")
    kinds = [r.attrs["data-kind"] for r in (await empty_site.page("/dashboard/runs")).testids("run-row")]
    assert kinds == ["apo", "rl"]


HOSTILE_IDS = [
    "nope",
    "ro-'\"<b>x</b>",
    "x" * 5000,
    "ünïcødé-☃-🚀",
    "a\x00b",
    "..",
    "apo-%2F",
    "a/b",
    "\ud800",
]


@pytest.mark.parametrize("kind", ["runs", "resources"])
async def test_unknown_and_hostile_ids_are_a_404_page_never_an_error(site: Site, kind: str) -> None:
    for given in HOSTILE_IDS:
        path = f"/dashboard/{kind}/" + quote(given.encode("utf-8", "surrogatepass"), safe="").replace(".", "%2E")
        response = await site.http.get(path)
        assert response.status_code in (404, 422), (given[:40], response.status_code)
        if response.status_code == 404 and response.headers["content-type"].startswith("text/html"):
            assert "<b>x</b>" not in response.text
            assert parse(response.text).testid("not-found")
    response = await site.http.get(f"/dashboard/{kind}/nope")
    assert response.status_code == 404 and "nope" in parse(response.text).testid("missing-id").text()
    if kind == "resources":
        for offset in ("-1", "abc", "99999999999999"):
            assert (await site.http.get(f"/dashboard/resources?offset={offset}")).status_code == 422
        assert (await site.http.get("/dashboard/resources?offset=500")).status_code == 200
