"""The batched deleter of ``store prune`` (:mod:`lightning_store.sql.prune_rules` holds the rules and the summary):
pages of selected rollouts, batches of whole rollouts, one short transaction per batch that checks the selection again.
Kept apart from the rules so that the ``store`` command loads the SQL store only when it prunes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from lightning_store.sql import retention
from lightning_store.sql.engine import WRITE_OPTION, unavailable_as_error
from lightning_store.sql.prune_rules import DEFAULT_BATCH_ROWS, DEFAULT_PAUSE, Rules, Summary
from lightning_store.sql.retention import Candidate, Selection, runs_in_progress

RETRIES = 10
"""Times a batch is tried again when a training run started or ended while it was deleting (Postgres)."""


class RunsChanged(Exception):
    """A training run started or ended while a batch was deleting: the batch is rolled back and tried again."""


class Pruner:
    """Plans and runs a prune over ``engine`` (which the caller owns). ``now`` fixes the cutoff for the run."""

    def __init__(self, engine: AsyncEngine, rules: Rules, *, now: float | None = None) -> None:
        self.engine = engine
        self.rules = rules
        self.selection = Selection.of(rules, time.time() if now is None else now)
        self.postgres = engine.dialect.name == "postgresql"

    async def plan(self, chunk: int = DEFAULT_BATCH_ROWS) -> Summary:
        """What :meth:`prune` would delete now, counted with the same statements; writes nothing."""
        summary = Summary(self.rules, dry_run=True)
        started = time.monotonic()
        async with self._read() as conn:
            summary.runs = await runs_in_progress(conn)
            summary.protected = await retention.count_protected(conn, self.selection, summary.runs)
        async for batch in self.candidates(chunk):
            for c in batch:
                summary.add(c.mode, c.attempts, c.spans, c.llm_calls, c.end_time)
        summary.seconds = time.monotonic() - started
        return summary

    async def prune(
        self,
        *,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        pause: float = DEFAULT_PAUSE,
        summary: Summary | None = None,
        on_batch: Callable[[int], None] = lambda rows: None,
    ) -> Summary:
        """Delete in batches of whole rollouts holding at most ``batch_rows`` rows (a rollout with more is a batch
        of its own), one transaction each, sleeping ``pause`` seconds between them. ``summary`` (a fresh one by
        default) is filled as batches commit, so a caller that is interrupted still knows what went;
        ``on_batch`` is told each batch's rows."""
        if batch_rows < 1 or pause < 0:
            raise ValueError("batch_rows must be at least 1 and pause not negative")
        summary = summary or Summary(self.rules, dry_run=False)
        started = time.monotonic()
        async with self._read() as conn:
            summary.runs = await runs_in_progress(conn)
        pending: deque[Candidate] = deque()
        waiting = 0  # rows in pending

        async def flush(full_only: bool) -> None:
            nonlocal waiting
            while pending and (waiting >= batch_rows or not full_only):
                batch = [pending.popleft()]
                while pending and sum(c.rows for c in batch) + pending[0].rows <= batch_rows:
                    batch.append(pending.popleft())
                waiting -= sum(c.rows for c in batch)
                rows = await self.delete(batch, summary)
                summary.batches += 1
                summary.seconds = time.monotonic() - started
                on_batch(rows)
                if pause:
                    await asyncio.sleep(pause)

        async for page in self.candidates(batch_rows):
            pending.extend(page)
            waiting += sum(c.rows for c in page)
            await flush(full_only=True)
        await flush(full_only=False)
        summary.seconds = time.monotonic() - started
        return summary

    async def candidates(self, limit: int) -> AsyncIterator[list[Candidate]]:
        """The selected rollouts with something to delete, a page at a time (the protection read anew for each)."""
        after = 0
        while True:
            async with self._read() as conn:
                page = await retention.candidates(conn, self.selection, await runs_in_progress(conn), after, limit)
            if not page:
                return
            after = page[-1].pk
            batch = [c for c in page if c.rows > 0]
            if batch:
                yield batch

    async def delete(self, batch: list[Candidate], summary: Summary) -> int:
        """One transaction: the batch's rollouts checked again, then deleted; the summary gets what went."""
        by_id = {c.rollout_id: c for c in batch}
        for _ in range(RETRIES):
            try:
                async with self._write() as conn:
                    runs = await runs_in_progress(conn)
                    deleted = await retention.delete_batch(conn, self.selection, runs, list(by_id))
                    # Postgres: a run that committed while this batch deleted is visible only to a later
                    # statement; if one did, this batch may hold what it protects, so undo it and select again.
                    if self.postgres and await runs_in_progress(conn) != runs:
                        raise RunsChanged
            except RunsChanged:
                continue
            rows = 0
            for rid in deleted.rollout_ids:
                c = by_id[rid]
                a, s, n = deleted.attempts[rid], deleted.spans[rid], deleted.llm_calls[rid]
                if c.whole or s:
                    summary.add(c.mode, a, s, n, c.end_time)
                rows += s + ((1 + a + n) if c.whole else 0)
            return rows
        raise RuntimeError(f"training runs kept starting or ending: a batch was tried {RETRIES} times")

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        with unavailable_as_error():
            async with self.engine.connect() as conn, conn.begin():
                yield conn

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: ``BEGIN IMMEDIATE`` on SQLite (the store's writers wait for it, as for each other)."""
        with unavailable_as_error():
            async with self.engine.connect() as conn:
                await conn.execution_options(**{WRITE_OPTION: True})
                async with conn.begin():
                    yield conn
