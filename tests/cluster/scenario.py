"""A short training run across hosts, with faults injected while it runs, then audited from the database.

The hosts: ``pg`` (PostgreSQL), ``srv1`` and ``srv2`` (``store serve`` on it), ``lb`` (the balancer in front of
them, which every client uses), ``run1`` and ``run2`` (``store run``, the flight agent, two workers each),
``trainer`` (``store train --algorithm grpo --workers 0``, its policy server on its own address) and ``writer``
(the client that logs each acknowledged write). :func:`run_scenario` builds them, waits for the first training
step, injects the faults one after another (each held, then healed), lets the run finish (a trainer that exits
with an error is started again, and resumes from its checkpoint, as a supervisor would), and returns the audit.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.hosts import Cluster

REPO = Path(__file__).parents[2]
HOSTS = ("pg", "srv1", "srv2", "lb", "run1", "run2", "trainer", "writer")
TOKEN = "cluster-token"
PORT = 4747
TIMEOUT = 15.0
"""The rollouts' attempt timeout (``rollout_timeout``): a vanished runner's attempt is given up after it."""
WATCHDOG = 2.0
SLACK = WATCHDOG + 8.0
"""How far past its timeout an attempt may end: the watchdog's interval, and a loaded machine's margin."""


@dataclass
class Deployment:
    """The running cluster and the handles a fault needs."""

    cluster: Cluster
    work: Path
    steps: int
    model: Path
    pg_bin: Path = field(default_factory=lambda: _postgres_bin())
    balancer: subprocess.Popen[bytes] | None = None
    trainer: subprocess.Popen[bytes] | None = None
    trainer_starts: int = 0
    events: list[str] = field(default_factory=list)

    @property
    def store_url(self) -> str:
        return f"http://{self.cluster.address('lb')}:{PORT}"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "LIGHTNING_STORE_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", **extra}

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic():.1f} {what}")

    # -- the hosts' services ----------------------------------------------------------------------------------

    def start_postgres(self) -> None:
        data = self.work / "pg"
        data.mkdir()
        shutil.chown(data, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
        subprocess.run(
            [*as_pg, str(self.pg_bin / "initdb"), "-D", str(data / "data"), "-U", "postgres", "--auth=trust"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with (data / "data" / "pg_hba.conf").open("a") as hba:  # the cluster's hosts connect over its subnet
            hba.write(f"host all all {self.cluster.address('pg').rsplit('.', 1)[0]}.0/24 trust\n")
        self._pg_ctl("start")
        self.cluster.run("pg", [*as_pg, "psql", "-h", "127.0.0.1", "-c", "CREATE DATABASE store"])
        self.cluster.run(
            "pg",
            [
                sys.executable,
                "-m",
                "lightning_store.cli",
                "migrate",
                "--database-url",
                "postgresql+asyncpg://postgres@127.0.0.1:5432/store",
            ],
        )

    def _pg_ctl(self, action: str, *args: str) -> None:
        data = self.work / "pg"
        options = f"-c listen_addresses='{self.cluster.address('pg')},127.0.0.1' -p 5432 -k {data}"
        argv = ["runuser", "-u", "postgres", "--", str(self.pg_bin / "pg_ctl"), "-D", str(data / "data")]
        self.cluster.run("pg", [*argv, "-l", str(data / "log"), "-w", "-o", options, *args, action], timeout=120)

    def restart_postgres(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def start_server(self, host: str) -> None:
        """``store serve`` under a supervisor that starts it again a second after it exits (systemd's
        ``Restart=always``): a server that starts while Postgres restarts exits, as it should, and comes back."""
        url = f"postgresql+asyncpg://postgres@{self.cluster.address('pg')}:5432/store"
        argv = [sys.executable, "-m", "lightning_store.cli", "serve", "--database-url", url]
        argv += ["--host", self.cluster.address(host), "--port", str(PORT), "--token", TOKEN, "--no-otlp-grpc"]
        supervised = ["bash", "-c", f"while :; do {shlex.join(argv)}; sleep 1; done"]
        self.cluster.spawn(host, supervised, "serve", env=self.env(LIGHTNING_STORE_WATCHDOG_INTERVAL=str(WATCHDOG)))

    def start_balancer(self) -> None:
        targets = [f"{self.cluster.address(host)}:{PORT}" for host in ("srv1", "srv2")]
        argv = [sys.executable, "-m", "tests.cluster.balancer", f"{self.cluster.address('lb')}:{PORT}", *targets]
        self.balancer = self.cluster.spawn("lb", argv, "balancer", cwd=REPO, stdin=subprocess.PIPE)

    def delay(self, seconds: float) -> None:
        assert self.balancer is not None and self.balancer.stdin is not None
        self.balancer.stdin.write(f"delay {seconds}\n".encode())
        self.balancer.stdin.flush()

    def start_runner(self, host: str) -> None:
        argv = [sys.executable, "-m", "lightning_store.cli", "run", "examples.flight.agent:flight_agent"]
        argv += ["--store", self.store_url, "--workers", "2", "--heartbeat", "2"]
        self.cluster.spawn(host, argv, "runner", env=self.env(), cwd=REPO)

    def start_writer(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "tests.cluster.writer", self.store_url, str(self.work / "acks.jsonl")]
        return self.cluster.spawn("writer", argv, "writer", env=self.env(), cwd=REPO)

    def start_trainer(self) -> None:
        argv = [sys.executable, "-m", "lightning_store.cli", "train", "--algorithm", "grpo", "--workers", "0"]
        argv += ["--store", self.store_url, "--model", str(self.model), "--output", str(self.work / "run")]
        argv += ["--train", str(REPO / "examples/flight/train.jsonl"), "--val", str(self.work / "val.jsonl")]
        argv += ["--steps", str(self.steps), "--policy-host", self.cluster.address("trainer")]
        argv += ["--decode-threads", "1", "--config", str(self.work / "grpo.yaml")]
        self.trainer_starts += 1
        self.trainer = self.cluster.spawn("trainer", argv, f"train{self.trainer_starts}", env=self.env(), cwd=REPO)
        self.note(f"trainer started ({self.trainer_starts})")

    def steps_logged(self) -> int:
        """Training steps the trainer's runs have printed (step 0, the first evaluation, included)."""
        logged = 0
        for log in self.cluster.logs.glob("trainer-train*.log"):
            logged += sum('"event": "step"' in line for line in log.read_text(errors="replace").splitlines())
        return logged


@dataclass
class Fault:
    """A fault: ``inject`` it, keep it ``hold`` seconds, then ``heal`` it."""

    name: str
    inject: Callable[[Deployment], None]
    heal: Callable[[Deployment], None]
    hold: float = 6.0


def _restart_server(d: Deployment, host: str) -> None:
    d.start_server(host)


def _replace_runner(d: Deployment, host: str) -> None:
    d.cluster.appear(host)  # a new host in its place, with the same address
    d.start_runner(host)


def _slow_and_lossy(d: Deployment, delay: float, percent: int) -> None:
    d.delay(delay)
    for host in ("run1", "run2", "trainer", "writer"):
        d.cluster.loss(host, percent)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in [
        Fault(
            "runner partitioned from the servers",
            lambda d: d.cluster.partition("run1", "lb"),
            lambda d: d.cluster.heal("run1", "lb"),
        ),
        Fault(
            "server partitioned from Postgres",
            lambda d: d.cluster.partition("srv1", "pg"),
            lambda d: d.cluster.heal("srv1", "pg"),
        ),
        Fault(
            "server host killed (-9), then restarted",
            lambda d: d.cluster.kill("srv1"),
            lambda d: _restart_server(d, "srv1"),
            hold=3.0,
        ),
        Fault("Postgres restarted", lambda d: d.restart_postgres(), lambda d: None, hold=0.0),
        Fault(
            "200 ms latency, 5 % loss",
            lambda d: _slow_and_lossy(d, 0.1, 5),
            lambda d: _slow_and_lossy(d, 0.0, 0),
            hold=10.0,
        ),
        Fault(
            "runner host vanishes mid-attempt",
            lambda d: d.cluster.vanish("run2"),
            lambda d: _replace_runner(d, "run2"),
            hold=5.0,
        ),
    ]
}


def combined(names: Sequence[str]) -> Fault:
    """The faults ``names`` at once: injected together, healed together after the longest hold."""
    faults = [FAULTS[name] for name in names]

    def inject(d: Deployment) -> None:
        for fault in faults:
            fault.inject(d)

    def heal(d: Deployment) -> None:
        for fault in faults:
            fault.heal(d)

    return Fault(" + ".join(names), inject, heal, hold=max(fault.hold for fault in faults))


def _postgres_bin() -> Path:
    initdbs = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not initdbs:
        raise RuntimeError("no PostgreSQL server binaries (Debian: postgresql)")
    return initdbs[-1].parent


def run_scenario(faults: Sequence[Fault], model: Path, logs: Path, *, steps: int = 6) -> dict[str, Any]:
    """Builds the cluster, trains ``steps`` steps through ``faults`` (one after another, from the first step on)
    and returns the audit (``tests.cluster.audit``) with ``events``, ``trainer_starts`` and
    ``faults_before_end`` (whether the run was still going when the last fault was healed: else that fault proved
    nothing)."""
    work = Path(tempfile.mkdtemp(prefix="ls-cluster-"))
    os.chmod(work, 0o755)  # the postgres user reads its data folder below it
    val = (REPO / "examples/flight/val.jsonl").read_text().splitlines()[:2]
    (work / "val.jsonl").write_text("".join(line + "\n" for line in val))
    (work / "grpo.yaml").write_text(
        f"tasks_per_step: 4\ngroup_size: 2\neval_repeats: 1\nlearning_rate: 1.0e-4\n"
        f"rollout_timeout: {TIMEOUT}\nmax_attempts: 3\n"
    )
    try:
        with Cluster(HOSTS, logs) as cluster:
            d = Deployment(cluster, work, steps, model)
            d.start_postgres()
            for host in ("srv1", "srv2"):
                d.start_server(host)
            d.start_balancer()
            _wait_healthy(d)
            for host in ("run1", "run2"):
                d.start_runner(host)
            writer = d.start_writer()
            d.start_trainer()
            deadline = time.monotonic() + 180
            while d.steps_logged() < 2:  # the first evaluation and the first update: rollouts are flowing
                _restart_if_exited(d)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no training step within 180 s; logs in {logs}")
                time.sleep(0.5)
            faults_before_end = False
            for fault in faults:
                d.note(f"inject: {fault.name}")
                fault.inject(d)
                time.sleep(fault.hold)
                fault.heal(d)
                d.note(f"healed: {fault.name}")
                faults_before_end = d.trainer is not None and d.trainer.poll() is None
                time.sleep(3.0)
            deadline = time.monotonic() + 300
            while not _finished(d):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the training run did not finish within 300 s; logs in {logs}")
                time.sleep(1.0)
            writer.send_signal(signal.SIGTERM)
            writer.wait(timeout=60)
            audit = cluster.run(
                "pg",
                [
                    sys.executable,
                    "-m",
                    "tests.cluster.audit",
                    "postgresql://postgres@127.0.0.1:5432/store",
                    str(work / "acks.jsonl"),
                    str(steps),
                    str(SLACK),
                ],
            )
            result: dict[str, Any] = json.loads(audit.stdout)
            result["events"] = d.events
            result["trainer_starts"] = d.trainer_starts
            result["faults_before_end"] = faults_before_end
            return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wait_healthy(d: Deployment) -> None:
    deadline = time.monotonic() + 60
    for host in ("srv1", "srv2"):
        url = f"http://{d.cluster.address(host)}:{PORT}/v1/agl/health"
        while True:
            probe = [sys.executable, "-c", f"import urllib.request; urllib.request.urlopen({url!r}, timeout=2)"]
            answered = subprocess.run(["ip", "netns", "exec", d.cluster.namespace("lb"), *probe], capture_output=True)
            if answered.returncode == 0:
                break
            if time.monotonic() > deadline:
                log = (d.cluster.logs / f"{host}-serve.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{host} did not answer {url} within 60 s:\n{log}")
            time.sleep(0.3)


def _restart_if_exited(d: Deployment) -> None:
    """A trainer that exited with an error is started again (it resumes from its newest checkpoint)."""
    if d.trainer is not None and d.trainer.poll() not in (None, 0):
        d.note(f"trainer exited {d.trainer.returncode}")
        if d.trainer_starts >= 4:
            raise RuntimeError("the trainer failed 4 times")
        d.start_trainer()


def _finished(d: Deployment) -> bool:
    _restart_if_exited(d)
    return d.trainer is not None and d.trainer.poll() == 0
