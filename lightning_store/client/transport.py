"""``HttpStore``'s requests: JSON over aiohttp's connection pool, failures reported as httpx's errors.

``HttpStore`` sends every request through :class:`JsonTransport`, straight to an ``aiohttp.ClientSession``.
httpx's client on top of it (``httpx_aiohttp``'s transport, until ADR 0023) cost a runner worker about two
thirds of its CPU per request: URL parsing and merging, header models, cookie extraction and a response stream,
none of which a JSON call to our own server needs.

httpx's exception classes stay the contract (``httpx.TransportError`` is what callers catch as "the store is
not there", a 5xx is ``httpx.HTTPStatusError``), and they say what happened to the request, which the client's
retry rules need: a connection that could not be opened (``ConnectError``: nothing was sent, any request may
go again) apart from an answer that was lost (``RemoteProtocolError``, ``ReadError``, ``WriteError``: only an
idempotent request may).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import httpx
from yarl import URL

logger = logging.getLogger(__name__)

JSON_HEADERS = {"content-type": "application/json"}
KEEP_ALIVE_SECONDS = 5.0
"""How long an idle connection is kept; well under ``store serve``'s 75 s, so the client always closes first."""
MAX_CONNECTIONS = 100

_BY_CAUSE: tuple[tuple[type[BaseException], type[httpx.TransportError]], ...] = (
    # The most specific first: several of these subclass one another.
    (aiohttp.ClientConnectorError, httpx.ConnectError),  # refused, unresolvable: nothing was sent
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.TimeoutException),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),  # closed before or while answering
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),  # an answer that is not HTTP
    (aiohttp.ClientConnectionResetError, httpx.WriteError),  # the connection closed while the request was sent
    (aiohttp.ClientOSError, httpx.ReadError),  # reset while sending or reading
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientError, httpx.TransportError),
)


def as_httpx_error(error: aiohttp.ClientError, method: str, url: str) -> httpx.TransportError:
    """The httpx error that says what happened to the request ``method url`` that failed with ``error``."""
    for cause, httpx_error in _BY_CAUSE:
        if isinstance(error, cause):
            return httpx_error(str(error) or type(error).__name__, request=httpx.Request(method, url))
    raise AssertionError("every aiohttp.ClientError is mapped")


def encode_json(value: Any) -> bytes:
    """``value`` as httpx encoded a ``json=`` body: compact, UTF-8, and a NaN or infinity refused (ValueError)
    before anything is sent, since the server would refuse it anyway."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class JsonTransport:
    """Requests to one server (``base_url``), each answered as its status and body.

    ``read_timeout``: the longest wait for any part of an answer (a long-poll's included); ``connect_timeout``:
    for opening a connection. The aiohttp session is made on the first request, in the running event loop, and
    closed by :meth:`close`.
    """

    def __init__(self, base_url: str, *, headers: dict[str, str], read_timeout: float, connect_timeout: float) -> None:
        self._base = base_url.rstrip("/")
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=read_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEP_ALIVE_SECONDS),
                headers=self._headers,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),  # our server sets none; a jar is work on every answer
            )
        return self._session

    async def send(
        self, method: str, path: str, *, body: bytes | None = None, params: dict[str, Any] | None = None
    ) -> tuple[int, bytes]:
        """Send ``body`` (JSON already encoded, or none) to ``path`` (already quoted: ids are quoted by the
        caller); the answer's status and body. Failures to connect or to get an answer raise httpx's errors
        (:func:`as_httpx_error`); any status is returned, 5xx included."""
        url = URL(self._base + path, encoded=True)
        headers = None if body is None else JSON_HEADERS
        try:
            async with self._open().request(
                method, url, data=body, params=params, headers=headers, allow_redirects=False
            ) as response:
                answer = await response.read()
        except aiohttp.ClientError as error:
            raise as_httpx_error(error, method, str(url)) from error
        if logger.isEnabledFor(logging.DEBUG):  # as httpx logged each request (store run --log-level debug)
            logger.debug('HTTP Request: %s %s "%d"', method, url, response.status)
        return response.status, answer

    def status_error(self, method: str, path: str, status: int, body: bytes) -> httpx.HTTPStatusError:
        """httpx's error for a 5xx answer, as ``raise_for_status`` made it."""
        request = httpx.Request(method, self._base + path)
        response = httpx.Response(status, content=body, request=request)
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as error:
            return error
        raise AssertionError(f"{status} is not an error status")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
