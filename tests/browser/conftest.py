"""The dashboard in a real browser: Debian's Chromium driven by Playwright, against real ``store serve``
processes.

``server`` serves a store that short real runs filled, once per session: an APO run (the scripted stand-in
optimizer of ``tests.scripted_optimizer`` and its rule model as the agents' LLM) and a GRPO run (a tiny model
built here, one step, with a validation task the agent fails on, so the store holds errors), both through
``store train`` with real runners and the store's LLM proxy. The server requires a token; ``page`` is a browser
tab already logged in through the URL fragment, and any console error or page error fails its test.
``empty_server`` serves an empty store without a token. Screenshots go to ``$LIGHTNING_STORE_TEST_ARTIFACTS``
(default ``build/screenshots``).

Without Chromium or Playwright the tests are skipped, unless ``LIGHTNING_STORE_REQUIRE_BROWSER=1`` (set by
``.ci/run``, which installs both) makes that a failure.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from algorithms.local_stack import free_port, subprocess_in, wait_healthy
from examples.flight.model import TRAIN_TASKS, VAL_TASKS, build_tool_namer
from tests import apo_agents as agents
from tests.acceptance.test_apo import stack, train_argv, write_tasks
from tests.acceptance.test_apo import store_train as apo_train
from tests.acceptance.test_train_cli import store_train as grpo_train
from tests.scripted_optimizer import create_app

pytestmark = pytest.mark.slow

T = TypeVar("T")
ROOT = Path(__file__).parents[2]
TOKEN = "browser-test-token-5f2c"
ARTIFACTS = Path(os.environ.get("LIGHTNING_STORE_TEST_ARTIFACTS", ROOT / "build" / "screenshots"))
BROKEN_TASK = {"task_id": "broken", "steps": 1}
"""A validation task without a question: the flight agent raises KeyError on it, so the store holds failures."""


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _require_browser() -> None:
    missing = []
    if _chromium() is None:
        missing.append("chromium (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if missing:
        reason = "the browser tests need " + " and ".join(missing)
        if os.environ.get("LIGHTNING_STORE_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def in_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a thread of its own: Playwright's sync API keeps an event loop running in the main
    thread, and code that calls ``asyncio.run`` cannot run there."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(function, *args).result()


@dataclass(frozen=True)
class Served:
    url: str
    db: Path
    log: Path
    token: str | None

    def rows(self, statement: str, *args: Any) -> list[dict[str, Any]]:
        """``statement`` on the served store's database (SQLite), as dicts."""
        with contextlib.closing(sqlite3.connect(self.db)) as connection:
            connection.row_factory = sqlite3.Row
            return [dict(row) for row in connection.execute(statement, args).fetchall()]

    def scalar(self, statement: str, *args: Any) -> Any:
        rows = self.rows(statement, *args)
        return next(iter(rows[0].values())) if rows else None


@contextlib.contextmanager
def serve(db: Path, log: Path, token: str | None) -> Iterator[Served]:
    """``store serve`` on the SQLite file ``db``, logging every request (``--log-level debug``) to ``log``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "lightning_store.cli", "serve", "--port", str(port)]
    argv += ["--database-url", f"sqlite+aiosqlite:///{db}", "--log-level", "debug"]
    if token is not None:
        argv += ["--token", token]
    with subprocess_in(argv, log) as process:
        wait_healthy(url, process, log)
        yield Served(url, db, log, token)


@pytest.fixture(scope="session")
def filled_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store filled by a short APO run and a short GRPO run (see the module's docstring)."""
    _require_browser()
    tmp = tmp_path_factory.mktemp("dashboard-store")
    return in_thread(_fill, tmp)  # its helpers, shared with tests/acceptance, call asyncio.run


def _fill(tmp: Path) -> Path:
    write_tasks(tmp, **{s: agents.classify_tasks(s) for s in ("train", "val", "test")})
    script = {"prompt_template": [agents.BAD_REWRITE, agents.INVALID_REWRITES[0], agents.GOOD_REWRITE]}
    config = {"seed": 3, "max_rollouts": 60, "max_optimizer_calls": 8, "minibatch_size": 3}
    grpo = tmp / "grpo"
    grpo.mkdir()
    build_tool_namer(grpo / "model", steps=1)
    (grpo / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TRAIN_TASKS[:2]))
    (grpo / "val.jsonl").write_text(json.dumps(VAL_TASKS[0]) + "\n" + json.dumps(BROKEN_TASK) + "\n")
    (grpo / "grpo.yaml").write_text("tasks_per_step: 2\ngroup_size: 2\neval_repeats: 2\nlearning_rate: 1.0e-4\n")
    with stack(tmp, create_app(script), {"prompt_template": agents.CLASSIFY_SEED}) as env:
        result = apo_train(train_argv(env, tmp, "tests.apo_agents:classify", config))
        assert result.returncode == 0, result.stderr[-3000:]
        result = grpo_train(grpo, 1, "--store", env["store"])
        assert result.returncode == 0, result.stderr[-3000:]
        db: Path = env["db"]
    return db


@pytest.fixture(scope="session")
def server(filled_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``store serve --token`` on the filled store."""
    with serve(filled_db, tmp_path_factory.mktemp("serve") / "serve.log", TOKEN) as served:
        yield served


@pytest.fixture(scope="session")
def empty_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``store serve`` without a token on a new, empty store."""
    _require_browser()
    tmp = tmp_path_factory.mktemp("empty-store")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_store.cli",
            "migrate",
            "--database-url",
            f"sqlite+aiosqlite:///{tmp / 'store.db'}",
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    with serve(tmp / "store.db", tmp / "serve.log", None) as served:
        yield served


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Chromium, for this package's tests only: Playwright's sync API keeps an event loop running in the main
    thread while it is started, and the asynchronous tests that run after this package need that thread's loop."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


class ConsoleErrors:
    """Console errors and uncaught exceptions of a tab; a test's tab must end with none it did not expect."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        _consoles[id(page)] = self

    def expected(self, fragment: str) -> None:
        """The test caused exactly one error containing ``fragment`` on purpose (a refused login, say)."""
        found = [e for e in self.errors if fragment in e]
        assert len(found) == 1, (fragment, self.errors)
        self.errors.remove(found[0])


_consoles: dict[int, ConsoleErrors] = {}


def console_of(page: Any) -> ConsoleErrors:
    return _consoles[id(page)]


@contextlib.contextmanager
def tab(browser: Any) -> Iterator[Any]:
    """A new browser context and tab (no cookies) that fails the test on any console error."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    console = ConsoleErrors(page)
    try:
        yield page
    finally:
        context.close()
        _consoles.pop(id(page), None)
    assert console.errors == [], console.errors


@pytest.fixture
def anonymous_page(browser: Any) -> Iterator[Any]:
    """A fresh tab, not logged in."""
    with tab(browser) as page:
        yield page


@pytest.fixture
def page(browser: Any, server: Served) -> Iterator[Any]:
    """A tab logged in to ``server`` through ``/dashboard/#token=…``, showing the overview."""
    with tab(browser) as page:
        page.goto(f"{server.url}/dashboard/#token={TOKEN}")
        page.wait_for_url(f"{server.url}/dashboard/")
        page.get_by_role("heading", name="Overview").wait_for()
        yield page


@pytest.fixture
def shoot() -> Any:
    """``shoot(page, name)`` saves a full-page screenshot as ``ARTIFACTS/name.png`` and returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def save(page: Any, name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
