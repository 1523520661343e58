"""Concurrent calls of one batch operation, run as one call of it (one transaction for many requests).

Why: a write transaction costs the server more CPU than the rows it writes, and on SQLite every write waits for
the one before it anyway. With eight clients enqueueing a rollout each, eight transactions ran one after the other;
coalesced, the calls that arrive while one runs share the next.

There is no batching window: a call with nothing running starts at once, alone. Calls that arrive while a batch
runs queue, and the first of them, once the batch is done, runs every queued call as the next batch (or finds its
own call already answered). So batches grow only as far as the operation is the bottleneck, and a lone caller
waits for nothing.

A batch that fails is run again call by call, so an error reaches the call that caused it and no other. A batch
runs in a task of its own: a caller cancelled while its batch runs leaves the others their answers (and its own
items are written, as they would be by a transaction that had begun); a caller cancelled before its batch begins
is taken out of the queue. A batch whose commit was under way marks every caller's request
(:mod:`~lightning_store.sql.commit_mark`): if the database went away then, each of them may have been written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from lightning_store.sql import commit_mark
from lightning_store.sql.commit_mark import CommitMark

T = TypeVar("T")
R = TypeVar("R")
_Call = tuple[list[T], asyncio.Future[list[R]], CommitMark | None]
"""A caller's items, the future of its answer, and its request's commit mark."""


class Coalescer(Generic[T, R]):
    """``await coalescer(items)`` returns what ``run(items)`` would, one result per item, in order; concurrent
    calls are concatenated into one ``run`` (see the module docstring). ``run`` must treat its items
    independently: the result of an item must not depend on the other items of its batch."""

    def __init__(self, run: Callable[[list[T]], Awaitable[Sequence[R]]]) -> None:
        self._run = run
        self._queued: list[_Call[T, R]] = []
        self._lock = asyncio.Lock()

    async def __call__(self, items: Sequence[T]) -> list[R]:
        answer: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        call = (list(items), answer, commit_mark.current())
        self._queued.append(call)
        try:
            async with self._lock:
                if not answer.done():  # not answered by the batch before: run every queued call, this one included
                    calls, self._queued = self._queued, []
                    await asyncio.shield(asyncio.ensure_future(self._answer(calls)))
        except asyncio.CancelledError:
            self._queued = [queued for queued in self._queued if queued is not call]  # not begun: never runs
            answer.cancel()  # a batch that is running it still commits it, and drops the answer
            raise
        return answer.result()

    async def _answer(self, calls: list[_Call[T, R]]) -> None:
        batch = commit_mark.track()  # this task's own (ensure_future gave it a copy of one caller's context)
        try:
            await self._answer_calls(calls)
        finally:
            if batch.started:
                for *_, mark in calls:
                    if mark is not None:
                        mark.started = True

    async def _answer_calls(self, calls: list[_Call[T, R]]) -> None:
        if len(calls) == 1:
            await self._answer_alone(*calls[0][:2])
            return
        try:
            results = await self._run([item for items, _, _ in calls for item in items])
        except Exception:
            for items, answer, _ in calls:
                await self._answer_alone(items, answer)
            return
        start = 0
        for items, answer, _ in calls:
            _settle(answer, result=list(results[start : start + len(items)]))
            start += len(items)

    async def _answer_alone(self, items: list[T], answer: asyncio.Future[list[R]]) -> None:
        try:
            result = list(await self._run(items))
        except Exception as exc:
            _settle(answer, error=exc)
        else:
            _settle(answer, result=result)


def _settle(answer: asyncio.Future[list[R]], *, result: list[R] | None = None, error: Exception | None = None) -> None:
    if answer.done():  # its caller was cancelled while waiting for its turn
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result or [])
