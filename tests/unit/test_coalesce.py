"""The coalescer: concurrent calls share a batch, each gets its own answer, an error reaches only its caller, and
a cancelled caller costs the others nothing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from lightning_store.sql import commit_mark
from lightning_store.sql.coalesce import Coalescer


class Doubler:
    """A batch operation that records its batches, takes a while, and refuses the item ``-1``."""

    def __init__(self, delay: float = 0.02) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        await asyncio.sleep(self.delay)
        if -1 in items:
            raise ValueError("-1 refused")
        return [2 * item for item in items]


async def test_a_lone_call_runs_at_once_and_concurrent_ones_share_the_next_batch() -> None:
    run = Doubler()
    coalesced = Coalescer(run)
    assert await coalesced([1, 2]) == [2, 4]
    answers = list(await asyncio.gather(coalesced([1]), coalesced([2, 3]), coalesced([]), coalesced([4])))
    assert answers == [[2], [4, 6], [], [8]]
    # The first began alone; the three that arrived while it ran shared one batch, in the order they came.
    assert run.batches == [[1, 2], [1], [2, 3, 4]]


async def test_an_error_reaches_only_the_call_that_caused_it() -> None:
    run = Doubler()
    coalesced = Coalescer(run)
    answers = list(
        await asyncio.gather(coalesced([1]), coalesced([2]), coalesced([-1, 3]), coalesced([4]), return_exceptions=True)
    )
    assert answers[:2] == [[2], [4]] and answers[3] == [8]
    assert isinstance(answers[2], ValueError)
    # The failed batch ran again call by call.
    assert run.batches == [[1], [2, -1, 3, 4], [2], [-1, 3], [4]]


async def test_a_call_cancelled_before_its_batch_never_runs() -> None:
    run = Doubler()
    coalesced = Coalescer(run)
    first = asyncio.ensure_future(coalesced([1]))
    await asyncio.sleep(0)  # the first batch is running
    waiting = asyncio.ensure_future(coalesced([2]))
    other = asyncio.ensure_future(coalesced([3]))
    await asyncio.sleep(0)
    waiting.cancel()
    assert await first == [2] and await other == [6]
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert run.batches == [[1], [3]]


async def test_a_caller_cancelled_while_its_batch_runs_leaves_the_others_their_answers() -> None:
    run = Doubler()
    coalesced = Coalescer(run)
    first = asyncio.ensure_future(coalesced([1]))
    await asyncio.sleep(0)
    leader = asyncio.ensure_future(coalesced([2]))  # leads the next batch, then is cancelled in the middle of it
    follower = asyncio.ensure_future(coalesced([3]))
    await first
    await asyncio.sleep(0.005)
    assert run.batches == [[1], [2, 3]]
    leader.cancel()
    assert await follower == [6]
    with pytest.raises(asyncio.CancelledError):
        await leader


async def test_a_batch_that_began_to_commit_marks_every_request_it_served() -> None:
    """Each caller is a request with its commit mark: a batch whose commit was under way when it failed may have
    written every caller's items, so each caller's 503 must say so; a batch that never reached its commit marks
    none."""

    async def request(coalesced: Coalescer[int, int], item: int) -> bool:
        mark = commit_mark.track()  # as the server does per request, in the request's own task
        with contextlib.suppress(ValueError):
            await coalesced([item])
        return mark.started

    async def fails_in_commit(items: list[int]) -> list[int]:
        await asyncio.sleep(0.02)
        commit_mark.committing()
        raise ValueError("the database went away during the commit")

    async def fails_before(items: list[int]) -> list[int]:
        await asyncio.sleep(0.02)
        raise ValueError("the database went away before the commit")

    for run, marked in ((fails_in_commit, True), (fails_before, False)):
        coalesced = Coalescer(run)
        started = await asyncio.gather(*(asyncio.ensure_future(request(coalesced, item)) for item in range(4)))
        assert started == [marked] * 4, run.__name__
