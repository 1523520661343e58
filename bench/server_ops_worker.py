# mypy: ignore-errors
"""The timed client loop of ``bench/server_ops.py``, run as a subprocess: one per client kind.

``agl``  runs in an interpreter with ``agentlightning`` and drives its unmodified ``LightningStoreClient``;
``ours`` runs in the project's interpreter and drives ``lightning_store.client.HttpStore``. Both kinds run this
same loop, so the two clients (and the servers behind them) are timed the same way. The file imports only the
standard library at the top and one client library lazily, which is why mypy skips it (agentlightning is never a
dependency of the project).

Protocol: after its imports the worker prints ``{"ready": true}``. Then each stdin line is a JSON command
``{"op", "server", "url", "clients", "count"}`` (``server`` names one server's run). The worker prepares untimed
(clients connected, attempts to write spans to), runs ``count`` calls (or span batches) split over ``clients``
concurrent tasks, each with its own client object (its own connection pool), and prints one JSON line: ``calls``,
``items``, ``seconds`` (wall time of the timed part), ``latencies`` (seconds per call) and ``errors`` (calls whose
answer was wrong, with the first error). ``{"op": "close", "server"}`` closes that server's clients.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # agentlightning imports litellm, which else stalls

BATCH = 100
PAGE = 100
PROMPT = "You are a careful assistant. Solve the task step by step; call the calculator when needed."
COMPLETION = "The calculator returned 4, so the answer is 4."


def load(kind: str) -> tuple[Callable[[str], Any], Any]:
    """The client class and the Span model of one kind."""
    if kind == "agl":
        from agentlightning import Span
        from agentlightning.store.client_server import LightningStoreClient

        logging.getLogger("agentlightning").setLevel(logging.ERROR)
        return LightningStoreClient, Span
    from lightning_store.client import HttpStore
    from lightning_store.spans import Span

    return HttpStore, Span


def span_json(rollout_id: str, attempt_id: str, sequence_id: int) -> dict[str, Any]:
    """An LLM-call span as an instrumented agent sends it: about 1 KB of JSON with a dozen attributes."""
    trace_id = uuid.uuid5(uuid.NAMESPACE_OID, attempt_id).hex
    span_id = f"{sequence_id:016x}"
    parent_id = f"{max(sequence_id - 1, 1):016x}"
    start = 1_700_000_000.0 + sequence_id
    context = {"trace_id": trace_id, "span_id": span_id, "is_remote": False, "trace_state": {}}
    return {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": parent_id,
        "name": "openai.chat.completion",
        "status": {"status_code": "OK", "description": None},
        "attributes": {
            "gen_ai.system": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "qwen2.5-7b-instruct",
            "gen_ai.request.temperature": 0.7,
            "gen_ai.request.max_tokens": 1024,
            "gen_ai.usage.prompt_tokens": 412 + sequence_id % 50,
            "gen_ai.usage.completion_tokens": 96 + sequence_id % 30,
            "gen_ai.response.finish_reasons": ["stop"],
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": PROMPT,
            "gen_ai.completion.0.content": COMPLETION,
            "agent.name": "calc-agent",
        },
        "events": [],
        "links": [],
        "start_time": start,
        "end_time": start + 0.35,
        "context": context,
        "parent": {**context, "span_id": parent_id},
        "resource": {"attributes": {"service.name": "bench"}, "schema_url": ""},
    }


@dataclass
class ServerState:
    """What this worker has written to one server: attempts it claimed, rollouts that have 100 spans."""

    clients: list[Any] = field(default_factory=list)
    claimed: list[tuple[str, str]] = field(default_factory=list)
    spanned: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    items: int = 0
    errors: int = 0
    first_error: str | None = None

    def wrong(self, message: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or message


class Worker:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.client_class, self.span_class = load(kind)
        self.servers: dict[str, ServerState] = {}

    async def clients(self, server: str, url: str, count: int) -> list[Any]:
        """``count`` connected clients of ``url`` (made once per server, kept across commands)."""
        state = self.servers.setdefault(server, ServerState())
        while len(state.clients) < count:
            client = self.client_class(url)
            await client.get_latest_resources()  # opens the connection, untimed
            state.clients.append(client)
        return state.clients[:count]

    def spans(self, rollout_id: str, attempt_id: str) -> list[Any]:
        return [self.span_class.model_validate(span_json(rollout_id, attempt_id, n + 1)) for n in range(BATCH)]

    # The operations: each takes (client, task index, call index, outcome) and makes one timed call ------------

    async def enqueue(self, client: Any, task: int, i: int, out: Outcome, state: ServerState) -> None:
        rollout = await timed(client.enqueue_rollout({"task": i, "question": "What is 2 + 2?"}, mode="train"), out)
        if rollout.status != "queuing":
            out.wrong(f"enqueue answered status {rollout.status}")
        out.items += 1

    async def dequeue(self, client: Any, task: int, i: int, out: Outcome, state: ServerState) -> None:
        claimed = await timed(client.dequeue_rollout(worker_id=f"bench-{self.kind}-{task}"), out)
        if claimed is None:
            out.wrong("dequeue found the queue empty")
            return
        state.claimed.append((claimed.rollout_id, claimed.attempt.attempt_id))
        out.items += 1

    async def add_spans(self, client: Any, task: int, i: int, out: Outcome, state: ServerState) -> None:
        rollout_id, attempt_id = state.claimed.pop()
        batch = self.spans(rollout_id, attempt_id)  # built before the clock starts for this call
        added = await timed(client.add_many_spans(batch), out)
        if len(added) != BATCH:
            out.wrong(f"add_many_spans stored {len(added)} of {BATCH}")
        state.spanned.append(rollout_id)
        out.items += BATCH

    async def query_spans(self, client: Any, task: int, i: int, out: Outcome, state: ServerState) -> None:
        rollout_id = state.spanned[i % len(state.spanned)]
        page = await timed(client.query_spans(rollout_id), out)
        if len(page) != BATCH:
            out.wrong(f"query_spans returned {len(page)} spans, expected {BATCH}")
        out.items += 1

    async def query_rollouts(self, client: Any, task: int, i: int, out: Outcome, state: ServerState) -> None:
        page = await timed(client.query_rollouts(sort_by="start_time", sort_order="desc", limit=PAGE), out)
        if not 0 < len(page) <= PAGE:
            out.wrong(f"query_rollouts returned {len(page)} rollouts")
        out.items += 1

    async def prepare(self, op: str, state: ServerState, count: int) -> None:
        """Untimed: enough claimed attempts for ``count`` span batches; at least one rollout with spans."""
        client = state.clients[0]
        needed = count if op == "add_spans" else (1 if op == "query_spans" and not state.spanned else 0)
        while len(state.claimed) < needed:
            started = await client.start_rollout({"task": "extra"}, mode="train", worker_id=f"bench-{self.kind}")
            state.claimed.append((started.rollout_id, started.attempt.attempt_id))
        if op == "query_spans" and not state.spanned:
            rollout_id, attempt_id = state.claimed.pop()
            await client.add_many_spans(self.spans(rollout_id, attempt_id))
            state.spanned.append(rollout_id)

    async def run(self, command: dict[str, Any]) -> dict[str, Any]:
        op, count, concurrency = command["op"], command["count"], command["clients"]
        clients = await self.clients(command["server"], command["url"], concurrency)
        state = self.servers[command["server"]]
        await self.prepare(op, state, count)
        call = getattr(self, op)
        out = Outcome()
        shares = [range(t, count, concurrency) for t in range(concurrency)]

        async def task(index: int) -> None:
            for i in shares[index]:
                await call(clients[index], index, i, out, state)

        started = time.perf_counter()
        await asyncio.gather(*(task(t) for t in range(concurrency)))
        seconds = time.perf_counter() - started
        return {
            "calls": len(out.latencies),
            "items": out.items,
            "seconds": seconds,
            "latencies": out.latencies,
            "errors": out.errors,
            "first_error": out.first_error,
        }

    async def forget(self, server: str) -> dict[str, Any]:
        state = self.servers.pop(server, ServerState())
        for client in state.clients:
            await client.close()
        return {"closed": server}

    async def close(self) -> None:
        for server in list(self.servers):
            await self.forget(server)


async def timed(call: Awaitable[Any], out: Outcome) -> Any:
    started = time.perf_counter()
    result = await call
    out.latencies.append(time.perf_counter() - started)
    return result


def reply(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("agl", "ours"):
        print("usage: server_ops_worker.py agl|ours", file=sys.stderr)
        return 2
    loop = asyncio.new_event_loop()  # one loop for the worker's life: the clients' sessions belong to it
    worker = Worker(argv[1])
    reply({"ready": True, "kind": argv[1]})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            if command["op"] == "close":
                reply(loop.run_until_complete(worker.forget(command["server"])))
            else:
                reply(loop.run_until_complete(worker.run(command)))
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
    loop.run_until_complete(worker.close())
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
