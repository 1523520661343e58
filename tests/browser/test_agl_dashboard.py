"""Agent Lightning 0.3's own dashboard, pointed at ``store serve``, lists what the store holds.

Its files come from the ``agentlightning`` wheel installed in the test interpreter of the compatibility tests
(:mod:`tests.integration.agl_servers`; nothing of theirs is in this repository). They are served as Agent
Lightning serves them (any path that is not a file answers ``index.html``: the app routes in the browser) by a
static server on another origin, and the dashboard is given ``store serve``'s URL on its settings page, so every
read crosses origins (``store serve --cors-origin``). The store is filled by the REST scenario of the parity test:
four rollouts (one with two attempts), three spans, four workers, a resources snapshot at version 2.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import tab
from tests.integration.agl_rest_scenario import play
from tests.integration.agl_servers import Served, agl_package_dir, find_agl_python, free_port, store_serve

pytestmark = pytest.mark.slow


class _SinglePageApp(http.server.SimpleHTTPRequestHandler):
    """Files of the app's directory; ``index.html`` for any other path, as ``agl store`` answers them."""

    def send_head(self) -> Any:
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.path = "/index.html"
        return super().send_head()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def agl_dashboard() -> Iterator[str]:
    """The URL of Agent Lightning's dashboard files, served on their own origin."""
    directory = agl_package_dir(find_agl_python()) / "dashboard"
    assert (directory / "index.html").is_file(), f"no dashboard in {directory}"
    handler = functools.partial(_SinglePageApp, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def filled_store(agl_dashboard: str, tmp_path: Path) -> Iterator[tuple[Served, dict[str, Any]]]:
    """``store serve`` that lets the dashboard's origin read it, filled by the scenario; with what it holds."""
    with store_serve(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", tmp_path, "--cors-origin", agl_dashboard) as s:
        play(s.url)
        holds = {
            route: httpx.get(f"{s.url}/v1/agl/{route}").json()["items"]
            for route in ("rollouts", "workers", "resources")
        }
        yield s, holds


def test_agent_lightning_dashboard_lists_the_store(
    browser: Any, agl_dashboard: str, filled_store: tuple[Served, dict[str, Any]], shoot: Any
) -> None:
    served, holds = filled_store
    newest = max(holds["rollouts"], key=lambda r: r["start_time"])
    with tab(browser) as page:
        page.goto(f"{agl_dashboard}/settings")
        base_url = page.get_by_test_id("settings-base-url")
        base_url.fill(served.url)
        base_url.blur()
        page.get_by_text("Online").first.wait_for()  # its health probe reached store serve

        page.get_by_role("link", name="Rollouts").first.click()
        for rollout in holds["rollouts"]:
            page.get_by_text(rollout["rollout_id"]).wait_for()
        rollouts_text = page.inner_text("main")
        for status in ("RUNNING", "QUEUING", "SUCCEEDED"):
            assert status in rollouts_text
        assert "1 - 4 / 4" in rollouts_text
        shoot(page, "agl-dashboard-rollouts")

        # The traces page opens on the newest rollout and its latest attempt (read from the attempts route).
        page.get_by_role("link", name="Traces").first.click()
        page.wait_for_url(f"**attemptId={newest['attempt']['attempt_id']}**")
        for name in ("agent.run", "tool.call", "llm"):
            page.get_by_role("cell", name=name, exact=True).wait_for()
        assert "1 - 3 / 3" in page.inner_text("main")
        shoot(page, "agl-dashboard-traces")

        page.get_by_role("link", name="Runners").first.click()
        for worker in holds["workers"]:
            page.get_by_text(worker["worker_id"], exact=True).first.wait_for()
        runners_text = page.inner_text("main")
        assert {"BUSY", "IDLE", "UNKNOWN"} <= set(runners_text.split())
        shoot(page, "agl-dashboard-runners")

        page.get_by_role("link", name="Resources").first.click()
        (snapshot,) = holds["resources"]
        page.get_by_text(snapshot["resources_id"]).wait_for()
        assert snapshot["version"] == 2 and "1 - 1 / 1" in page.inner_text("main")
        shoot(page, "agl-dashboard-resources")
