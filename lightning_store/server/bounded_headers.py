"""uvicorn's httptools protocol with a request's line and headers bounded in size.

httptools keeps a header's value in memory until the header ends and has no limit of its own (h11 has one, at
a higher CPU cost per request), so a single header line of 100 MiB was read whole, before authentication, and
answered: five such requests took a server from 125 to 629 MiB. :class:`BoundedHeadersProtocol` refuses, with
``431 Request Header Fields Too Large`` and the connection closed, a request whose line and headers pass
:attr:`BoundedHeadersProtocol.max_head_bytes`: counted as the parser hands them over (exact, for a head that
ends), and as raw bytes while a head has not ended (so that a header line that never ends is cut off after the
limit plus one read, 256 KiB, rather than read whole). A body is never counted. After the refusal the
connection's remaining bytes are ignored; nothing of the request reaches the application.

``store serve`` passes the class to uvicorn (``http=``); the limit is the setting ``max_header_bytes``
(``LIGHTNING_STORE_MAX_HEADER_BYTES``), set on the class before any connection is accepted (each worker process
sets it at start-up: uvicorn's configuration crosses to its workers pickled, so it carries a class, not a value).
"""

from __future__ import annotations

from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
"""Bytes of a request's line and headers: the same order as nginx (8 KiB per header line, 32 KiB in all by
default) and h11 (16 KiB), with room for a long bearer token and trace headers."""

_TOO_LARGE = b"the request's line and headers are too large"


class BoundedHeadersProtocol(HttpToolsProtocol):
    """See the module docstring."""

    max_head_bytes: ClassVar[int] = DEFAULT_MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head, self._parsed, self._raw, self._refused = True, 0, 0, False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._parsed, self._raw = True, 0, 0

    def on_url(self, url: bytes) -> None:
        if self._count(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._count(len(name) + len(value) + 4):  # ": " and CRLF
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._in_head and not self._refused:  # a head still not ended: bound what it holds
            self._raw += len(data)
            if self._raw > self.max_head_bytes:
                self._refuse()

    def _count(self, size: int) -> bool:
        """Add ``size`` bytes of parsed head; False (and the request refused) past the limit."""
        self._parsed += size
        if self._parsed > self.max_head_bytes:
            self._refuse()
        return not self._refused

    def _refuse(self) -> None:
        if self._refused:
            return
        self._refused = True
        self.logger.warning("refused a request whose line and headers passed %d bytes", self.max_head_bytes)
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(_TOO_LARGE)).encode() + b"\r\nconnection: close\r\n\r\n" + _TOO_LARGE
        )
        self.transport.close()
