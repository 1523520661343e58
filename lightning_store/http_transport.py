"""httpx's client API over aiohttp's connection pool, with failures reported as the httpx errors they are.

``HttpStore`` keeps httpx's API and errors (``httpx.TransportError`` is what callers catch) but sends through
``httpx_aiohttp``'s transport: httpx's own pool checks every idle connection on each request, which cost a
worker running 32 attempts 1.2 ms of CPU per request against 0.23 ms (docs/benchmarks.md, seventh round).

That transport reports most aiohttp connection failures as ``httpx.ConnectTimeout``, a refused connection and a
connection the server closed mid-answer alike. The client must tell those apart: a request whose connection
was never opened can always be sent again, one whose answer was lost only when it is idempotent. So
:class:`StoreTransport` re-raises them by their cause.
"""

from __future__ import annotations

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

_BY_CAUSE: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, unresolvable: nothing was sent
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),  # closed before or while answering
    (aiohttp.ClientOSError, httpx.ReadError),  # reset while sending or reading
    (aiohttp.ClientPayloadError, httpx.ReadError),
)


def precise(error: httpx.TransportError, request: httpx.Request) -> httpx.TransportError:
    """The httpx error that says what happened to ``request`` (``error`` itself when its cause is not an
    aiohttp failure named above)."""
    cause = error.__cause__
    for aiohttp_error, httpx_error in _BY_CAUSE:
        if isinstance(cause, aiohttp_error):
            return error if type(error) is httpx_error else httpx_error(str(error), request=request)
    return error


class StoreTransport(AiohttpTransport):
    """``httpx_aiohttp.AiohttpTransport`` whose errors are :func:`precise`."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().handle_async_request(request)
        except httpx.TransportError as error:
            better = precise(error, request)
            if better is error:
                raise
            raise better from error.__cause__
