"""The load balancer in front of the store servers: a TCP forwarder, as a layer-4 balancer is.

``python -m tests.cluster.balancer LISTEN TARGET [TARGET ...]`` (each ``host:port``). Each new connection goes to
the next target in turn that accepts it within a second; one that refuses or does not answer is skipped (a
server host that was killed). A connection stays with its server until either side closes it; when the server's
side is reset, so is the client's, and the client's next connection goes elsewhere.

Latency: a line ``delay SECONDS`` on standard input holds every chunk that SECONDS in each direction from then on
(``delay 0.1`` is 200 ms added to a round trip), order kept. The kernel here has no ``netem`` qdisc to do it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time


class Balancer:
    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.targets = targets
        self.delay = 0.0
        self._turn = itertools.cycle(range(len(targets)))

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in self.targets:
            host, port = self.targets[next(self._turn)]
            try:
                return await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
            except (OSError, TimeoutError):
                continue
        return None

    async def forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            client_writer.transport.abort()
            return
        upstream_reader, upstream_writer = upstream
        pipes = [
            asyncio.create_task(self._pipe(client_reader, upstream_writer)),
            asyncio.create_task(self._pipe(upstream_reader, client_writer)),
        ]
        done, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        reset = any(task.result() for task in done)
        if reset:  # one side was reset: so is the other, as a balancer that loses its upstream does
            client_writer.transport.abort()
            upstream_writer.transport.abort()
        for task in pending:
            await task  # the other direction ends at its own end of stream, or at the abort above

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Copies until end of stream (then half-closes) and returns False; True if a side was reset."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, chunk = await held.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        releaser = asyncio.create_task(release())
        try:
            while True:
                chunk = await reader.read(65536)
                held.put_nowait((time.monotonic() + self.delay, chunk))
                if not chunk:
                    break
            await releaser
            return False
        except (ConnectionError, OSError):
            releaser.cancel()
            return True


async def _commands(balancer: Balancer) -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            await asyncio.Event().wait()  # standard input closed: keep serving
        words = line.split()
        if len(words) == 2 and words[0] == "delay":
            balancer.delay = float(words[1])
            print(f"delay {balancer.delay}", flush=True)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(listen: str, targets: list[str]) -> None:
    balancer = Balancer([_address(target) for target in targets])
    host, port = _address(listen)
    server = await asyncio.start_server(balancer.forward, host, port, reuse_address=True)
    print(f"balancing {listen} over {', '.join(targets)}", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), _commands(balancer))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
