"""Hosts on one machine: Linux network namespaces joined by one switch.

Each host is a namespace with one address, ``10.77.0.N/24`` on its ``eth0``, a veth pair whose other end is a port
of a bridge in a namespace of its own (the switch). Nothing is added to the machine's own namespace (no address,
route or rule), so the cluster cannot touch the machine's network; names carry the creating process's id, so two
test processes build two clusters side by side. ``close()`` kills every process in the hosts and removes them.

Faults, each undone by its pair:

- ``partition(a, b)`` / ``heal(a, b)``: each of the two drops what it sends to the other (blackhole routes).
  Connections between them hang, with no reset, as across a real partition; others go on.
- ``loss(host, percent)`` / ``loss(host, 0)``: nftables in the host drops that share of its packets, each way, at
  random. The kernel has no ``netem`` qdisc, so latency is the load balancer's (``balancer.py``).
- ``kill(host)``: its processes are killed with SIGKILL; its kernel still answers (connections are reset).
- ``vanish(host)``: its link goes down, then its processes are killed: gone without a word, as a host that loses
  power. ``appear(host)`` brings the link back up (empty).

Needs root (namespaces, links) and the ``ip`` and ``nft`` commands; :func:`unavailable` says why not, if not.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUBNET = "10.77.0"


def unavailable() -> str | None:
    """Why a cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for command in ("ip", "nft"):
        if shutil.which(command) is None:
            return f"needs the {command} command (Debian: iproute2, nftables)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Cluster:
    """Hosts by name, each with its address (``address(name)``), built on ``__enter__``."""

    names: Sequence[str]
    logs: Path
    """Where each process's output goes, ``<host>-<label>.log``."""
    _prefix: str = field(default_factory=lambda: f"lsc{os.getpid()}")
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _sinks: list[IO[bytes]] = field(default_factory=list)

    def namespace(self, host: str) -> str:
        return f"{self._prefix}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{self.names.index(host) + 2}"

    def __enter__(self) -> Cluster:
        switch = self.namespace("switch")
        try:
            _ip("netns", "add", switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for host in self.names:
                ns = self.namespace(host)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                port = f"p-{host}"[:15]
                _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", switch, "link", "set", port, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for host in self.names:
            self.kill(host)
        for process in self._processes:
            if process.stdin is not None:
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for sink in self._sinks:
            sink.close()
        for host in [*self.names, "switch"]:
            _ip("netns", "del", self.namespace(host), check=False)

    # -- processes --------------------------------------------------------------------------------------------

    def spawn(
        self,
        host: str,
        argv: Sequence[str],
        label: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdin: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """``argv`` run in ``host`` (``ip netns exec`` replaces itself with it), its output in the host's log."""
        sink = (self.logs / f"{host}-{label}.log").open("ab")
        self._sinks.append(sink)
        process = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(host), *argv],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
        self._processes.append(process)
        return process

    def run(self, host: str, argv: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``argv`` run in ``host`` to its end; raises with its output if it fails."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.namespace(host), *argv], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"{host}: {' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
        return done

    def pids(self, host: str) -> list[int]:
        listed = _ip("netns", "pids", self.namespace(host), check=False).stdout
        return [int(pid) for pid in listed.split()]

    # -- faults -----------------------------------------------------------------------------------------------

    def kill(self, host: str) -> None:
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def vanish(self, host: str) -> None:
        _ip("-n", self.namespace(host), "link", "set", "eth0", "down")
        self.kill(host)

    def appear(self, host: str) -> None:
        ns = self.namespace(host)
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "addr", "replace", f"{self.address(host)}/24", "dev", "eth0")

    def partition(self, a: str, b: str) -> None:
        _ip("-n", self.namespace(a), "route", "add", "blackhole", self.address(b))
        _ip("-n", self.namespace(b), "route", "add", "blackhole", self.address(a))

    def heal(self, a: str, b: str) -> None:
        _ip("-n", self.namespace(a), "route", "del", "blackhole", self.address(b), check=False)
        _ip("-n", self.namespace(b), "route", "del", "blackhole", self.address(a), check=False)

    def loss(self, host: str, percent: int) -> None:
        """Drop ``percent`` % of what ``host`` sends and receives on its link, at random (0: none)."""
        ns = self.namespace(host)
        subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "loss"], capture_output=True, check=False
        )
        if percent <= 0:
            return
        drop = f"numgen random mod 100 < {percent} drop"
        rules = f"""table inet loss {{
            chain input {{ type filter hook input priority 0; iifname "eth0" {drop}; }}
            chain output {{ type filter hook output priority 0; oifname "eth0" {drop}; }}
        }}"""
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True, check=True, timeout=30)
