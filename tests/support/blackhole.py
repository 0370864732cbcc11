"""A TCP relay in front of a server that can turn into a black hole, for tests of a server that
hangs rather than fails.

While :meth:`Relay.held` holds, the relay stops moving bytes either way and answers nothing, yet
keeps every socket open, and it accepts new connections without passing them on: the TCP
handshake succeeds (the kernel does it) and then nothing comes back, neither data nor a reset.
That is what a client sees of a server stopped with SIGSTOP, or behind a network that drops its
packets while the client's own kernel still gets ACKs: keepalives are answered, so no TCP
setting notices, and only a client-side deadline ends the wait. Afterwards the bytes held back
flow on, and the waiting connections are passed on, as after SIGCONT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from konduit.loop_thread import LoopThread


class Relay:
    """Relays ``127.0.0.1:port`` to ``127.0.0.1:target`` on a thread of its own."""

    def __init__(self, target: int):
        self.target = target
        self._thread = LoopThread("blackhole-relay")
        self._flowing = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = self._thread.run(self._start())

    async def _start(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, template: str) -> str:
        """``template`` (a URL to the target) pointed at the relay."""
        return template.replace(f":{self.target}/", f":{self.port}/")

    async def _serve(self, client_in: asyncio.StreamReader,
                     client_out: asyncio.StreamWriter) -> None:
        self._writers.add(client_out)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._flowing.wait()  # a connection made in the black hole waits here
            server_in, server_out = await asyncio.open_connection("127.0.0.1", self.target)
            self._writers.add(server_out)
            pumps = [asyncio.ensure_future(self._pump(client_in, server_out)),
                     asyncio.ensure_future(self._pump(server_in, client_out))]
            self._tasks.update(pumps)
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
            server_out.close()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            client_out.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with suppress(OSError):
            while True:
                await self._flowing.wait()
                data = await source.read(65536)
                if not data:
                    return
                await self._flowing.wait()  # read before the hold: kept back until it ends
                sink.write(data)
                await sink.drain()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Nothing passes, nothing is refused, nothing is closed in the block."""
        self._thread.loop.call_soon_threadsafe(self._flowing.clear)
        try:
            yield
        finally:
            self._thread.loop.call_soon_threadsafe(self._flowing.set)

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        self._thread.run(stop())
        self._thread.close()


@contextmanager
def relay(target: int) -> Iterator[Relay]:
    made = Relay(target)
    try:
        yield made
    finally:
        made.close()
