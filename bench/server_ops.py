"""Benchmark of the HTTP server: ``store serve`` (SQLite, Postgres) side by side with Agent Lightning's ``agl store``.

The same operations run against every server, each with 1 and with 8 concurrent clients:

* ``enqueue``        - ``enqueue_rollout``, one rollout per call;
* ``dequeue``        - ``dequeue_rollout(worker_id)`` (claims a rollout and starts its attempt);
* ``add_spans x100`` - ``add_many_spans`` with batches of 100 realistic spans (about 1 KB each), one batch per
  attempt. Agent Lightning's client sends them one ``POST /spans`` each; ``HttpStore`` sends one batch request;
* ``query_spans``    - the 100 spans of one rollout;
* ``query_rollouts`` - the newest 100 rollouts (``sort_by=start_time``, descending).

Servers, each a subprocess on a free 127.0.0.1 port, fresh for every client kind and stopped afterwards:
``store serve`` on a SQLite file in a temporary directory; ``store serve`` on a Postgres database created for the
run and dropped afterwards (on ``$LIGHTNING_STORE_BENCH_POSTGRES_URL``, default the local trust-auth server);
and ``agl store`` (in-memory) from the interpreter at ``$LIGHTNING_STORE_AGL_PYTHON`` or ``/tmp/aglvenv/bin/python``
when it has agentlightning.

Clients: the fair comparison is the same client against different servers, so Agent Lightning's unmodified
``LightningStoreClient`` (run by ``bench/server_ops_worker.py`` in the agl interpreter) drives every server. Our
``HttpStore`` (the same worker script, in this interpreter) also drives our servers. Concurrent clients are
asyncio tasks in the worker process, each with its own client object and connection pool. ``x agl`` is the
throughput relative to Agent Lightning's client against ``agl store`` for the same operation and concurrency.

Run from the repository root::

    python -m bench.server_ops --ops 50                     # small
    python -m bench.server_ops --ops 400 --backends sqlite,agl
    python -m bench.server_ops --json > server_ops.json

Numbers depend on the machine (client, server and database share its CPUs); treat them as indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from bench.harness import (
    AGL_ENV,
    DEFAULT_AGL_PYTHON,
    Timed,
    add_postgres_url,
    database,
    find_agl_python,
    log,
    log_tail,
    postgres_answers,
    server,
    stop,
)

BATCH = 100
OPERATIONS = ("enqueue", "dequeue", "add_spans", "query_spans", "query_rollouts")
UNITS = {"enqueue": "rollouts", "dequeue": "rollouts", "add_spans": "spans"}
BACKENDS = ("sqlite", "postgres", "agl")
WORKER = Path(__file__).with_name("server_ops_worker.py")


# Results -------------------------------------------------------------------------------------------------------


@dataclass
class Measurement(Timed):
    """One operation at one concurrency, for one client kind against one server."""

    server: str
    client: str
    operation: str
    clients: int
    calls: int
    items: int
    seconds: float
    latencies: list[float] = field(repr=False)
    errors: int = 0
    first_error: str | None = None

    @property
    def setup(self) -> str:
        return f"{self.client} -> {self.server}"

    @property
    def unit(self) -> str:
        return UNITS.get(self.operation, "queries")

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "client": self.client,
            "operation": self.operation,
            "clients": self.clients,
            "unit": self.unit,
            **self.timing_json(),
            "errors": self.errors,
            "first_error": self.first_error,
        }


# Clients ---------------------------------------------------------------------------------------------------------


class WorkerProcess:
    """A ``server_ops_worker.py`` subprocess of one client kind, driven by JSON lines."""

    def __init__(self, kind: str, python: str, directory: Path) -> None:
        self.kind = kind
        self.log_file = directory / f"worker-{kind}.log"
        env = dict(os.environ) | AGL_ENV
        with self.log_file.open("wb") as sink:
            self.process = subprocess.Popen(
                [python, str(WORKER), kind],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=sink,
                env=env,
                text=True,
                start_new_session=True,
            )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"the {kind} worker did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} worker exited:\n{log_tail(self.log_file)}")
        document: dict[str, Any] = json.loads(line)
        return document

    def send(self, command: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(command) + "\n")
        stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"the {self.kind} worker failed on {command}: {answer['traceback']}")
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop(self.process)


# The run -------------------------------------------------------------------------------------------------------


def operation_count(operation: str, args: argparse.Namespace) -> int:
    return int(args.span_batches) if operation == "add_spans" else int(args.ops)


def measure_server(
    backend: str, worker: WorkerProcess, args: argparse.Namespace, directory: Path, agl_python: str | None
) -> list[Measurement]:
    """Every operation at every concurrency, with one client kind against one fresh server of ``backend``."""
    server_name = "agl store" if backend == "agl" else f"ours {backend}"
    client_name = "agl client" if worker.kind == "agl" else "HttpStore"
    results: list[Measurement] = []
    run_id = uuid.uuid4().hex
    with (
        database(backend, args.postgres_url, directory) as database_url,
        server(backend, directory, database_url, agl_python) as url,
    ):
        for clients in args.clients:
            for operation in OPERATIONS:
                log(f"[{client_name} -> {server_name}] {operation}, {clients} client(s) ...")
                command = {
                    "op": operation,
                    "server": run_id,
                    "url": url,
                    "clients": clients,
                    "count": operation_count(operation, args),
                }
                answer = worker.send(command)
                results.append(Measurement(server_name, client_name, operation, clients, **answer))
        worker.send({"op": "close", "server": run_id})
    return results


def plan(args: argparse.Namespace, agl_python: str | None) -> list[tuple[str, str]]:
    """(backend, client kind) pairs to run: the agl client everywhere it can run, HttpStore on our servers."""
    pairs = []
    for backend in args.backends:
        if backend == "postgres" and not postgres_answers(args.postgres_url):
            continue
        if backend == "agl" and agl_python is None:
            log("[agl] skipped: no interpreter with agentlightning (set $LIGHTNING_STORE_AGL_PYTHON)")
            continue
        if agl_python is not None:
            pairs.append((backend, "agl"))
        if backend != "agl":
            pairs.append((backend, "ours"))
    return pairs


def run_all(args: argparse.Namespace) -> list[Measurement]:
    agl_python = find_agl_python(args.agl_python)
    pairs = plan(args, agl_python)
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="ls_bench_http_") as tmp:
        directory = Path(tmp)
        workers: dict[str, WorkerProcess] = {}
        try:
            for kind in sorted({kind for _, kind in pairs}):
                log(f"starting the {kind} client worker ...")
                python = agl_python if kind == "agl" and agl_python is not None else sys.executable
                workers[kind] = WorkerProcess(kind, python, directory)
            for backend, kind in pairs:
                results += measure_server(backend, workers[kind], args, directory, agl_python)
        finally:
            for worker in workers.values():
                worker.close()
    return results


# Output --------------------------------------------------------------------------------------------------------

BASELINE = "agl client -> agl store"


def baseline(results: Sequence[Measurement], operation: str, clients: int) -> Measurement | None:
    return next((m for m in results if (m.setup, m.operation, m.clients) == (BASELINE, operation, clients)), None)


def ratio(measurement: Measurement, results: Sequence[Measurement]) -> float | None:
    base = baseline(results, measurement.operation, measurement.clients)
    return None if base is None or base.throughput == 0 else measurement.throughput / base.throughput


def setup_order(measurement: Measurement) -> tuple[int, str]:
    """The baseline first, then Agent Lightning's client against our servers, then HttpStore."""
    rank = 0 if measurement.setup == BASELINE else 1 if measurement.client == "agl client" else 2
    return rank, measurement.server


def render_table(results: Sequence[Measurement], args: argparse.Namespace, console: Console) -> None:
    title = f"Server operations ({args.ops} calls per operation, {args.span_batches} span batches of {BATCH})"
    table = Table(title=title)
    for column in ("operation", "clients", "client -> server", "calls", "per second", "p50 ms", "p99 ms", "x agl"):
        table.add_column(column, justify="left" if column in ("operation", "client -> server") else "right")
    groups = [(op, c) for c in args.clients for op in OPERATIONS]
    for op, clients in groups:
        rows = sorted((m for m in results if (m.operation, m.clients) == (op, clients)), key=setup_order)
        for index, m in enumerate(rows):
            factor = ratio(m, results)
            table.add_row(
                f"{op} x{BATCH}" if op == "add_spans" else op,
                str(clients),
                m.setup + (f" [red]({m.errors} wrong)[/red]" if m.errors else ""),
                str(m.calls),
                f"{m.throughput:,.0f} {m.unit}/s",
                f"{m.percentile(50) * 1000:.2f}",
                f"{m.percentile(99) * 1000:.2f}",
                "-" if factor is None else f"{factor:.2f}x",
                end_section=index == len(rows) - 1,
            )
    console.print(table)
    for m in results:
        if m.errors:
            console.print(
                f"[red]{m.setup}, {m.operation} ({m.clients}): {m.errors} wrong answers[/red]: {m.first_error}"
            )
    console.print(
        f"[dim]x agl = throughput / ({BASELINE}) for the same operation and clients. {os.cpu_count()} CPUs, shared "
        "by client, server and database; numbers are indicative.[/dim]"
    )


def render_json(results: Sequence[Measurement], args: argparse.Namespace) -> str:
    document = {
        "config": {
            "ops": args.ops,
            "span_batches": args.span_batches,
            "batch": BATCH,
            "clients": args.clients,
            "backends": args.backends,
            "cpus": os.cpu_count(),
        },
        "baseline": BASELINE,
        "results": [m.to_json() | {"x_agl": _rounded(ratio(m, results))} for m in results],
    }
    return json.dumps(document, indent=2)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# Command line --------------------------------------------------------------------------------------------------


def backend_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = set(names) - set(BACKENDS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(BACKENDS)}, not {sorted(unknown) or value!r}")
    return names


def client_counts(value: str) -> list[int]:
    counts = [int(part) for part in value.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"client counts must be positive integers, not {value!r}")
    return counts


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--ops", type=positive, default=200, help="calls per operation (enqueue, dequeue, queries)")
    parser.add_argument(
        "--span-batches", type=positive, default=None, help=f"batches of {BATCH} spans to add [default: ops / 10]"
    )
    parser.add_argument("--backends", type=backend_list, default=list(BACKENDS), help="default: sqlite,postgres,agl")
    parser.add_argument("--clients", type=client_counts, default=[1, 8], help="concurrent clients [default: 1,8]")
    add_postgres_url(parser)
    parser.add_argument("--agl-python", default=None, help=f"interpreter with agentlightning [{DEFAULT_AGL_PYTHON}]")
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    args = parser.parse_args(argv)
    if args.span_batches is None:
        args.span_batches = max(1, args.ops // 10)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    results = run_all(args)
    if args.json:
        print(render_json(results, args))
    else:
        render_table(results, args, Console(width=max(Console().width, 140)))


if __name__ == "__main__":
    main()
