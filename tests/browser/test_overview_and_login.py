"""The overview and the token prompt, in a real browser: the numbers on the page are the store's, the page
refreshes itself, the dashboard is behind the server's token (never written to the server's log), and an empty
store says what to do next."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from lightning_store.client import HttpStore
from tests.browser.conftest import TOKEN, Served, console_of, in_thread, serve

pytestmark = pytest.mark.slow


def text(page: Any, testid: str) -> str:
    return str(page.get_by_test_id(testid).inner_text()).strip()


def test_the_overview_shows_the_stores_numbers(page: Any, server: Served, shoot: Any) -> None:
    assert int(text(page, "total-rollouts")) == server.scalar("SELECT count(*) FROM rollouts_v") > 0
    queued = server.scalar("SELECT count(*) FROM rollouts_v WHERE status IN ('queuing', 'requeuing')")
    assert int(text(page, "queue-depth")) == queued
    running = server.scalar("SELECT count(*) FROM attempts_v WHERE status IN ('preparing', 'running')")
    assert int(text(page, "attempts-running")) == running
    counts = server.rows("SELECT status, COALESCE(mode, 'none') AS mode, count(*) AS n FROM rollouts_v GROUP BY 1, 2")
    assert {(r["status"], r["mode"]) for r in counts} >= {("succeeded", "train"), ("succeeded", "val")}
    for row in counts:
        assert int(text(page, f"count-{row['status']}-{row['mode']}")) == row["n"]
    workers = server.scalar("SELECT count(DISTINCT worker_id) FROM workers") or 0
    assert page.get_by_test_id("workers-table").locator("tbody tr").count() == workers > 0
    page.locator('[data-chart="rates"][data-drawn="true"] canvas').first.wait_for()
    shoot(page, "overview")


def test_the_overview_refreshes_itself(browser: Any, tmp_path: Path) -> None:
    """A rollout enqueued while the page is open appears without a reload."""
    from tests.browser.conftest import tab

    db = tmp_path / "store.db"
    with serve(db, tmp_path / "serve.log", None) as served, tab(browser) as page:
        page.goto(f"{served.url}/dashboard/")
        page.get_by_test_id("overview-empty").wait_for()
        in_thread(asyncio.run, _enqueue(served.url, 3))
        page.get_by_test_id("total-rollouts").wait_for(timeout=10_000)
        assert text(page, "total-rollouts") == "3" and text(page, "queue-depth") == "3"
        assert text(page, "count-queuing-train") == "3"


async def _enqueue(url: str, n: int) -> None:
    client = HttpStore(url)
    try:
        for i in range(n):
            await client.enqueue_rollout(input={"i": i}, mode="train")
    finally:
        await client.close()


def test_without_the_token_every_page_asks_for_it(anonymous_page: Any, server: Served, shoot: Any) -> None:
    page = anonymous_page
    for path in ("/dashboard/", "/dashboard/rollouts?status=failed", "/dashboard/runs", "/dashboard/resources"):
        response = page.goto(f"{server.url}{path}")
        assert response is not None and response.ok
        assert re.search(r"/dashboard/login\?next=", page.url), page.url
        page.get_by_role("heading", name="This store needs its token").wait_for()
    shoot(page, "login")
    page.get_by_label("Token").fill("not-the-token")
    page.get_by_role("button", name="Log in").click()
    page.locator("#login-error").wait_for(state="visible")
    console_of(page).expected("401")  # the refused login's own request
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server.url}/dashboard/resources")  # back where it was going
    # The cookie opens the dashboard, not the API: that still wants the bearer token.
    assert page.request.get(f"{server.url}/v1/agl/statistics").status == 401
    page.goto(f"{server.url}/dashboard/logout")
    page.goto(f"{server.url}/dashboard/runs")
    assert "/dashboard/login" in page.url


def test_a_token_in_the_fragment_logs_in_and_leaves_no_trace(anonymous_page: Any, server: Served) -> None:
    page = anonymous_page
    page.goto(f"{server.url}/dashboard/rollouts#token={TOKEN}")
    page.wait_for_url(f"{server.url}/dashboard/rollouts")
    assert TOKEN not in page.url
    cookies = page.context.cookies()
    assert cookies and all(TOKEN not in c["value"] and c["httpOnly"] for c in cookies)
    log = server.log.read_text()
    assert "/dashboard/rollouts" in log  # the debug log has a line per request...
    assert TOKEN not in log  # ...and the token in none of them


def test_an_empty_store_says_what_to_do(browser: Any, empty_server: Served, shoot: Any) -> None:
    from tests.browser.conftest import tab

    with tab(browser) as page:
        page.goto(f"{empty_server.url}/dashboard/")
        assert "store enqueue" in text(page, "overview-empty")
        assert "store run" in text(page, "workers-empty")
        shoot(page, "overview-empty")


def test_no_page_loads_anything_from_another_host(page: Any, server: Served) -> None:
    """Every request a page makes (scripts, styles, fragments) goes to the store's own server: it works offline."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    run_id = server.scalar("SELECT run_id FROM apo_runs_v")
    rollout_id = server.scalar("SELECT rollout_id FROM llm_calls_v WHERE mode = 'train'")
    for path in (
        "/dashboard/",
        "/dashboard/runs",
        f"/dashboard/runs/{run_id}",
        "/dashboard/rollouts",
        f"/dashboard/rollouts/{rollout_id}",
        "/dashboard/resources",
    ):
        page.goto(f"{server.url}{path}", wait_until="networkidle")
    foreign = [url for url in requested if not url.startswith((server.url, "data:"))]
    assert requested and foreign == []
    assert any(url.endswith(".js") for url in requested)
