"""The one thread that runs a process's tensor work: loading models, decoding, measuring, updating, copying
weights, saving checkpoints.

Why one thread: torch's CPU build runs its intra-op parallelism on GNU OpenMP, which keeps a pool of worker
threads for every thread that has ever started a parallel region, for as long as that thread lives. Once the
pools together hold more threads than the machine has cores, libgomp stops letting idle workers spin between
parallel regions and puts them to sleep instead, so each of the thousands of small regions of a step on a
small model pays a futex wake-up. Measured on 2 cores with the tiny flight model (docs/benchmarks.md, eighth
round): a GRPO update took 0.15 s on the only thread that had used torch and 0.40-0.60 s on a second one, and
TRL's whole step 0.4 s against 1.9 s. A process of ours that trains or serves the policy therefore sends every
tensor operation here, and nothing else in it uses torch: the main thread (running the event loop) and the
event loops' executors stay out of OpenMP.

Code that calls :func:`call` from the tensor thread itself runs inline (no deadlock); everything else queues
behind whatever the thread is doing, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

THREAD_NAME = "lightning-store-tensors"
_local = threading.local()


def _mark() -> None:
    _local.is_tensor_thread = True


_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME, initializer=_mark)


def on_tensor_thread() -> bool:
    """Whether the calling thread is the tensor thread."""
    return bool(getattr(_local, "is_tensor_thread", False))


def call(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the tensor thread, waiting for it (inline when already there)."""
    if on_tensor_thread():
        return fn(*args, **kwargs)
    return _executor.submit(fn, *args, **kwargs).result()


async def run(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the tensor thread, awaited from an event loop (which keeps serving)."""
    if on_tensor_thread():  # an event loop on the tensor thread itself: nothing else could run it
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(fn, *args, **kwargs))


@contextlib.contextmanager
def intra_op_threads(count: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` for the block (None: left as it is), then restored.

    Call it on the tensor thread: the count is process-wide, and only that thread's work should see it."""
    import torch

    previous = torch.get_num_threads()
    if count is None or count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
