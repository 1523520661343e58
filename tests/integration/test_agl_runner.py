"""Agent Lightning 0.3's own runner against ``store serve``: ``LitAgentRunner`` with its ``OtelTracer``, through
its ``LightningStoreClient``, running a ``@rollout`` agent (``agl_runner_driver.py``, in the interpreter that has
``agentlightning``; :mod:`tests.integration.agl_servers`). Both backends: the rollouts are claimed by its worker,
their statuses are what its runner reports, and the spans its tracer exports (OTLP) and the reward it adds (REST)
are stored on the attempt that ran them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lightning_store import semconv
from lightning_store.client import HttpStore
from lightning_store.models import AttemptedRollout
from lightning_store.resources import PromptTemplate
from lightning_store.transcript import reward_of
from tests import apo_agents as agents
from tests.acceptance.test_apo import (
    latest_template,
    runs,
    sql,
    stack,
    store_train,
    summary_of,
    train_argv,
    write_tasks,
)
from tests.integration.agl_servers import Served
from tests.scripted_optimizer import create_app

DRIVER = Path(__file__).with_name("agl_runner_driver.py")
TASKS: list[dict[str, Any]] = [
    {"city": "Paris"},
    {"city": "Oslo", "fail": True},
    {"city": "Lima"},
    {"city": "Kathmandu"},
]
TEMPLATE = "Tell me about {city}."

pytestmark = pytest.mark.slow


async def enqueue(url: str) -> list[str]:
    store = HttpStore(url)
    try:
        await store.update_resources("rs-agl", {"main_prompt": PromptTemplate(template=TEMPLATE, engine="f-string")})
        return [(await store.enqueue_rollout(task, mode="train")).rollout_id for task in TASKS]
    finally:
        await store.close()


async def stored(url: str, ids: list[str]) -> list[tuple[str, str, str | None, list[str], list[float]]]:
    """Per rollout: its status, its attempt's status and worker, its span names, its rewards."""
    store = HttpStore(url)
    try:
        found: list[tuple[str, str, str | None, list[str], list[float]]] = []
        for rollout_id in ids:
            rollout = await store.get_rollout_by_id(rollout_id)
            assert isinstance(rollout, AttemptedRollout)
            spans = await store.query_spans(rollout_id, "latest")
            rewards = [r for s in spans if (r := reward_of(s)) is not None]
            names = sorted(s.name for s in spans)
            found.append((rollout.status, rollout.attempt.status, rollout.attempt.worker_id, names, rewards))
        return found
    finally:
        await store.close()


@pytest.mark.parametrize(
    "server_database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_agent_lightning_runner_runs_rollouts_of_store_serve(agl_python: str, served: Served) -> None:
    ids = asyncio.run(enqueue(served.url))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [agl_python, str(DRIVER), served.url, str(len(TASKS))],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- store serve ---\n{served.log_tail()}"

    found = asyncio.run(stored(served.url, ids))

    spans = sorted([semconv.ANNOTATION, "agentlightning.message", "agentlightning.object"])
    expected_ok = [("succeeded", "succeeded", "Worker-0", spans, [len(TEMPLATE.format(**t)) / 100]) for t in TASKS]
    expected = [expected_ok[0], ("failed", "failed", "Worker-0", [], []), *expected_ok[2:]]
    assert found == expected, served.log_tail()


def test_apo_optimizes_the_prompt_of_an_agent_run_by_agent_lightnings_runner(agl_python: str, tmp_path: Path) -> None:
    """``store train --algorithm apo --workers 0``: the optimization runs here, the rollouts in Agent Lightning's
    runner (its ``LitAgent``, its tracer, its client), and the search picks the good rewrite from the rewards that
    runner recorded. The scripted stand-in is the agent's model and the optimizer (as in ``test_apo``)."""
    script = {"prompt_template": [agents.PARTIAL_REWRITE, agents.GOOD_REWRITE, agents.BAD_REWRITE]}
    write_tasks(tmp_path, **{split: agents.classify_tasks(split) for split in ("train", "val", "test")})
    config = {"seed": 3, "max_rollouts": 120, "max_optimizer_calls": 16, "minibatch_size": 3}
    with stack(tmp_path, create_app(script), {"prompt_template": agents.CLASSIFY_SEED}) as env:
        env_vars = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        command = [agl_python, str(DRIVER), env["store"], "0", "classifier"]
        log = (tmp_path / "agl-runner.log").open("wb")
        runner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env_vars)
        try:
            argv = train_argv(env, tmp_path, "unused", config)
            argv = [a for a in argv if a not in ("--agent", "unused")]
            argv[argv.index("--workers") + 1] = "0"
            summary = summary_of(store_train(argv))
            db = env["db"]
            (run,) = runs(db)
            template = latest_template(db)
            agent_attempts = (  # the optimizer's calls are rollouts of their own, without a mode
                "SELECT DISTINCT a.worker_id FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id"
                " WHERE r.mode IS NOT NULL"
            )
            workers = {row[0] for row in sql(db, agent_attempts)}
        finally:
            runner.terminate()
            runner.wait(timeout=30)
            log.close()
    assert template == agents.GOOD_REWRITE, (tmp_path / "agl-runner.log").read_text()[-3000:]
    assert run["best_test_score"] == 1.0 and run["best_test_score"] >= run["seed_test_score"] + 0.4
    assert workers == {"Worker-0"}  # every rollout was run by Agent Lightning's runner
    assert summary["algorithm"] == "apo"
