"""``store enqueue`` and ``store resources …`` as a newcomer runs them: subprocesses against a real ``store serve``
subprocess (with a bearer token) and against database URLs (SQLite, and Postgres where one answers).

The commands run as ``python -c "from lightning_store.cli import app; app()"``: the same command group as the
``store`` script without loading the entry-point plugins (the algorithms plugin imports torch, three seconds a
start); one test runs the installed ``store`` script itself.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from lightning_store.client import HttpStore
from lightning_store.contract import LightningStore
from lightning_store.sql import open_store
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import Server, clean_env, free_port, wait_healthy

TOKEN = "t0ken-of-the-tests"
KEY = "sk-test-0123456789abcd"
FAST = [sys.executable, "-c", "from lightning_store.cli import app; app(prog_name='store')"]


async def store(
    *args: str,
    stdin: str = "",
    cwd: Path,
    token: str | None = TOKEN,
    env: dict[str, str] | None = None,
    script: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``store ARGS`` with ``stdin`` as its input and ``token`` in LIGHTNING_STORE_TOKEN."""
    environment = {**clean_env(), "COLUMNS": "200", **(env or {})}  # COLUMNS: rich must not wrap the lines
    if token is not None:
        environment["LIGHTNING_STORE_TOKEN"] = token
    argv = [*(store_command() if script else FAST), *args]
    return await asyncio.to_thread(
        subprocess.run, argv, input=stdin, env=environment, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The failure's only line on stderr (nothing on stdout)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and not result.stdout, result.stdout + result.stderr
    return lines[0]


def jsonl(*values: object) -> str:
    return "".join(json.dumps(value) + "\n" for value in values)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One ``store serve`` on SQLite that wants TOKEN, shared by the tests of this module (each uses its own
    rollout ids; only test_resources_round_trip writes resources)."""
    served = Server("--token", TOKEN, cwd=tmp_path_factory.mktemp("served"))
    try:
        asyncio.run(wait_healthy(served.url, served.process))
        yield served
    finally:
        served.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[HttpStore]:
    http = HttpStore(server.url, token=TOKEN)
    yield http
    await http.close()


async def test_enqueue_a_file_twice_with_an_id_field_is_idempotent(
    server: Server, client: HttpStore, tmp_path: Path
) -> None:
    tasks = [{"task_id": "a", "q": 1}, {"task_id": "b", "q": 2}, {"task_id": 3, "q": 3}]
    (tmp_path / "tasks.jsonl").write_text(jsonl(*tasks[:2]) + "\n" + jsonl(tasks[2]))
    options = ["--store", server.url, "--id-field", "task_id", "--id-prefix", "idem-", "--max-attempts", "2"]
    options += ["--retry-on", "failed", "--metadata", '{"exp": "e1"}']

    first = await store("enqueue", "tasks.jsonl", *options, "--mode", "train", cwd=tmp_path, script=True)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["idem-a", "idem-b", "idem-3"]
    assert "enqueued 3 rollouts (mode train" in first.stderr
    stored = await client.query_rollouts(rollout_id_contains="idem-", sort_by="rollout_id")
    assert [r.input for r in stored] == [tasks[2], tasks[0], tasks[1]]
    for rollout in stored:
        assert (rollout.mode, rollout.metadata, rollout.status) == ("train", {"exp": "e1"}, "queuing")
        assert (rollout.config.max_attempts, rollout.config.retry_condition) == (2, ["failed"])

    again = await store("enqueue", "tasks.jsonl", *options, "--mode", "val", "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in again.stdout.splitlines()]
    assert [(r["rollout_id"], r["existed"], r["mode"]) for r in rows] == [
        ("idem-a", True, "train"),
        ("idem-b", True, "train"),
        ("idem-3", True, "train"),
    ]
    assert "enqueued 0 rollouts; 3 already existed and were left unchanged" in again.stderr
    after = await client.query_rollouts(rollout_id_contains="idem-")
    assert after.total == 3 and {r.mode for r in after} == {"train"}


async def test_enqueue_from_stdin_tasks_and_whole_requests(server: Server, client: HttpStore, tmp_path: Path) -> None:
    tasks = await store("enqueue", "--store", server.url, stdin='{"n": 1}\n\n"plain"\n', cwd=tmp_path)
    assert tasks.returncode == 0, tasks.stderr
    ids = tasks.stdout.split()
    assert len(ids) == 2 and "enqueued 2 rollouts (no mode" in tasks.stderr
    assert [(await client.get_rollout_by_id(i)).input for i in ids] == [{"n": 1}, "plain"]  # type: ignore[union-attr]

    lines = jsonl(
        {"input": {"n": 2}, "rollout_id": "req-1"},
        {
            "input": {"n": 3},
            "rollout_id": "req-2",
            "mode": "test",
            "config": {"timeout_seconds": 5},
            "metadata": {"b": 2},
        },
    )
    options = ["--requests", "--mode", "val", "--max-attempts", "3", "--metadata", '{"a": 1}', "--store", server.url]
    requests = await store("enqueue", "-", *options, stdin=lines, cwd=tmp_path)
    assert requests.returncode == 0, requests.stderr
    assert requests.stdout.split() == ["req-1", "req-2"]
    one, two = [await client.get_rollout_by_id(i) for i in ("req-1", "req-2")]
    assert one is not None and two is not None
    assert (one.mode, one.config.max_attempts, one.config.timeout_seconds, one.metadata) == ("val", 3, None, {"a": 1})
    assert (two.mode, two.config.max_attempts, two.config.timeout_seconds) == ("test", 3, 5)
    assert two.metadata == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    ("lines", "options", "message"),
    [
        (['{"q": 1}', '{"q": 2}', '{"q":'], [], "tasks.jsonl:3: not JSON (Expecting value)"),
        (
            ['{"input": 1}', '{"input": 2, "config": {"max_attempts": 0}}'],
            ["--requests"],
            "tasks.jsonl:2: config.max_attempts: Input should be greater than or equal to 1",
        ),
        (['{"id": "x"}', '{"name": "y"}'], ["--id-field", "id"], "tasks.jsonl:2: id: missing"),
        (["", "  "], [], "tasks.jsonl holds no tasks"),
    ],
    ids=["not-json", "bad-config", "no-id", "empty"],
)
async def test_a_bad_line_writes_nothing(
    server: Server, client: HttpStore, tmp_path: Path, lines: list[str], options: list[str], message: str
) -> None:
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    before = (await client.statistics())["total_rollouts"]
    result = await store("enqueue", "tasks.jsonl", "--store", server.url, *options, cwd=tmp_path)
    assert result.returncode == 1 and not result.stdout, result.stderr
    assert message in result.stderr
    assert (await client.statistics())["total_rollouts"] == before


async def test_resources_round_trip(server: Server, client: HttpStore, tmp_path: Path) -> None:
    at = ["--store", server.url]
    llm = ["http://127.0.0.1:9/v1", "--model", "m1", "--api-key", KEY, "--sampling", '{"temperature": 0.5}']
    first = await store("resources", "set-llm", *llm, *at, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "prompt.txt").write_text("You are {role}.\nAnswer: {question}")
    second = await store("resources", "set-prompt", "system", "--file", "prompt.txt", *at, cwd=tmp_path)
    third = await store("resources", "set-llm", "http://127.0.0.1:9/v1", "--model", "m2", *at, cwd=tmp_path)
    assert second.returncode == 0 and third.returncode == 0, second.stderr + third.stderr
    rid1, rid2, rid3 = first.stdout.strip(), second.stdout.strip(), third.stdout.strip()
    assert f"based on {rid1} version 1" in second.stderr

    latest = await client.get_latest_resources()
    assert latest is not None and latest.resources_id == rid3
    assert latest.resources["main_llm"].model == "m2"  # type: ignore[union-attr]
    assert latest.resources["system"].template == "You are {role}.\nAnswer: {question}"  # type: ignore[union-attr]
    old = await client.get_resources_by_id(rid1)  # a snapshot is never edited
    assert old is not None and old.resources["main_llm"].api_key == KEY  # type: ignore[union-attr]
    assert old.resources["main_llm"].sampling_parameters == {"temperature": 0.5}  # type: ignore[union-attr]

    shown, as_json, secrets, listed = await asyncio.gather(
        store("resources", "show", *at, cwd=tmp_path),
        store("resources", "show", rid1, "--json", *at, cwd=tmp_path),
        store("resources", "show", rid1, "--json", "--show-secrets", *at, cwd=tmp_path),
        store("resources", "list", "--json", *at, cwd=tmp_path),
    )
    assert shown.returncode == 0 and f"{rid3} (latest)" in shown.stdout and "model     m2" in shown.stdout
    assert "  | You are {role}.\n  | Answer: {question}" in shown.stdout
    assert json.loads(as_json.stdout)["resources"]["main_llm"]["api_key"] == "sk-…abcd" and KEY not in as_json.stdout
    assert json.loads(secrets.stdout) == old.model_dump(mode="json")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["resources_id"] for r in rows] == [rid3, rid2, rid1]
    assert rows[0]["resources"] == {"main_llm": "llm", "system": "prompt_template"}

    task = '{"q": 1}\n'
    on_latest, on_first, unknown = await asyncio.gather(
        store("enqueue", *at, stdin=task, cwd=tmp_path),
        store("enqueue", *at, "--resources-id", rid1, stdin=task, cwd=tmp_path),
        store("enqueue", *at, "--resources-id", "rs-unknown", stdin=task, cwd=tmp_path),
    )
    assert f"resources {rid3}" in on_latest.stderr and f"resources {rid1}" in on_first.stderr
    for result, rid in ((on_latest, rid3), (on_first, rid1)):
        rollout = await client.get_rollout_by_id(result.stdout.strip())
        assert rollout is not None and rollout.resources_id == rid
    assert unknown.returncode == 1 and "no resources 'rs-unknown'" in one_line(unknown)


async def test_bad_resources_input_is_one_line(server: Server, tmp_path: Path) -> None:
    at = ["--store", server.url]
    cases = [
        (["set-llm", "localhost:8000", "--model", "m"], 2, "is not an http(s) URL"),
        (["set-llm", "http://h/v1", "--model", "m", "--sampling", "[1]"], 2, "--sampling: must be a JSON object"),
        (["set-prompt", "p", "Hello {name"], 2, "not an f-string template"),
        (["show", "rs-nope"], 1, "no resources 'rs-nope' in the store"),
    ]
    results = await asyncio.gather(*(store("resources", *args, *at, cwd=tmp_path) for args, _, _ in cases))
    for (args, code, message), result in zip(cases, results, strict=True):
        assert result.returncode == code and message in one_line(result), (args, result.stderr)


@pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_against_a_database_url(database_url: str, tmp_path: Path) -> None:
    at = ["--store", database_url]
    tasks = jsonl({"id": "t1"}, {"id": "t2"})
    first = await store("enqueue", "--id-field", "id", *at, stdin=tasks, cwd=tmp_path, token=None)

    async def write_and_show() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        llm = ["http://h:1/v1", "--model", "m", "--api-key", KEY, "--id", "policy"]  # update_resources("policy")
        written = await store("resources", "set-llm", *llm, *at, cwd=tmp_path)
        return written, await store("resources", "show", *at, cwd=tmp_path)

    again, (written, shown) = await asyncio.gather(
        store("enqueue", "--id-field", "id", *at, stdin=tasks, cwd=tmp_path, token=None), write_and_show()
    )
    assert first.stdout.split() == again.stdout.split() == ["t1", "t2"], first.stderr + again.stderr
    assert "2 already existed" in again.stderr
    assert written.stdout == "policy\n" and "version 1" in written.stderr
    assert "policy (latest)  version 1" in shown.stdout and "sk-…abcd" in shown.stdout and KEY not in shown.stdout

    target: LightningStore = await open_store(database_url, watchdog=False)
    try:
        assert (await target.query_rollouts()).total == 2
        latest = await target.get_latest_resources()
        assert latest is not None and (latest.resources_id, latest.version) == ("policy", 1)
    finally:
        await target.close()


async def test_no_server_or_a_wrong_token_is_one_line(server: Server, client: HttpStore, tmp_path: Path) -> None:
    before = (await client.statistics())["total_rollouts"]
    nobody = f"http://127.0.0.1:{free_port()}"  # through $LIGHTNING_STORE_URL, the default of --store
    missing, wrong, gone = await asyncio.gather(
        store("resources", "list", "--store", server.url, cwd=tmp_path, token=None),
        store("enqueue", "--store", server.url, stdin='{"q": 1}\n', cwd=tmp_path, token="wrong"),
        store("enqueue", stdin='{"q": 1}\n', cwd=tmp_path, env={"LIGHTNING_STORE_URL": nobody}),
    )
    assert missing.returncode == 1 and "wants a bearer token" in one_line(missing)
    assert wrong.returncode == 1 and "wants a bearer token" in one_line(wrong)
    assert (await client.statistics())["total_rollouts"] == before
    assert gone.returncode == 1 and f"cannot reach the store at {nobody}" in one_line(gone)
