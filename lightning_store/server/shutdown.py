"""How ``store serve`` stops: long-polls end at once, and what outlives the grace period is answered 503.

uvicorn's graceful shutdown waits for the requests in flight. A blocking dequeue (``timeout``) or a wait holds
its request for up to ``MAX_LONG_POLL_SECONDS``, so a pending long-poll used to keep a stopping server alive for
up to 25 s. Now each runs inside :func:`lightning_store.waits.until` with an event of its own, set

- when the server begins to shut down (SIGINT or SIGTERM, as soon as uvicorn has stopped accepting
  connections; at the latest when the application's lifespan ends): every long-poll then answers at once with
  what it has (a dequeue ``[]``, a wait the rollouts already finished), as at its timeout, with
  ``Connection: close``, and later ones answer at once too;
- when its client disconnects: the long-poll stops waiting instead of polling the database until its timeout
  (a dequeue could otherwise claim a rollout for a client that is gone).

A claim under way is never interrupted (:mod:`lightning_store.waits`), so ending a long-poll loses no rollout.

Other requests get ``SHUTDOWN_GRACE_SECONDS`` (``server/run.py``), after which uvicorn cancels them; one whose
answer had not begun is then answered 503 (:class:`CutOff`), which clients retry, rather than uvicorn's 500; it
says ``maybe_written`` when the request's write had sent its commit (:mod:`lightning_store.sql.commit_mark`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, TypeVar

from fastapi import Request, Response

from lightning_store import waits
from lightning_store.server.guards import ASGIApp, Receive, Scope, Send
from lightning_store.sql import commit_mark

T = TypeVar("T")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
LISTENER_WAIT_SECONDS = 0.5


class LongPolls:
    """The long-polls of one application; :meth:`end_all` ends them."""

    def __init__(self) -> None:
        self._pending: set[asyncio.Event] = set()
        self.ending = False
        """Set once the server shuts down: long-polls in progress ended, new ones answer at once."""

    def end_all(self) -> None:
        self.ending = True
        for event in self._pending:
            event.set()

    async def run(self, request: Request, response: Response, call: Callable[[], Awaitable[T]]) -> T:
        """``await call()`` (a blocking dequeue or a wait of the store) as a long-poll of ``request``."""
        ended = asyncio.Event()
        if self.ending:
            ended.set()
        self._pending.add(ended)
        watcher = asyncio.ensure_future(_disconnected(request, ended))
        try:
            with waits.until(ended):
                result = await call()
        finally:
            self._pending.discard(ended)
            watcher.cancel()
        if self.ending:
            # The client's next request opens a new connection and finds the server gone (or answering at
            # once), rather than a kept-alive connection closing under it.
            response.headers["connection"] = "close"
        return result

    async def end_all_once_closed(self, listeners: list[Any]) -> None:
        """:meth:`end_all` once ``listeners`` (uvicorn's ``asyncio.Server`` objects) stop accepting connections,
        at most ``LISTENER_WAIT_SECONDS`` from now: a client that asks again at once is then refused (and
        retries any request), rather than reset on a connection accepted just before the listener closed (and
        unable to tell whether its request was taken)."""
        deadline = time.monotonic() + LISTENER_WAIT_SECONDS
        # Polled: asyncio.Server.wait_closed also waits for the connections, the long-polls' among them.
        while any(listener.is_serving() for listener in listeners) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        self.end_all()

    def on_signals(self) -> Callable[[], None]:
        """End every long-poll when SIGINT or SIGTERM arrives (once uvicorn has closed its listening sockets,
        which it does within 0.1 s), and pass the signal on to the handler installed before (uvicorn's, which
        starts its graceful shutdown). Returns the function that puts that handler back. Does nothing off the
        main thread (signal handlers live there) or where the handler installed is not a Python function."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        chained: dict[int, Any] = {}
        ending: set[asyncio.Task[None]] = set()

        def end(listeners: list[Any]) -> None:
            task = loop.create_task(self.end_all_once_closed(listeners))
            ending.add(task)
            task.add_done_callback(ending.discard)

        def handle(signum: int, frame: FrameType | None) -> None:
            previous = chained[signum]
            # uvicorn's handler is a method of its Server, whose ``servers`` are the listening sockets.
            listeners = list(getattr(getattr(previous, "__self__", None), "servers", None) or [])
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is left to end
                loop.call_soon_threadsafe(end, listeners)
            previous(signum, frame)

        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if callable(previous):
                chained[signum] = previous
                signal.signal(signum, handle)

        def restore() -> None:
            for signum, previous in chained.items():
                if signal.getsignal(signum) is handle:
                    signal.signal(signum, previous)

        return restore


async def _disconnected(request: Request, ended: asyncio.Event) -> None:
    """Set ``ended`` once the client of ``request`` (whose body has been read) has disconnected."""
    with contextlib.suppress(Exception):
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                ended.set()
                return
            if not message.get("more_body", False):
                return  # not a server that blocks here until the client goes: nothing to watch


class CutOff:
    """ASGI middleware: a request cancelled while the server shuts down (it outlived the grace period) is
    answered 503 ``server shutting down, retry`` when its answer had not begun. Costs a ``try`` per request. Each
    request gets its commit mark here, the outermost place that sees it whole."""

    def __init__(self, app: ASGIApp, polls: LongPolls) -> None:
        self.app = app
        self.polls = polls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        mark = commit_mark.track()
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if scope["type"] != "http" or not self.polls.ending or not await _unavailable(send, mark.started):
                raise


async def _unavailable(send: Send, maybe_written: bool) -> bool:
    """Answer 503; False when that cannot be done (the answer had begun, or the connection is gone)."""
    body = json.dumps(
        {
            "detail": "server shutting down, retry",
            "field": None,
            "error_type": "Unavailable",
            "maybe_written": maybe_written,
        }
    )
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"), (b"connection", b"close")]
    try:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body.encode()})
    except Exception:
        return False
    return True
