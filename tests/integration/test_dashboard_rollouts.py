"""The dashboard's rollouts list and rollout page against the views, on SQLite and Postgres: a real ``store serve``
(uvicorn on 127.0.0.1) over a store the contract filled (``dashboard_rollouts_fill.py``). Every number and id a
page shows is compared with SQL on the same database; every filter, sort and page is checked against the rows
the views return, under each of the statements the page may choose; bad and hostile input gives a 4xx naming
the field, never a 500."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import sqlalchemy as sa

from lightning_store.dashboard import rollouts_query
from tests.integration.dashboard_html import number
from tests.integration.dashboard_rollouts_fill import ERROR_TEXT, HOSTILE_ID, QUOTED_TASK, Site, site_for

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
pytestmark = pytest.mark.parametrize("database_url", BACKENDS, indirect=True)


@pytest.fixture
async def site(database_url: str) -> AsyncIterator[Site]:
    async with site_for(database_url) as opened:
        yield opened


def newest_first(rows: list[dict[str, Any]]) -> list[str]:
    return [r["rollout_id"] for r in sorted(rows, key=lambda r: (r["start_time"], r["pk"]), reverse=True)]


def by_reward(rows: list[dict[str, Any]], order: str) -> list[str]:
    """The documented reward order: rewarded rollouts by reward, reward time, id; then the others, newest first."""
    rewarded = sorted(
        (r for r in rows if r["reward"] is not None),
        key=lambda r: (r["reward"], r["reward_time"], r["rank"]),
        reverse=order == "desc",
    )
    return [r["rollout_id"] for r in rewarded] + newest_first([r for r in rows if r["reward"] is None])


async def test_the_first_page_shows_the_views_numbers_for_the_newest_50(site: Site) -> None:
    expected = await site.expected()
    page = await site.page("/dashboard/rollouts")
    rows = page.testids("rollout-row")
    assert [r.attrs["data-rollout-id"] for r in rows] == newest_first(list(expected.values()))[:50]
    shown = page.testid("rows-range")
    assert (shown.attrs["data-first"], shown.attrs["data-last"], shown.attrs["data-total"]) == (
        "1",
        "50",
        str(len(expected)),
    )
    assert f"of {len(expected)}" in shown.text()
    errors_shown = 0
    for row in rows:
        want = expected[row.attrs["data-rollout-id"]]
        cell = {
            k: row.testids(f"rollout-{k}")
            for k in (
                "status",
                "mode",
                "resources-id",
                "resources-version",
                "step",
                "task",
                "start",
                "ran",
                "duration",
                "attempts",
                "reward",
                "worker",
                "error",
            )
        }
        assert cell["status"][0].text() == want["status"]
        assert cell["mode"][0].text() == (want["mode"] or "—")
        assert cell["resources-id"][0].text() == want["resources_id"]
        assert [c.text() for c in cell["resources-version"]] == (
            [str(want["resources_version"])] if want["resources_version"] is not None else []
        )
        assert [c.text() for c in cell["step"]] == [str(want["step"])]
        assert [c.text() for c in cell["task"]] == [want["task_id"]]
        assert number(cell["start"][0].attrs["data-value"]) == want["start_time"]
        assert number(cell["duration"][0].attrs["data-value"]) == want["duration_seconds"]
        # "ran" is the latest attempt's own time, not the wait in the queue before it.
        assert number(cell["ran"][0].attrs["data-value"]) == want["ran"]
        if want["ran"] is not None and want["duration_seconds"] is not None:
            assert want["ran"] <= want["duration_seconds"]
        assert cell["attempts"][0].text() == str(want["num_attempts"])
        assert number(cell["reward"][0].attrs["data-value"]) == want["reward"]
        assert cell["worker"][0].text() == (want["latest_worker_id"] or "—")
        # The latest attempt's error, as `store rollouts list` shows it (the fill's failures raise ValueError).
        failed = want["latest_attempt_status"] == "failed"
        assert cell["error"][0].text() == (f"ValueError: {ERROR_TEXT}" if failed else ""), want
        errors_shown += failed
        link = row.testid("rollout-link").attrs["href"]
        assert link == "/dashboard/rollouts/" + quote(want["rollout_id"])
    assert "/dashboard/rollouts?page=2" in page.testid("next-page").attrs["href"]
    assert page.testids("prev-page") == []
    assert errors_shown > 0  # the page holds failed rollouts, each with its error


async def test_paging_shows_every_rollout_once_in_order(site: Site) -> None:
    expected = await site.expected()
    assert await site.listed() == newest_first(list(expected.values()))
    last = await site.page("/dashboard/rollouts?page=3")
    assert last.testids("next-page") == [] and last.testids("prev-page")
    assert last.testid("rows-range").attrs["data-first"] == "101"
    beyond = await site.page("/dashboard/rollouts?page=9")
    assert beyond.testids("rollouts-empty-filtered") and beyond.testids("first-page")


async def test_every_filter_lists_exactly_the_rollouts_sql_finds(site: Site) -> None:
    expected = await site.expected()
    rows = list(expected.values())
    starts = sorted({r["start_time"] for r in rows})
    retried = expected[site.filled.retried]
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"status": "failed"}, lambda r: r["status"] == "failed"),
        ({"status": ["succeeded", "queuing"]}, lambda r: r["status"] in ("succeeded", "queuing")),
        ({"mode": "val"}, lambda r: r["mode"] == "val"),
        ({"mode": "none"}, lambda r: r["mode"] is None),
        ({"mode": ["train", "none"]}, lambda r: r["mode"] in ("train", None)),
        ({"since": starts[1]}, lambda r: r["start_time"] >= starts[1]),
        ({"until": starts[1]}, lambda r: r["start_time"] <= starts[1]),
        (
            {"since": starts[1], "until": starts[2], "status": "succeeded"},
            lambda r: starts[1] <= r["start_time"] <= starts[2] and r["status"] == "succeeded",
        ),
        ({"reward_min": 0.5}, lambda r: r["reward"] is not None and r["reward"] >= 0.5),
        ({"reward_min": 0, "reward_max": 0.5}, lambda r: r["reward"] is not None and 0 <= r["reward"] <= 0.5),
        ({"reward_max": -1}, lambda r: r["reward"] is not None and r["reward"] <= -1),
        ({"resources_id": "policy"}, lambda r: r["resources_id"] == "policy"),
        ({"resources_id": "nothing"}, lambda r: False),
        ({"resources_version": 1}, lambda r: r["resources_version"] == 1),
        ({"resources_version": 2, "mode": "train"}, lambda r: r["resources_version"] == 2 and r["mode"] == "train"),
        ({"meta_key": "task_id", "meta_value": "task-3"}, lambda r: r["metadata"].get("task_id") == "task-3"),
        ({"meta_key": "task_id", "meta_value": QUOTED_TASK}, lambda r: r["task_id"] == QUOTED_TASK),
        ({"meta_key": "step", "meta_value": "1"}, lambda r: r["step"] == 1),
        ({"meta_key": "flag", "meta_value": "true"}, lambda r: r["metadata"].get("flag") is True),
        ({"meta_key": "flag", "meta_value": "false"}, lambda r: r["metadata"].get("flag") is False),
        ({"q": retried["rollout_id"][:6]}, lambda r: r["rollout_id"].startswith(retried["rollout_id"][:6])),
        ({"q": HOSTILE_ID[:8]}, lambda r: r["rollout_id"].startswith(HOSTILE_ID[:8])),
    ]
    for params, keep in cases:
        want = newest_first([r for r in rows if keep(r)])
        assert await site.listed(**params) == want, params
    assert await site.listed(meta_key="split", meta_value="none") == newest_first(
        [r for r in rows if r["mode"] is None]
    )


async def test_derived_filters_give_the_same_rows_whichever_plan_runs(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases: list[dict[str, Any]] = [
        {"resources_version": 1},
        {"reward_min": 0.5, "mode": "train"},
        {"reward_max": 0.25, "status": "succeeded"},
    ]
    few = [await site.listed(**params) for params in cases]  # few candidates: the statements start from them
    monkeypatch.setattr(rollouts_query, "candidate_cap", lambda offset, total: 1)
    assert [await site.listed(**params) for params in cases] == few  # each rollout in page order checked instead
    counted = await site.page("/dashboard/rollouts?mode=train")
    monkeypatch.setattr(rollouts_query, "COUNT_CAP", 5)
    capped = await site.page("/dashboard/rollouts?mode=train")
    assert counted.testid("rows-range").attrs["data-total"] != ""
    assert capped.testid("rows-range").attrs["data-total"] == "" and "more than 5" in capped.testid("rows-range").text()


async def test_every_sort_orders_as_the_views_say(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = list((await site.expected()).values())

    def nulls_last(key: str, order: str) -> list[str]:
        done = sorted((r for r in rows if r[key] is not None), key=lambda r: (r[key], r["pk"]), reverse=order == "desc")
        rest = sorted((r for r in rows if r[key] is None), key=lambda r: r["pk"], reverse=order == "desc")
        return [r["rollout_id"] for r in done + rest]

    for order in ("asc", "desc"):
        start = [
            r["rollout_id"] for r in sorted(rows, key=lambda r: (r["start_time"], r["pk"]), reverse=order == "desc")
        ]
        assert await site.listed(sort="start_time", order=order) == start
        assert await site.listed(sort="end_time", order=order) == nulls_last("end_time", order)
        assert await site.listed(sort="duration", order=order) == nulls_last("duration_seconds", order)
        status = [r["rollout_id"] for r in sorted(rows, key=lambda r: (r["status"], r["pk"]), reverse=order == "desc")]
        assert await site.listed(sort="status", order=order) == status
        assert await site.listed(sort="reward", order=order) == by_reward(rows, order)  # the reward index, walked
        train = [r for r in rows if r["mode"] == "train"]
        assert await site.listed(sort="reward", order=order, mode="train") == by_reward(train, order)  # sorted whole
        ranged = [r for r in rows if r["reward"] is not None and 0 <= r["reward"] <= 0.5]
        assert await site.listed(sort="reward", order=order, reward_min=0, reward_max=0.5) == by_reward(ranged, order)
    monkeypatch.setattr(rollouts_query, "COUNT_CAP", 5)  # the filtered statement walks the index too
    train = [r for r in rows if r["mode"] == "train"]
    assert await site.listed(sort="reward", mode="train") == by_reward(train, "desc")
    some = [r for r in rows if r["mode"] in ("train", None)]
    assert sum(r["reward"] is not None for r in some) < 100 < len(some)  # page 3 starts past the rewarded ones
    assert await site.listed(sort="reward", mode=["train", "none"]) == by_reward(some, "desc")
    ranged = [r for r in train if r["reward"] is not None and r["reward"] >= 0.5]
    assert await site.listed(sort="reward", mode="train", reward_min=0.5) == by_reward(ranged, "desc")


BAD = [
    ({"reward_min": "abc"}, "reward_min"),
    ({"reward_min": "nan"}, "reward_min"),
    ({"reward_max": "1e999"}, "reward_max"),
    ({"reward_min": "2", "reward_max": "1"}, "reward_max"),
    ({"resources_version": "-1"}, "resources_version"),
    ({"resources_version": "1.5"}, "resources_version"),
    ({"resources_version": "99999999999"}, "resources_version"),
    ({"page": "0"}, "page"),
    ({"page": "two"}, "page"),
    ({"sort": "rollout_id; DROP TABLE rollouts"}, "sort"),
    ({"order": "up"}, "order"),
    ({"status": "done"}, "status"),
    ({"mode": "TRAIN"}, "mode"),
    ({"since": "yesterday"}, "since"),
    ({"since": "0001-01-01T00:00+01:00"}, "since"),
    ({"until": "9999-12-31T23:59:59-01:00"}, "until"),
    ({"until": "1e300"}, "until"),
    ({"since": "2026-11-24T10:00", "until": "2026-11-24T09:00"}, "until"),
    ({"meta_key": "task_id'--", "meta_value": "x"}, "meta_key"),
    ({"meta_key": "a" * 101, "meta_value": "x"}, "meta_key"),
    ({"meta_key": "task_id"}, "meta_value"),
    ({"meta_value": "x"}, "meta_key"),
    ({"q": "r" * 129}, "q"),
    ({"resources_id": "p" * 129}, "resources_id"),
    ({"meta_key": "k", "meta_value": "v" * 1001}, "meta_value"),
]


async def test_bad_filter_values_are_a_422_naming_the_field(site: Site) -> None:
    for params, field in BAD:
        page = await site.page("/dashboard/rollouts?" + urlencode(params), status=422)
        named = [e.attrs["data-field"] for e in page.testids("filter-error")]
        assert field in named, (params, named)
        assert page.testids("rollout-row") == []
        form = page.testid("rollout-filters")  # the form keeps what was typed
        typed = {
            e.attrs["name"]: e.attrs.get("value", "")
            for e in form.all(lambda e: e.tag == "input" and e.attrs.get("type") in ("text", "number", "search"))
        }
        for name, value in params.items():
            if name in typed:
                assert typed[name] == value.strip(), (name, typed[name])


async def test_hostile_values_never_break_the_page_or_the_store(site: Site) -> None:
    count = len(site.filled.ids)
    hostile: list[dict[str, Any]] = [
        {"q": "' OR '1'='1"},
        {"q": "%"},
        {"q": "_"},
        {"resources_id": "'; DROP TABLE rollouts; --"},
        {"meta_key": "task_id", "meta_value": "' OR 1=1 --"},
        {"meta_key": "task_id", "meta_value": "é漢字🙂\"'<script>alert(1)</script>"},
        {"meta_key": "x.y-z_1", "meta_value": "1"},
        {"meta_key": "task_id", "meta_value": "x" * 1000},
        {"status": ["failed"] * 50, "mode": ["train", "val", "test", "none"]},
        {"page": "1000000"},
        {"since": "0", "until": "99999999999"},
        {"reward_min": "-1e308", "reward_max": "1e308"},
        {"unknown": "x", "sort": "reward", "order": "asc", "page": "999"},
    ]
    for raw in ("q=%ED%A0%80", "meta_key=task_id&meta_value=%FF%FE", "status=%E2%80%AE"):
        response = await site.http.get("/dashboard/rollouts?" + raw)
        assert response.status_code in (200, 422), (raw, response.status_code)
    for params in hostile:
        page = await site.page("/dashboard/rollouts?" + urlencode(params, doseq=True))
        assert "<script>alert" not in str([e.text() for e in page.testids("rollout-filters")])
        assert page.testids("rollouts-empty-filtered") or page.testids("rollout-row"), params
    response = await site.http.get("/dashboard/rollouts?q=%00")
    assert 400 <= response.status_code < 500
    assert (await site.sql("SELECT count(*) AS n FROM rollouts"))[0]["n"] == count
    ids = await site.listed(q=HOSTILE_ID)
    assert ids == [HOSTILE_ID]
    page = await site.page("/dashboard/rollouts/" + quote(HOSTILE_ID, safe=""))
    assert page.testid("rollout-id").text() == HOSTILE_ID


async def test_an_empty_store_and_an_empty_filter_say_different_things(site: Site, database_url: str) -> None:
    filtered = await site.page("/dashboard/rollouts?resources_id=nothing")
    assert filtered.testids("rollouts-empty-filtered") and not filtered.testids("rollouts-empty-store")
    assert filtered.testid("clear-filters-empty").attrs["href"] == "/dashboard/rollouts"
    async with site.store.engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM rollouts"))
    empty = await site.page("/dashboard/rollouts")
    assert empty.testids("rollouts-empty-store") and not empty.testids("rollouts-empty-filtered")


async def test_the_reward_and_version_statements_use_the_dashboard_indexes(site: Site) -> None:
    """The plans read the indexes of revision 0005 (Postgres is told to avoid scans and sorts, as a small table
    is cheapest read whole): the reward walk, a rollout's reward, and the rollouts that called a version."""
    statements = {
        "ix_spans_reward": f"SELECT w.rollout_id FROM {rollouts_query.LAST_REWARDS} AND 1 = 1 "
        "ORDER BY w.reward DESC, w.time DESC, w.rollout_id DESC LIMIT 51",
        "ix_spans_reward_attempt": f"SELECT r.rollout_id, {rollouts_query.LATEST_REWARD} AS reward FROM rollouts r",
        "ix_llm_calls_resources_version": "SELECT c.rollout_id FROM llm_calls_v c WHERE c.resources_version = 1",
    }
    postgres = site.store.engine.dialect.name == "postgresql"
    for index, statement in statements.items():
        async with site.store.engine.connect() as conn:
            if postgres:
                await conn.execute(sa.text("SET enable_seqscan = off"))
                await conn.execute(sa.text("SET enable_sort = off"))
                plan = str((await conn.execute(sa.text(f"EXPLAIN (FORMAT JSON) {statement}"))).scalar_one())
            else:
                plan = str((await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {statement}"))).all())
            await conn.rollback()
        assert re.search(rf"\b{index}\b(?!_)", plan), (index, plan)
