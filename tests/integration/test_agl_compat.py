"""Wire compatibility with Agent Lightning 0.3: its unmodified ``LightningStoreClient`` against ``store serve``.

The client runs in an interpreter that has ``agentlightning`` installed, never in this environment: the one named by
``$LIGHTNING_STORE_AGL_PYTHON``, else ``/tmp/aglvenv/bin/python`` when it has the package; without one the module is
skipped. For each backend (SQLite, and Postgres on a database cloned from the test template) a real ``store serve``
subprocess is started on a free port, and ``agl_driver.py`` (beside this file) calls every client method against it,
plus an OTLP export with OpenTelemetry's own exporter. The driver checks each answer against Agent Lightning's
semantics and names every failed call precisely; this side then reads the store back with our ``HttpStore`` to check
that what the driver wrote was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightning_store.client import HttpStore
from tests.integration.agl_servers import Served

DRIVER = Path(__file__).with_name("agl_driver.py")
DRIVER_SECONDS = 240.0

pytestmark = pytest.mark.slow

# The driver ---------------------------------------------------------------------------------------------------


@dataclass
class DriverRun:
    returncode: int
    stdout: str
    stderr: str
    summary: dict[str, Any] | None

    def report(self, served: Served) -> str:
        """Every failed check the driver found, or its crash, and the server log's tail."""
        if self.summary is None:
            head = f"the driver crashed (exit {self.returncode}) without a summary:\n{self.stderr[-4000:]}"
        else:
            failures = self.summary["failures"]
            head = f"Agent Lightning's client found {len(failures)} incompatibilities:\n\n" + "\n\n".join(failures)
        return f"{head}\n\n--- store serve log (tail) ---\n{served.log_tail()}"


def run_driver(python: str, url: str) -> DriverRun:
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run(
            [python, str(DRIVER), url], capture_output=True, text=True, env=env, timeout=DRIVER_SECONDS, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the driver ran over {DRIVER_SECONDS:.0f}s; its stderr:\n{exc.stderr!r}")
    lines = done.stdout.strip().splitlines()
    summary = None
    with contextlib.suppress(ValueError, IndexError):
        summary = json.loads(lines[-1])
    return DriverRun(done.returncode, done.stdout, done.stderr, summary)


# What the store holds ---------------------------------------------------------------------------------------


async def stored_problems(url: str, state: dict[str, Any]) -> list[str]:
    """Read back through our own client what the driver wrote; each mismatch is one line."""
    store = HttpStore(url)
    try:
        return [
            *await rollout_problems(store, state),
            *await span_problems(store, state["spans"]),
            *await resource_problems(store, state["resources"]),
            *await worker_problems(store, state["workers"]),
        ]
    finally:
        await store.close()


async def rollout_problems(store: HttpStore, state: dict[str, Any]) -> list[str]:
    problems = []
    total = (await store.query_rollouts()).total
    if total != state["rollout_count"]:
        problems.append(f"query_rollouts().total = {total}, the driver wrote {state['rollout_count']}")
    for rollout_id, expected in state["rollouts"].items():
        rollout = await store.get_rollout_by_id(rollout_id)
        if rollout is None:
            problems.append(f"rollout {rollout_id} is missing")
            continue
        if rollout.status != expected["status"]:
            problems.append(f"rollout {rollout_id}: status {rollout.status}, expected {expected['status']}")
        attempts = (await store.query_attempts(rollout_id)).total
        if attempts != expected["attempts"]:
            problems.append(f"rollout {rollout_id}: {attempts} attempts, expected {expected['attempts']}")
    return problems


async def span_problems(store: HttpStore, expected: dict[str, Any]) -> list[str]:
    spans = await store.query_spans(expected["rollout_id"], expected["attempt_id"])
    problems = []
    if len(spans) != expected["count"]:
        problems.append(f"{len(spans)} spans on {expected['rollout_id']}, the driver wrote {expected['count']}")
    names = {span.name for span in spans}
    missing = {"hand.span", "llm.call", "agent.run", "otlp.parent", "otlp.child", "otlp.gzip"} - names
    if missing:
        problems.append(f"spans missing by name: {sorted(missing)} (stored: {sorted(names)})")
    if "orphan.span" in names:
        problems.append("the OTLP span without rollout/attempt ids was stored")
    numbers = [span.sequence_id for span in spans]
    if len(set(numbers)) != len(numbers):
        problems.append(f"duplicate sequence ids: {numbers}")
    return problems


async def resource_problems(store: HttpStore, expected: dict[str, int]) -> list[str]:
    problems = []
    for resources_id, version in expected.items():
        found = await store.get_resources_by_id(resources_id)
        if found is None or found.version != version:
            problems.append(f"resources {resources_id}: {found}, expected version {version}")
    return problems


async def worker_problems(store: HttpStore, expected: list[str]) -> list[str]:
    return [f"worker {w} is missing" for w in expected if await store.get_worker_by_id(w) is None]


# The test -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "server_database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_agent_lightning_client_against_store_serve(agl_python: str, served: Served) -> None:
    run = run_driver(agl_python, served.url)
    report = [] if run.returncode == 0 and run.summary is not None and run.summary["ok"] else [run.report(served)]
    if run.summary is not None:
        problems = asyncio.run(stored_problems(served.url, run.summary["state"]))
        if problems:
            report.append("The store does not hold what the driver wrote:\n" + "\n".join(problems))
    if report:
        pytest.fail("\n\n".join(report), pytrace=False)
