"""A network between a client and a TCP server that tests can cut, stall, or cut in a commit."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.engine import make_url

from tests.postgres import admin_url


class Network:
    """A TCP forwarder from a local port to ``target``: ``down()`` cuts every connection and refuses new ones (the
    port stops listening), ``up()`` listens again on the same port. ``stall()`` keeps every connection open but
    holds what is sent either way (new connections too) until ``resume()`` delivers it: a network that stops
    answering without saying so. ``cut_in_commit(after)`` cuts one connection in a transaction's commit."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut_after: bytes | None = None
        self.cuts = 0
        """How many connections ``cut_in_commit`` has cut."""

    def cut_in_commit(self, after: bytes) -> None:
        """Arm one cut: on the first connection that sends ``after`` (a statement's text) and then a ``COMMIT``, the
        commit reaches the database, its answer is held back, and the connection is reset half a second later,
        as when a database host goes away while the commit's answer is on its way: the write is done, and the
        store cannot know it."""
        self._cut_after = after

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    async def up(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no new connections: a connect is refused
        for writer in list(self._links):
            writer.transport.abort()  # a reset, as when the host goes away
        self._links.clear()
        if server is not None:
            await server.wait_closed()

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._links.update((client_writer, upstream_writer))
        in_commit = False  # this link's commit was sent: the database's answers go nowhere until it is cut
        after_seen = False

        async def cut() -> None:
            await asyncio.sleep(0.5)
            client_writer.transport.abort()
            upstream_writer.transport.abort()

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, to_database: bool) -> None:
            nonlocal in_commit, after_seen
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    await self._flowing.wait()
                    if to_database and self._cut_after is not None and not in_commit:
                        after_seen = after_seen or self._cut_after in data
                        if after_seen and b"COMMIT" in data:
                            self._cut_after, in_commit = None, True
                            self.cuts += 1
                            writer.write(data)
                            await cut()
                            return
                    if in_commit:
                        continue
                    writer.write(data)
                    await writer.drain()
            writer.close()

        await asyncio.gather(
            pipe(client_reader, upstream_writer, to_database=True),
            pipe(upstream_reader, client_writer, to_database=False),
        )
        self._links.difference_update((client_writer, upstream_writer))


async def network_to(database_url: str) -> tuple[Network, str]:
    """A :class:`Network` (up) to the test's Postgres server, and ``database_url`` rewritten to go through it."""
    target = admin_url()
    network = Network(target.host or "127.0.0.1", target.port or 5432)
    await network.up()
    return network, make_url(database_url).set(port=network.port).render_as_string(hide_password=False)
