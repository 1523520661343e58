"""The dashboard's door and its overview over HTTP, on SQLite and Postgres: the token guards every page but the
login (which never sends anyone to another site), the cookie it sets holds no token and opens no API route, and
the overview's numbers are the store's."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa

from lightning_store.dashboard import auth
from lightning_store.sql import SqlStore, open_store
from tests.conftest import serving

TOKEN = "s3cret-dashboard"
BACKENDS = [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
async def sql_store(database_url: str) -> AsyncIterator[SqlStore]:
    store = await open_store(database_url, migrate=True, watchdog_interval=0)
    yield store
    await store.close()


def by_testid(html: str, name: str) -> str:
    found = re.search(rf'data-testid="{re.escape(name)}"[^>]*>([^<]*)<', html)
    assert found, f"no {name} on the page"
    return found.group(1).strip()


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_pages_need_the_token_and_the_cookie_opens_only_the_dashboard(sql_store: SqlStore) -> None:
    async with serving(sql_store, token=TOKEN) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        page = await http.get("/dashboard/rollouts?status=failed")
        assert page.status_code == 303
        assert page.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Frollouts%3Fstatus%3Dfailed"
        login = await http.get(page.headers["location"])
        assert login.status_code == 200 and 'data-next="/dashboard/rollouts?status=failed"' in login.text
        assert (await http.get("/dashboard/static/dashboard.js")).status_code == 200  # no data in scripts
        assert (await http.post("/dashboard/overview/live")).status_code == 401  # not a page load: no redirect
        wrong = await http.post("/dashboard/login", json={"token": "nope"})
        assert wrong.status_code == 401 and wrong.json()["field"] == "token" and "set-cookie" not in wrong.headers
        assert (await http.post("/dashboard/login", json={})).status_code == 422
        right = await http.post("/dashboard/login", json={"token": TOKEN})
        assert right.status_code == 204
        cookie = right.headers["set-cookie"]
        assert TOKEN not in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Path=/dashboard" in cookie
        value = http.cookies[auth.COOKIE]
        assert (await http.get("/dashboard/")).status_code == 200
        # No cookie jar: the cookie sent by hand, anywhere.
        async with httpx.AsyncClient(base_url=url, timeout=30) as bare:
            # The cookie is the dashboard's: the API (which writes) still wants the bearer token.
            cookie_header = {"cookie": f"{auth.COOKIE}={value}"}
            assert (await bare.get("/v1/agl/statistics", headers=cookie_header)).status_code == 401
            assert (await bare.get("/dashboard/", headers=cookie_header)).status_code == 200
            forged = {"cookie": f"{auth.COOKIE}={value}0"}
            assert (await bare.get("/dashboard/", headers=forged)).status_code == 303
            bearer = await bare.get("/dashboard/", headers={"authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/dashboard/", "/v1/agl/statistics", ""])
async def test_the_login_only_sends_back_into_the_dashboard(sql_store: SqlStore, target: str) -> None:
    async with serving(sql_store, token=TOKEN) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        page = await http.get("/dashboard/login", params={"next": target})
        assert page.status_code == 200 and 'data-next="/dashboard/"' in page.text


async def test_without_a_token_the_dashboard_is_open_and_the_login_page_moves_on(sql_store: SqlStore) -> None:
    async with serving(sql_store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.get("/dashboard/")).status_code == 200
        moved = await http.get("/dashboard/login", params={"next": "/dashboard/runs"})
        assert moved.status_code == 303 and moved.headers["location"] == "/dashboard/runs"
        assert (await http.get("/dashboard")).status_code == 307
        assert "/dashboard" not in (await http.get("/openapi.json")).text  # HTML for people, not the API


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_the_overview_counts_what_the_store_holds(sql_store: SqlStore) -> None:
    for i in range(5):
        await sql_store.enqueue_rollout(input={"i": i}, mode="train")
    await sql_store.enqueue_rollout(input={"i": 9}, mode="val")
    await sql_store.enqueue_rollout(input={"i": 10})
    claimed = await sql_store.dequeue_rollout(worker_id="worker-a")
    assert claimed is not None
    await sql_store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")
    done = await sql_store.dequeue_rollout(worker_id="worker-b")
    assert done is not None
    await sql_store.update_attempt(done.rollout_id, done.attempt.attempt_id, status="succeeded")
    for worker_id in ("worker-a", "worker-c"):
        await sql_store.update_worker(worker_id, heartbeat_stats={"in_flight": 0})
    async with sql_store.engine.begin() as conn:  # worker-a's process died ten minutes ago
        await conn.execute(
            sa.text("UPDATE workers SET last_heartbeat_time = :then WHERE worker_id = 'worker-a'"),
            {"then": time.time() - 600},
        )
    async with serving(sql_store) as url, httpx.AsyncClient(base_url=url, timeout=30) as http:
        html = (await http.get("/dashboard/")).text
        live = (await http.get("/dashboard/overview/live")).text
    statuses: dict[tuple[str, str], int] = {}
    for rollout in await sql_store.query_rollouts():
        key = (rollout.status, rollout.mode or "none")
        statuses[key] = statuses.get(key, 0) + 1
    for page in (html, live):
        assert int(by_testid(page, "total-rollouts")) == 7
        assert int(by_testid(page, "queue-depth")) == sum(n for (s, _), n in statuses.items() if s == "queuing") == 5
        assert int(by_testid(page, "attempts-running")) == 1
        for (status, mode), n in statuses.items():
            assert int(by_testid(page, f"count-{status}-{mode}")) == n
        assert "worker-a" in page and "worker-b" in page
        shown = {w: worker_status(page, w) for w in ("worker-a", "worker-b", "worker-c")}
        # Silent after a minute without a heartbeat; a worker that never sent one shows what claims made it.
        assert shown == {"worker-a": "silent", "worker-b": "idle", "worker-c": "unknown"}, shown
        assert float(by_testid(page, "rollouts-per-second")) > 0  # one finished within the last minutes


def worker_status(page: str, worker_id: str) -> str:
    row = re.search(rf'data-worker-id="{re.escape(worker_id)}">(.*?)</tr>', page, flags=re.DOTALL)
    assert row is not None, worker_id
    status = re.search(r'data-testid="worker-status"[^>]*>([^<]*)<', row.group(1))
    assert status is not None, row.group(1)
    return status.group(1)
