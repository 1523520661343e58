"""``store rollouts retry|requeue|cancel``.

The first test is the story that asked for them: rollouts pinned to an LLM endpoint that is down fail; the user
points the store at a working one with ``store resources set-llm``; ``retry`` alone would run them with the old
snapshot again (and says so), ``retry --resources latest`` re-pins them, and a runner then runs them to success
under their own ids. Real parts: a ``store serve`` subprocess on SQLite, ``store run`` subprocesses, the agent of
``test_cli_rollouts`` calling the scripted stand-in upstream through the server's proxy.

The others check each command's choices and refusals on SQLite and Postgres (database URLs, through the same
contract calls a server URL makes).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lightning_store import LLM
from lightning_store.client import HttpStore
from lightning_store.connect import connect
from lightning_store.contract import LightningStore
from lightning_store.models import AttemptEnd, Rollout, RolloutConfig, RolloutMode
from tests.acceptance.test_cli_rollouts import cli, json_lines
from tests.acceptance.test_run_cli import start_runner
from tests.acceptance.test_serve import Server, free_port, wait_healthy
from tests.conftest import SQL_BACKENDS, serve_app
from tests.scripted_upstream import create_app

AGENT = "tests.acceptance.test_cli_rollouts:weather_agent"
TASK = {"question": "What is the weather in Paris?", "fail": "never"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(cwd=tmp_path)
    try:
        asyncio.run(wait_healthy(server.url, server.process))
        yield server
    finally:
        server.stop()


def run_queue(url: str) -> None:
    runner = start_runner(url, AGENT, "--idle-exit", "1")
    try:
        assert runner.wait(120) == 0, runner.stdout.read() if runner.stdout else ""
    finally:
        if runner.stdout is not None:
            runner.stdout.close()


async def statuses(url: str, ids: list[str]) -> dict[str, tuple[str, str | None, int]]:
    """Each rollout's status, resources id and number of attempts."""
    store = HttpStore(url)
    try:
        found = (await store.query_rollouts(rollout_id_in=ids)).items
        attempts = {r.rollout_id: len((await store.query_attempts(r.rollout_id)).items) for r in found}
        return {r.rollout_id: (r.status, r.resources_id, attempts[r.rollout_id]) for r in found}
    finally:
        await store.close()


def test_failed_rollouts_rerun_under_their_ids_once_re_pinned(server: Server, tmp_path: Path) -> None:
    ids = ["ro-a", "ro-b", "ro-c"]
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    cli("resources", "set-llm", dead, "--model", "scripted", "--store", server.url)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({**TASK, "id": r.removeprefix("ro-")}) + "\n" for r in ids))
    cli("enqueue", str(tasks), "--id-field", "id", "--id-prefix", "ro-", "--store", server.url)
    run_queue(server.url)
    before = asyncio.run(statuses(server.url, ids))
    assert {s for s, _, _ in before.values()} == {"failed"}
    old_snapshot = before["ro-a"][1]

    async def fix_and_retry() -> tuple[str, str, str, str]:
        async with serve_app(create_app({"city": "Paris"})) as upstream:
            # (the commands run their own event loops: in threads, beside this one's upstream)
            await asyncio.to_thread(
                cli, "resources", "set-llm", f"{upstream}/v1", "--model", "scripted", "--store", server.url
            )
            dry, dry_err = await asyncio.to_thread(cli, "rollouts", "retry", "--dry-run", "--store", server.url)
            text, err = await asyncio.to_thread(
                cli, "rollouts", "retry", "--resources", "latest", "--store", server.url
            )
            await asyncio.to_thread(run_queue, server.url)
        return dry, dry_err, text, err

    dry, dry_err, text, err = asyncio.run(fix_and_retry())
    assert "would retry 3 rollouts" in dry and all(f"{r}  failed → requeuing  {old_snapshot}" in dry for r in ids)
    assert f"3 of them run with another resources snapshot ({old_snapshot}) than the latest" in dry_err
    assert "pass --resources latest to re-pin them" in dry_err
    assert "retried 3 rollouts, pinned to rs-" in text and "note:" not in err
    after = asyncio.run(statuses(server.url, ids))
    assert {r: (s, n) for r, (s, _, n) in after.items()} == {r: ("succeeded", 2) for r in ids}
    assert len({p for _, p, _ in after.values()} | {old_snapshot}) == 2  # all re-pinned, to the one new snapshot


async def fill(database_url: str) -> None:
    """One rollout in each state the commands tell apart, all but ``ro-new`` on snapshot ``rs-old``."""
    store = await connect(database_url)
    try:
        await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")})
        once = RolloutConfig(max_attempts=1)
        modes: list[tuple[str, RolloutMode]] = [("ro-failed", "train"), ("ro-failed-val", "val"), ("ro-done", "train")]
        for rollout_id, mode in modes:
            await store.enqueue_rollout({"id": rollout_id}, mode=mode, rollout_id=rollout_id, config=once)
            claimed = await store.dequeue_rollout()
            assert claimed is not None and claimed.rollout_id == rollout_id
            status = "succeeded" if rollout_id == "ro-done" else "failed"
            await store.end_attempts([AttemptEnd(rollout_id=rollout_id, attempt_id="latest", status=status)])
        await store.enqueue_rollout({"id": "running"}, mode="train", rollout_id="ro-running")
        assert await store.dequeue_rollout() is not None
        await store.update_attempt("ro-running", "latest", status="running")
        await store.enqueue_rollout({"id": "queued"}, mode="train", rollout_id="ro-queued")
        await store.enqueue_rollout({"id": "queued-val"}, mode="val", rollout_id="ro-queued-val")
        await store.add_resources({"llm": LLM(endpoint="http://127.0.0.1:10/v1", model="m")})
    finally:
        await store.close()


async def read(database_url: str) -> dict[str, Rollout]:
    store: LightningStore = await connect(database_url)
    try:
        return {r.rollout_id: r for r in (await store.query_rollouts()).items}
    finally:
        await store.close()


def act(database_url: str, *args: str, code: int = 0) -> tuple[list[dict[str, Any]], str]:
    text, err = cli("rollouts", *args, "--store", database_url, "--json", code=code)
    return json_lines(text), err


@SQL_BACKENDS
def test_retry_requeue_and_cancel_choose_by_status_mode_and_id(database_url: str) -> None:
    asyncio.run(fill(database_url))
    snapshots = {r.resources_id for r in asyncio.run(read(database_url)).values()}
    assert len(snapshots) == 1  # every rollout pinned to the first snapshot

    dry, _ = act(database_url, "retry", "--dry-run")
    assert [(r["rollout_id"], r["dry_run"]) for r in dry] == [("ro-failed", True), ("ro-failed-val", True)]
    assert asyncio.run(read(database_url))["ro-failed"].status == "failed"  # a dry run changes nothing

    retried, err = act(database_url, "retry", "--mode", "val")
    assert [(r["rollout_id"], r["from"], r["to"]) for r in retried] == [("ro-failed-val", "failed", "requeuing")]
    assert "1 of them run with another resources snapshot" in err

    cancelled, _ = act(database_url, "cancel")  # default: every queued rollout
    assert sorted(r["rollout_id"] for r in cancelled) == ["ro-failed-val", "ro-queued", "ro-queued-val"]
    running, _ = act(database_url, "cancel", "--status", "running")
    assert [r["rollout_id"] for r in running] == ["ro-running"]

    requeued, _ = act(database_url, "requeue", "ro-done", "ro-queued", "--resources", "latest")
    stored = asyncio.run(read(database_url))
    assert [r["rollout_id"] for r in requeued] == ["ro-done", "ro-queued"]
    assert stored["ro-done"].status == stored["ro-queued"].status == "requeuing"
    assert stored["ro-done"].end_time is None and stored["ro-done"].resources_id not in snapshots
    assert {stored[r].status for r in ["ro-running", "ro-queued-val", "ro-failed-val"]} == {"cancelled"}
    assert stored["ro-failed"].status == "failed" and stored["ro-failed"].resources_id in snapshots


@SQL_BACKENDS
def test_what_cannot_be_done_is_refused_by_name(database_url: str) -> None:
    asyncio.run(fill(database_url))

    # Ids it cannot act on: one line each on stderr, the others done, exit status 1.
    named = ["ro-failed", "ro-done", "ro-typo", "ro-failed-val"]
    done, err = act(database_url, "retry", *named, "--mode", "train", code=1)
    assert [r["rollout_id"] for r in done] == ["ro-failed"]
    assert "cannot retry ro-typo: no such rollout" in err and "cannot retry ro-done: it is succeeded" in err
    assert "cannot retry ro-failed-val: its mode is val, not train" in err
    done, err = act(database_url, "cancel", "ro-done", code=1)
    assert done == [] and "cannot cancel ro-done: it is succeeded" in err

    # Usage errors: nothing is read or written, exit status 2.
    for args, line in [
        (("retry", "--status", "succeeded"), "--status succeeded: retry acts on failed, cancelled"),
        (("cancel", "--status", "failed"), "--status failed: cancel acts on queuing, requeuing, preparing, running"),
        (("requeue",), "name the rollouts: give their ids or --status"),
        (("retry", "ro-failed", "--status", "failed"), "name rollouts by id or by --status, not both"),
    ]:
        _, err = act(database_url, *args, code=2)
        assert line in err, (args, err)

    _, err = act(database_url, "retry", "--resources", "rs-typo", code=1)
    assert "cannot retry: no resources snapshot 'rs-typo' (`store resources list` shows them)" in err
    stored = asyncio.run(read(database_url))
    assert (stored["ro-failed-val"].status, stored["ro-done"].status) == ("failed", "succeeded")  # left as they were
