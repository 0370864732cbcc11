"""``ctx.stream``: a handler's durable stream, as the handler sees it (docs/streams.md).

A stream belongs to one task and is keyed by (execution, name); its default name is the step's,
``step[3]`` for the item 3 of a map step. Each :meth:`Stream.write` is one chunk, stored by the
worker in the database at the next offset of the stream (dense from 0) while the attempt still
holds its task's lease (the statement checks it). What is stored is the chunk's JSON, made by
:func:`encode_chunk`, the one place a chunk becomes stored text, and read back by
:func:`decode_chunk`.

Writes keep their order. In a sync handler (on a thread) ``write`` waits until the chunk is
stored and returns its offset. In an async handler (on the worker's loop) it cannot wait: it
returns an awaitable that gives the offset (``await ctx.stream.write(x)`` waits; a write not
awaited is still stored, in order, and the attempt waits for all of them before it ends: a
write that failed then fails the attempt).

This module knows no database: the worker hands a :class:`Stream` the coroutine that stores one
chunk (``send(seq, payload_json) -> offset``; ``seq`` counts the attempt's writes to the stream
from 1, so a write sent twice is stored once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from konduit.core.payloads import canonical_json
from konduit.errors import StreamError

Send = Callable[[str, int, str], Awaitable[int]]
"""Store one chunk: ``send(name, seq, payload_json)`` returns its offset."""


def stream_name(step: str, map_index: int, is_map: bool) -> str:
    """The default stream name of a task: its step's name, ``step[i]`` for a map item."""
    return f"{step}[{map_index}]" if is_map else step


def encode_chunk(value: Any, *, step: str, stream: str, max_bytes: int) -> str:
    """A chunk as the text stored for it: its JSON, as konduit stores every payload
    (:func:`~konduit.core.payloads.canonical_json`), or :class:`~konduit.PayloadError` naming
    the step and the stream."""
    return canonical_json(value, what=f"a chunk written to stream {stream!r} of step {step!r}",
                          max_bytes=max_bytes)


def decode_chunk(kind: str, value: Any) -> Any:
    """What a stored chunk (:func:`encode_chunk`, read back as ``jsonb``: opened by the payload
    codec on the way, konduit.db.sealing) stands for; None for a restart."""
    return value if kind == "data" else None


class Stream:
    """One durable stream of the running attempt: ``ctx.stream`` (or ``ctx.streams(name)``)."""

    def __init__(self, name: str, *, step: str, send: Send, loop: asyncio.AbstractEventLoop,
                 max_bytes: int):
        self.name = name
        self.step = step
        self._send = send
        self._loop = loop
        self._max_bytes = max_bytes
        self._seq = 0
        self._last: asyncio.Task[int] | None = None
        self._pending: set[asyncio.Task[int]] = set()
        self._failed: list[PendingWrite] = []

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    def write(self, chunk: Any) -> Any:
        """Append ``chunk`` (anything JSON can hold) to the stream. In a sync handler: waits
        until it is stored and returns its offset. In an async handler: returns an awaitable
        of its offset (await it to wait and to see its error; the attempt waits for a write not
        awaited before it ends, and fails with its error).

        Raises :class:`~konduit.PayloadError` at once for a chunk that is not JSON or bigger
        than the payload limit; :class:`~konduit.StreamFull` past the stream's bounds and
        :class:`~konduit.StreamLeaseLost` when this attempt no longer holds its task's lease;
        nothing of the chunk is stored then."""
        payload = encode_chunk(chunk, step=self.step, stream=self.name, max_bytes=self._max_bytes)
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            pending = PendingWrite(self._enqueue(payload))
            self._watch(pending)
            return pending
        if self._loop.is_closed():
            raise StreamError(f"stream {self.name!r} of step {self.step!r}: the worker that ran "
                              "this attempt has stopped", step=self.step, stream=self.name)
        done: concurrent.futures.Future[int] = concurrent.futures.Future()

        def enqueue() -> None:
            task = self._enqueue(payload)
            task.add_done_callback(lambda t: _settle(done, t))

        self._loop.call_soon_threadsafe(enqueue)
        return done.result()  # its error is raised to the writer here: it saw it

    def _enqueue(self, payload: str) -> asyncio.Task[int]:
        # On the loop only: seq and the chain are in write order.
        self._seq += 1
        task = self._loop.create_task(self._after(self._last, self._seq, payload))
        self._last = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        task.add_done_callback(_retrieved)  # its error reaches its writer or flush(), not the log
        return task

    def _watch(self, pending: PendingWrite) -> None:
        def ended(task: asyncio.Task[int]) -> None:
            if not task.cancelled() and task.exception() is not None:
                self._failed.append(pending)

        pending.task.add_done_callback(ended)

    async def _after(self, previous: asyncio.Task[int] | None, seq: int, payload: str) -> int:
        if previous is not None:
            await asyncio.wait({previous})  # in order: after the write before it ended
        return await self._send(self.name, seq, payload)

    async def flush(self) -> None:
        """Wait for every write made so far; raise the error of the first one that failed
        and was never awaited (its writer did not see it)."""
        last = self._last
        if last is None:
            return
        await asyncio.wait({last})
        for pending in self._failed:
            if not pending.observed:
                exc = pending.task.exception()
                assert exc is not None
                raise exc

    def abandon(self) -> None:
        """Cancel the writes not stored yet (the attempt ended without waiting for them)."""
        for task in list(self._pending):
            task.cancel()

    async def settle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the writes on their way, whatever they end in;
        cancel those still not done then."""
        pending = set(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self.abandon()


class PendingWrite:
    """A write of an async handler: ``await`` it for the chunk's offset (or its error)."""

    def __init__(self, task: asyncio.Task[int]):
        self.task = task
        self.observed = False

    def __await__(self) -> Generator[Any, None, int]:
        self.observed = True
        return (yield from self.task.__await__())

    def __repr__(self) -> str:
        return f"PendingWrite(done={self.task.done()})"


def _retrieved(task: asyncio.Task[int]) -> None:
    if not task.cancelled():
        task.exception()


def _settle(done: concurrent.futures.Future[int], task: asyncio.Task[int]) -> None:
    if task.cancelled():
        done.set_exception(StreamError("the write was cancelled: its attempt ended"))
    elif (exc := task.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(task.result())


class Streams:
    """The streams of one attempt, by name, created on first use (``ctx.stream``,
    ``ctx.streams(name)``)."""

    def __init__(self, *, step: str, default: str, send: Send, loop: asyncio.AbstractEventLoop,
                 max_bytes: int):
        self.step = step
        self.default = default
        self._send = send
        self._loop = loop
        self._max_bytes = max_bytes
        self._open: dict[str, Stream] = {}

    def get(self, name: str | None = None) -> Stream:
        """The stream ``name`` (the task's default stream when None)."""
        name = self.default if name is None else name
        if not isinstance(name, str) or not name or len(name) > 200:
            raise StreamError(f"step {self.step!r}: a stream's name must be a text of 1 to 200 "
                              f"characters, not {name!r}", step=self.step)
        stream = self._open.get(name)
        if stream is None:
            stream = self._open[name] = Stream(name, step=self.step, send=self._send,
                                               loop=self._loop, max_bytes=self._max_bytes)
        return stream

    async def flush(self) -> None:
        """Wait for every stream's writes; the first error of any, raised."""
        for stream in list(self._open.values()):
            await stream.flush()

    def abandon(self) -> None:
        """Cancel every write not stored yet."""
        for stream in self._open.values():
            stream.abandon()

    async def settle(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds each) for every stream's writes on their way."""
        for stream in list(self._open.values()):
            await stream.settle(timeout)
