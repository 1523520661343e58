"""The raw Postgres ceiling of batched span ingest, side by side with the store's own single-writer ingest.

The ceiling is what Postgres itself allows on this machine for the store's span insert: asyncpg alone (no
SQLAlchemy, no store logic: no attempt lock, no heartbeat update, no coalescing), one connection, one transaction
per batch of 100 spans holding only the store's own ``INSERT … SELECT FROM jsonb_array_elements`` statement
(taken from the store, so the same columns, casts, conflict rule and indexes of the migrated schema). The store's
figure is ``add_many_spans`` of the same spans, one writer, on another database of the same server, run in the
same process right after, so both see the same machine. The ratio is the store's share of the ceiling.

Run from the repository root::

    python -m bench.postgres_ceiling                       # 20,000 spans each way, 3 rounds
    python -m bench.postgres_ceiling --spans 50000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence

import asyncpg
from sqlalchemy.engine import make_url

from bench.harness import add_postgres_url, async_postgres_database, postgres_reachable
from bench.server_ops_worker import span_json
from lightning_store.spans import Span
from lightning_store.sql import SqlStore, open_store
from lightning_store.sql.spans import spans_json

BATCH = 100


def batches(rollout_id: str, attempt_id: str, count: int) -> list[list[Span]]:
    """``count`` spans of one attempt (about 1 KB each, as ``store_ops`` writes), in batches of :data:`BATCH`."""
    spans = [Span.model_validate(span_json(rollout_id, attempt_id, i)) for i in range(1, count + 1)]
    return [spans[i : i + BATCH] for i in range(0, len(spans), BATCH)]


async def raw_ingest(store: SqlStore, url: str, count: int) -> float:
    """Spans/s of the store's insert statement through asyncpg alone."""
    target = await store.start_rollout({"bench": "ceiling"})
    documents = [
        spans_json(batch, "postgresql") for batch in batches(target.rollout_id, target.attempt.attempt_id, count)
    ]
    statement = str(store._insert_spans).replace(":doc", "$1")  # the statement the store runs, as asyncpg takes it
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        started = time.perf_counter()
        for document in documents:
            async with conn.transaction():
                await conn.fetch(statement, document)
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    return count / elapsed


async def store_ingest(store: SqlStore, count: int) -> float:
    """Spans/s of ``add_many_spans``, one writer."""
    target = await store.start_rollout({"bench": "store"})
    prepared = batches(target.rollout_id, target.attempt.attempt_id, count)
    started = time.perf_counter()
    for batch in prepared:
        await store.add_many_spans(batch)
    return count / (time.perf_counter() - started)


async def one_round(admin_url: str, count: int) -> tuple[float, float]:
    results = []
    for measure in ("raw", "store"):
        async with async_postgres_database(admin_url) as url:
            store = await open_store(url, migrate=True, watchdog_interval=0)
            try:
                results.append(
                    await (raw_ingest(store, url, count) if measure == "raw" else store_ingest(store, count))
                )
            finally:
                await store.close()
    return results[0], results[1]


async def run(args: argparse.Namespace) -> None:
    if not await postgres_reachable(args.postgres_url):
        return
    raws, ours = [], []
    print(f"{args.spans} spans each way, batches of {BATCH}, one writer, {args.rounds} rounds")
    print("round | raw ceiling spans/s | store spans/s | store ÷ ceiling")
    for i in range(1, args.rounds + 1):
        raw, store = await one_round(args.postgres_url, args.spans)
        raws.append(raw)
        ours.append(store)
        print(f"{i} | {raw:,.0f} | {store:,.0f} | {store / raw:.2f}")
    print(
        f"median | {statistics.median(raws):,.0f} | {statistics.median(ours):,.0f} | "
        f"{statistics.median(o / r for o, r in zip(ours, raws, strict=True)):.2f}"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20_000, help="spans written each way in a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each measuring both")
    add_postgres_url(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
