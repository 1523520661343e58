"""``store serve`` when its database goes away, and when it is not ready: real servers, a real network cut.

The network is a TCP forwarder in the test's event loop between ``store serve`` (a subprocess) and Postgres. It can
go down (every connection cut, new ones refused) and come back, as a database host that restarts or a network
that breaks does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from lightning_store.client import HttpStore
from lightning_store.migrate import head_revision
from lightning_store.spans import Span
from tests.acceptance.test_cli import store_command
from tests.acceptance.test_serve import CLEAN_EXIT, clean_env, free_port, postgres_url  # noqa: F401
from tests.network import Network, network_to
from tests.postgres import TemplateDatabases


class LoggedServer:
    """``store serve`` as a subprocess whose output goes to a file (read while it runs and after it stops)."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = cwd / "serve.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [*store_command(), "serve", "--port", str(self.port), *args],
            cwd=cwd,
            env={**clean_env(), **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    async def stop(self) -> int | None:
        """SIGTERM and the exit status, without blocking the event loop (the network lives in it)."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return await asyncio.to_thread(self.process.wait, 20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self._log.close()


@contextlib.asynccontextmanager
async def served_through_network(
    database_url: str, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Network, LoggedServer, httpx.AsyncClient, HttpStore]]:
    """``store serve`` on ``database_url`` through a :class:`Network`, with a raw HTTP client and an ``HttpStore``
    of it; all closed on the way out, the network flowing again first, and the server's exit checked clean."""
    network, via_network = await network_to(database_url)
    server = LoggedServer("--database-url", via_network, *args, cwd=cwd, env=env)
    http = httpx.AsyncClient(base_url=server.url, timeout=60)
    client = HttpStore(server.url)
    try:
        yield network, server, http, client
    finally:
        network.resume()
        await client.close()
        await http.aclose()
        status = await server.stop()
        await network.down()
    assert status in CLEAN_EXIT, server.log


def health_check(http: httpx.AsyncClient, server: LoggedServer) -> Callable[[], Awaitable[bool]]:
    """Whether ``server`` answers its health route with 200 now (for :func:`until`); fails the test if the
    process has exited."""

    async def healthy() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return (await http.get("/v1/agl/health")).status_code == 200
        assert server.process.poll() is None, server.log
        return False

    return healthy


async def until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
def empty_url(pg_templates: TemplateDatabases | None) -> Iterator[str]:
    """A fresh Postgres database with no schema at all."""
    if pg_templates is None:
        pytest.skip("no PostgreSQL server answers at LIGHTNING_STORE_TEST_POSTGRES_URL")
    url = asyncio.run(pg_templates.clone(migrated=False))
    yield url
    asyncio.run(pg_templates.drop(url))


UNAVAILABLE = {
    "detail": "database unavailable, retry",
    "field": None,
    "error_type": "Unavailable",
    "maybe_written": False,
}


def data_requests(rollout_id: str, attempt_id: str) -> list[tuple[str, str, Any]]:
    """One request of each kind: queue, rollouts, attempts, spans, resources, workers, waits, statistics."""
    span = {"rollout_id": rollout_id, "attempt_id": attempt_id, "sequence_id": 99, "trace_id": "ab" * 16}
    return [
        ("POST", "/v1/agl/queues/rollouts/enqueue", {"rollouts": [{"input": {"q": 2}}]}),
        ("POST", "/v1/agl/queues/rollouts/dequeue", {"limit": 1, "timeout": 5}),  # a long-poll
        ("POST", "/v1/agl/queues/rollouts/dequeue", {"limit": 1}),
        ("POST", "/v1/agl/rollouts", {"input": {"q": 3}}),
        ("POST", "/v1/agl/rollouts/search", {}),
        ("GET", f"/v1/agl/rollouts/{rollout_id}", None),
        ("GET", f"/v1/agl/rollouts/{rollout_id}/attempts/latest", None),
        ("POST", f"/v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}", {"status": "running"}),
        ("POST", "/v1/agl/spans/batch", {"spans": [{**span, "span_id": "s99", "name": "late"}]}),
        ("POST", "/v1/agl/spans/search", {"rollout_id": rollout_id}),
        ("POST", "/v1/agl/spans/next", {"rollout_id": rollout_id, "attempt_id": attempt_id}),
        ("GET", "/v1/agl/resources/latest", None),
        ("POST", "/v1/agl/workers/search", {}),
        ("POST", "/v1/agl/waits/rollouts", {"rollout_ids": [rollout_id], "timeout": 1}),
        ("GET", "/v1/agl/statistics", None),
    ]


@pytest.mark.postgres
async def test_an_outage_answers_503_until_the_database_is_back(
    postgres_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"LIGHTNING_STORE_WATCHDOG_INTERVAL": "0.2"}
    async with served_through_network(postgres_url, tmp_path, "--log-level", "debug", env=env) as (
        network,
        server,
        http,
        client,
    ):
        healthy = health_check(http, server)
        await until(healthy, 30, "store serve answers its health route")
        assert (await http.get("/v1/agl/health")).json() == {"status": "ok", "database": "ok"}
        started = await client.start_rollout({"q": 1})
        rollout_id, attempt_id = started.rollout_id, started.attempt.attempt_id
        ids = {"rollout_id": rollout_id, "attempt_id": attempt_id, "trace_id": "ab" * 16}
        await client.add_many_spans([Span(**ids, sequence_id=1, span_id="s1", name="work")])

        await network.down()
        # Every data route, twice: the first request after the cut meets a dead pooled connection, the later ones
        # a refused connect (those used to be 500s).
        for _ in range(2):
            for method, path, body in data_requests(rollout_id, attempt_id):
                answer = await http.request(method, path, json=body)
                assert answer.status_code == 503, (method, path, answer.text)
                assert answer.json() == UNAVAILABLE, (method, path)
                assert answer.headers["retry-after"] == "1"
        health = await http.get("/v1/agl/health")
        assert health.status_code == 503
        assert health.json() == {"status": "unavailable", "database": "unreachable", **UNAVAILABLE}
        await asyncio.sleep(1.0)  # several watchdog rounds fail meanwhile

        await network.up()
        await until(healthy, 10, "health is 200 again once the database is back")
        assert (await http.get("/v1/agl/health")).json() == {"status": "ok", "database": "ok"}
        for method, path, body in data_requests(rollout_id, attempt_id):
            answer = await http.request(method, path, json=body)
            assert answer.status_code < 300, (method, path, answer.text)
        assert [s.span_id for s in await client.query_spans(rollout_id)] == ["s1", "s99"]

        async def watchdog_resumed() -> bool:
            return "watchdog: the database is reachable again" in server.log

        await until(watchdog_resumed, 5, "the watchdog logs that the database is back")
    log = server.log
    warnings = [line for line in log.splitlines() if line.startswith("WARNING") and "watchdog" in line]
    assert len(warnings) == 1, log
    # Which failure the watchdog meets first depends on where its scan was when the network went down: a refused
    # connect, or its connection cut under a statement.
    assert re.search(
        r"cannot reach the database \((ConnectionRefusedError|ConnectionDoesNotExistError|InterfaceError): ",
        warnings[0],
    ), warnings[0]
    assert len([line for line in log.splitlines() if "watchdog: the database is reachable again" in line]) == 1
    assert "Traceback" not in log
    assert " 500 " not in log  # no request was answered 500 (access log)


@pytest.mark.postgres
async def test_a_stalled_database_is_answered_503_within_the_deadline_and_nothing_is_enqueued_twice(
    postgres_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    deadline = 2.0
    env = {"LIGHTNING_STORE_STATEMENT_TIMEOUT": str(deadline), "LIGHTNING_STORE_WATCHDOG_INTERVAL": "0"}
    async with served_through_network(postgres_url, tmp_path, env=env) as (network, server, http, client):
        healthy = health_check(http, server)
        await until(healthy, 30, "store serve answers its health route")
        first = await client.enqueue_rollout({"q": 0})

        network.stall()
        started = time.monotonic()
        answer = await http.post("/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": {"q": 1}}]})
        waited = time.monotonic() - started
        # Answered within the deadline and its margin (plus the time a pooled connection takes to be given up),
        # not after the stall: a client waiting 30 s hears that it may retry.
        assert answer.status_code == 503 and answer.json() == UNAVAILABLE, answer.text
        assert waited < deadline + 2 + 3, waited
        # The client's own enqueue, during the stall and after it: it retries on 503 with the same rollout id.
        enqueue = asyncio.ensure_future(client.enqueue_rollout({"q": 2}))
        await asyncio.sleep(3.0)
        network.resume()
        second = await asyncio.wait_for(enqueue, 60)
        await until(healthy, 30, "health is 200 again once the network flows")

        rollouts = await client.query_rollouts()
        inputs = sorted(str(r.input) for r in rollouts)
        # The client's enqueues are there once each, whatever the stall did to their first sending; the raw
        # request's 503 said nothing was written (its commit was never sent: the stall held its first statement),
        # and nothing was, although the held statement reached the database once the network flowed again.
        assert inputs.count(str({"q": 0})) == 1 and inputs.count(str({"q": 2})) == 1, inputs
        assert inputs.count(str({"q": 1})) == 0, inputs
        assert {first.rollout_id, second.rollout_id} <= {r.rollout_id for r in rollouts}
        assert re.fullmatch(r"ro-[0-9a-f]{20}", second.rollout_id)  # named by the client: sent again, found again
    assert "Traceback" not in server.log and " 500 " not in server.log, server.log


@pytest.mark.postgres
async def test_a_write_cut_off_in_its_commit_says_so_and_only_an_idempotent_one_is_sent_again(
    postgres_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The database commits, and the answer to the commit never arrives. The 503 says the write may have been done
    (``maybe_written``); ``HttpStore`` does not start the rollout a second time (it raises the 503: the caller looks
    first), while an enqueue, idempotent by its rollout id, is sent again and found once."""
    env = {"LIGHTNING_STORE_WATCHDOG_INTERVAL": "0"}
    async with served_through_network(postgres_url, tmp_path, env=env) as (network, server, http, client):
        await until(health_check(http, server), 30, "store serve answers its health route")

        network.cut_in_commit(after=b"INSERT INTO rollouts")
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await client.start_rollout({"q": "started"})
        assert network.cuts == 1
        assert refused.value.response.status_code == 503
        assert refused.value.response.json() == {**UNAVAILABLE, "maybe_written": True}
        assert [r.input for r in await client.query_rollouts()] == [{"q": "started"}]  # done once, not twice

        network.cut_in_commit(after=b"INSERT INTO rollouts")
        enqueued = await client.enqueue_rollout({"q": "enqueued"})
        assert network.cuts == 2
        stored = {r.rollout_id: r.input for r in await client.query_rollouts()}
        assert sorted(map(str, stored.values())) == [str({"q": "enqueued"}), str({"q": "started"})], stored
        assert stored[enqueued.rollout_id] == {"q": "enqueued"}

        # A read or a write refused before its commit says so too: nothing was written, any request may be retried.
        await network.down()
        answer = await http.post("/v1/agl/rollouts", json={"input": {"q": "refused"}})
        assert answer.status_code == 503 and answer.json() == UNAVAILABLE, answer.text
    assert "Traceback" not in server.log and " 500 " not in server.log, server.log


def run_store(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*store_command(), *args],
        cwd=cwd,
        env={**clean_env(), "COLUMNS": "80"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_line(process: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit status and the only line the command printed (it must print exactly one, and no traceback)."""
    stdout, stderr = process.communicate(timeout=60)
    lines = (stdout + stderr).strip().splitlines()
    assert len(lines) == 1, stdout + stderr
    return process.returncode, lines[0]


@pytest.mark.postgres
def test_commands_refuse_an_unmigrated_database_in_one_line(empty_url: str, tmp_path: Path) -> None:
    hint = f"run `store migrate --database-url {empty_url}`"
    started = time.monotonic()
    # At once: each command is a few seconds of imports.
    serve = run_store("serve", "--port", str(free_port()), "--database-url", empty_url, cwd=tmp_path)
    workers = run_store("serve", "--workers", "2", "--database-url", empty_url, cwd=tmp_path)
    stats = run_store("stats", "--database-url", empty_url, cwd=tmp_path)
    query = run_store("sql", "SELECT count(*) FROM rollouts_v", "--database-url", empty_url, cwd=tmp_path)
    not_migrated = f"database is not migrated (at revision none, head is {head_revision()})"
    for process in (serve, workers):
        status, line = one_line(process)
        assert status == 2
        assert line == f"cannot serve: {not_migrated}: {hint} or pass --migrate"
    status, line = one_line(stats)
    assert status == 1
    assert line == f"cannot read the store: {not_migrated}: {hint}"
    status, line = one_line(query)
    assert status == 1
    assert line == f'query failed: relation "rollouts_v" does not exist ({not_migrated}: {hint})'
    assert time.monotonic() - started < 30  # refused up front, never served


@pytest.mark.postgres
def test_serve_refuses_a_schema_it_does_not_know(empty_url: str, tmp_path: Path) -> None:
    """A database a newer lightning-store migrated: `store migrate` would not help, and the message says so."""
    import asyncpg

    async def stamp() -> None:
        conn = await asyncpg.connect(make_url(empty_url).set(drivername="postgresql").render_as_string(False))
        try:
            await conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
            await conn.execute("INSERT INTO alembic_version VALUES ('9999_from_the_future')")
        finally:
            await conn.close()

    asyncio.run(stamp())
    status, line = one_line(run_store("serve", "--port", str(free_port()), "--database-url", empty_url, cwd=tmp_path))
    assert status == 2
    assert line == (
        "cannot serve: database is at revision 9999_from_the_future, which this lightning-store does not know "
        f"(head is {head_revision()}): upgrade lightning-store"
    )


@pytest.mark.postgres
async def test_serve_with_migrate_upgrades_an_empty_database(empty_url: str, tmp_path: Path) -> None:
    server = LoggedServer("--database-url", empty_url, "--migrate", "--log-level", "warning", cwd=tmp_path)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:

            async def healthy() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get("/v1/agl/health")).status_code == 200
                assert server.process.poll() is None, server.log
                return False

            await until(healthy, 30, "store serve --migrate answers its health route")
            assert (await http.post("/v1/agl/queues/rollouts/enqueue", json={"rollouts": [{"input": 1}]})).is_success
    finally:
        assert await server.stop() in CLEAN_EXIT, server.log


def test_commands_say_in_one_line_that_the_database_cannot_be_reached(tmp_path: Path) -> None:
    nothing_listens = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/store"
    shown = nothing_listens.replace(":secret@", ":***@")
    unopenable = f"sqlite:///{tmp_path / 'no-such-directory' / 'store.db'}"
    serve = run_store("serve", "--port", str(free_port()), "--database-url", nothing_listens, cwd=tmp_path)
    serve_sqlite = run_store("serve", "--port", str(free_port()), "--database-url", unopenable, cwd=tmp_path)
    stats = run_store("stats", "--database-url", nothing_listens, cwd=tmp_path)
    query = run_store("sql", "SELECT 1", "--database-url", nothing_listens, cwd=tmp_path)
    migrate = run_store("migrate", "--database-url", nothing_listens, cwd=tmp_path)
    expected = [
        (serve, 2, f"cannot serve: cannot reach the database {shown}: ConnectionRefusedError"),
        (serve_sqlite, 2, f"cannot serve: cannot reach the database {unopenable}: OperationalError: unable to open"),
        (stats, 1, f"cannot read the store: cannot reach the database {shown}: ConnectionRefusedError"),
        (query, 1, f"query failed: cannot reach the database {shown}: ConnectionRefusedError"),
        (migrate, 1, f"cannot migrate: cannot reach the database {shown}: ConnectionRefusedError"),
    ]
    for process, code, start in expected:
        status, line = one_line(process)
        assert (status, line[: len(start)]) == (code, start), line
        assert "secret" not in line
    assert os.listdir(tmp_path) == []  # nothing created: not even the SQLite directory
