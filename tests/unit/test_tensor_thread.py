"""The tensor thread: one thread runs a process's tensor work, reached from any thread or event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from algorithms import tensor_thread


def _thread_name() -> str:
    return threading.current_thread().name


def test_call_runs_on_the_one_tensor_thread_and_returns_its_result() -> None:
    names = {tensor_thread.call(_thread_name) for _ in range(5)}
    names |= {tensor_thread.call(_thread_name) for _ in range(5)}
    assert len(names) == 1
    assert names.pop().startswith(tensor_thread.THREAD_NAME)
    assert not tensor_thread.on_tensor_thread()
    assert tensor_thread.call(tensor_thread.on_tensor_thread)
    assert tensor_thread.call(divmod, 17, 5) == (3, 2)


def test_call_from_the_tensor_thread_runs_inline() -> None:
    """A function on the tensor thread that itself calls ``call`` (a weight swap inside a step) must not wait
    for the thread it is running on."""

    def outer() -> str:
        return tensor_thread.call(_thread_name)

    assert tensor_thread.call(outer).startswith(tensor_thread.THREAD_NAME)


def test_errors_reach_the_caller() -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        tensor_thread.call(fail)
    assert tensor_thread.call(_thread_name).startswith(tensor_thread.THREAD_NAME)  # the thread survives


async def test_run_keeps_the_event_loop_serving_and_keeps_order() -> None:
    release = threading.Event()
    order: list[int] = []

    def blocked(i: int) -> int:
        release.wait(10)
        order.append(i)
        return i

    first = asyncio.ensure_future(tensor_thread.run(blocked, 1))
    second = asyncio.ensure_future(tensor_thread.run(blocked, 2))
    await asyncio.sleep(0.05)  # the loop runs while the tensor thread is busy
    assert not first.done() and not second.done()
    release.set()
    assert (await first, await second) == (1, 2)
    assert order == [1, 2]


def test_intra_op_threads_sets_the_count_for_the_block_and_restores_it() -> None:
    def inside(count: int | None) -> tuple[int, int, int]:
        before = torch.get_num_threads()
        with tensor_thread.intra_op_threads(count):
            during = torch.get_num_threads()
        return before, during, torch.get_num_threads()

    before, during, after = tensor_thread.call(inside, 1)
    assert (during, after) == (1, before)
    before, during, after = tensor_thread.call(inside, None)
    assert before == during == after
