"""A client that writes through the faults and logs each write the store acknowledged.

``python -m tests.cluster.writer STORE_URL ACKS_FILE``: until SIGTERM, starts a rollout (``start_rollout``: a
rollout with a running attempt, not queued, so that no runner takes it), adds three spans to it and ends its
attempt, then the next. A line of JSON goes to ``ACKS_FILE`` for each acknowledged write, flushed before the next
is sent: ``{"rollout_id": ...}`` when a start was answered, ``{"rollout_id": ..., "span_id": ...}`` when a span
was. A write that raised (the store unreachable past the client's retries, or a 503 that says the write may have
happened) is not logged: the audit asks only that what was acknowledged be there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from typing import IO

from lightning_store.client import HttpStore
from lightning_store.spans import Span


async def write_one(store: HttpStore, acks: IO[str]) -> None:
    started = await store.start_rollout({"cluster": "writer"}, metadata={"writer": True})
    acks.write(json.dumps({"rollout_id": started.rollout_id}) + "\n")
    acks.flush()
    attempt_id = started.attempt.attempt_id
    for sequence in range(1, 4):
        span_id = uuid.uuid4().hex[:16]
        now = time.time()
        await store.add_span(
            Span(
                rollout_id=started.rollout_id,
                attempt_id=attempt_id,
                sequence_id=sequence,
                trace_id=uuid.uuid4().hex,
                span_id=span_id,
                name="writer.step",
                start_time=now,
                end_time=now,
                attributes={"sequence": sequence},
            )
        )
        acks.write(json.dumps({"rollout_id": started.rollout_id, "span_id": span_id}) + "\n")
        acks.flush()
    await store.update_attempt(started.rollout_id, attempt_id, status="succeeded")


async def main(url: str, acks: IO[str]) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    store = HttpStore(url, token=os.environ.get("LIGHTNING_STORE_TOKEN"), timeout=10)
    failures = 0
    while not stop.is_set():
        try:
            await write_one(store, acks)
        except Exception as error:  # any failure is a write not acknowledged
            failures += 1
            print(f"write failed: {type(error).__name__}: {error}", flush=True)
            await asyncio.sleep(0.5)
        await asyncio.sleep(0.05)
    await store.close()
    print(f"writer stopped; {failures} writes failed", flush=True)


if __name__ == "__main__":
    with open(sys.argv[2], "a", encoding="utf-8") as acks_file:
        asyncio.run(main(sys.argv[1], acks_file))
