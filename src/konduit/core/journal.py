"""Durable calls inside a step: the journal that ``ctx.call`` records into and replays from.

A handler wraps each call it must not repeat (a model request, a payment, a page fetched at a
cost) in ``await ctx.call("name", fn, *args)`` (``ctx.call_sync`` in a sync handler). The call's
result is recorded under the task's place (execution, step, map_index) and its position among
the handler's calls *before* it is handed back; a later attempt of the task (a retry, a rescue
after the worker died, a redrive or a repair) replays the recorded results in order instead of
calling again, and calls live from the first position that has no record. A call whose name is
not the one recorded at its position raises :class:`~konduit.errors.DeterminismError`.

The journal's storage is a :class:`JournalStore` (the database's, :mod:`konduit.engine.journal`);
what is pure — positions, replay, the determinism check, the bridge from a handler's thread to
the worker's event loop, the encoding of results — lives here. Results are encoded and decoded
by :func:`encode_result` and :func:`decode_result` only, the one place a payload codec plugs in.
A live call hands back its result *decoded from what was recorded*, so a handler sees the same
value live and replayed (a tuple comes back as a list either way).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json, content_hash
from konduit.errors import DeterminismError, JournalUnavailable, LeaseLost

T = TypeVar("T")

MAX_NAME_LENGTH = 200
"""The longest name a durable call may have (a CHECK of the journal table says the same)."""


def encode_result(value: Any, *, what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """A call's result as the text the journal stores (canonical JSON), or
    :class:`~konduit.errors.PayloadError` naming ``what``."""
    return canonical_json(value, what=what, max_bytes=max_bytes)


def decode_result(text: str) -> Any:
    """A recorded result back as the value handed to the handler."""
    return json.loads(text)


@dataclass(frozen=True)
class Recorded:
    """One recorded call: its position (from 1), its name and its result as stored."""

    seq: int
    name: str
    result: str


class JournalStore(Protocol):
    """Where a task's journal lives (:class:`konduit.engine.journal.DatabaseJournal`)."""

    async def load(self) -> list[Recorded]:
        """Every recorded call of the task's place, in position order."""

    async def entry(self, seq: int) -> Recorded | None:
        """The call recorded at position ``seq`` now (another attempt of the task, a hedge, may
        have recorded it since :meth:`load`), or None."""

    async def record(self, entry: Recorded, result_hash: str, duration: float) -> Recorded | None:
        """Record ``entry`` while the attempt holds the task's lease: the entry now recorded at
        its position (``entry``, or what another attempt of the task recorded there first), or
        None when the lease is lost and nothing is recorded there."""

    async def mark_replayed(self, seqs: list[int]) -> None:
        """Count a replay of the calls at these positions (for the execution page)."""


def check_name(name: object) -> str:
    """A durable call's name, or ValueError saying what is wrong with it."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"ctx.call: the name of a durable call must be a non-empty string, "
                         f"not {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"ctx.call: the name {name[:40]!r}... is {len(name)} characters, over "
                         f"the limit of {MAX_NAME_LENGTH}")
    return name


class CallJournal:
    """The journal of one attempt: hands out positions, replays what is recorded, records what
    runs live. One per attempt; the async path runs on the worker's loop, the sync path on the
    handler's thread (its storage work is sent to ``loop``).

    ``shared``: another attempt of the task may record calls while this one runs (its step is
    hedged). The journal is read once, at the first call; a call with no record in what was
    read is then looked up again before it runs live, so a call the other attempt recorded
    since is replayed, not made again."""

    def __init__(self, store: JournalStore, *, step: str, map_index: int,
                 loop: asyncio.AbstractEventLoop, max_bytes: int = DEFAULT_MAX_BYTES,
                 shared: bool = False):
        self._store = store
        self.step = step
        self.map_index = map_index
        self.shared = shared
        self._loop = loop
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._next = 0
        self._entries: dict[int, Recorded] | None = None
        self._loading: asyncio.Future[list[Recorded]] | None = None
        self._unmarked: list[int] = []
        self.live = 0
        """Calls of this attempt that ran live (and were recorded)."""
        self.replayed = 0
        """Calls of this attempt answered from the journal."""

    # -- the two doors ---------------------------------------------------------------------------

    async def call(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        """``await ctx.call``: replay the result recorded at this call's position, or call
        ``fn(*args, **kwargs)`` (awaiting what it returns when that is awaitable), record the
        result and return it."""
        seq = self._take()
        entry = await self._here(self._recorded(seq))
        if entry is not None:
            return self._replay(entry, name)
        await self._here(self._flush())
        began = time.monotonic()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return await self._here(self._record(seq, name, value, time.monotonic() - began))

    def call_sync(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        """``ctx.call_sync``: as :meth:`call`, from a sync handler's thread (the call runs on
        that thread; its journal's reads and writes on the worker's loop)."""
        if _on_loop(self._loop):
            raise JournalUnavailable(
                f"ctx.call_sync({name!r}, ...) was called on the event loop of an async handler "
                f"of step {self.step!r}: use `await ctx.call(...)` there")
        seq = self._take()
        entry = self._on_loop(self._recorded(seq))
        if entry is not None:
            return self._replay(entry, name)
        self._on_loop(self._flush())
        began = time.monotonic()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise JournalUnavailable(
                f"ctx.call_sync({name!r}, ...) of step {self.step!r} was handed a function that "
                f"returns an awaitable: await it with `await ctx.call(...)` in an async handler")
        return self._on_loop(self._record(seq, name, value, time.monotonic() - began))

    async def close(self) -> None:
        """At the end of the attempt: count the replays not counted yet."""
        await self._flush()

    # -- the parts -------------------------------------------------------------------------------

    def _take(self) -> int:
        # Taken before anything is awaited: calls started together (asyncio.gather) get their
        # positions in the order they were started, the same on every attempt.
        with self._lock:
            self._next += 1
            return self._next

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _here(self, coro: Coroutine[Any, Any, T]) -> T:
        # The journal's storage belongs to the worker's loop; a handler that runs a loop of its
        # own (asyncio.run in a sync handler, an agent's run_sync) reaches it from there.
        if _on_loop(self._loop):
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _recorded(self, seq: int) -> Recorded | None:
        if self._entries is None:
            if self._loading is None:
                self._loading = asyncio.ensure_future(self._store.load())
            entries = await asyncio.shield(self._loading)
            if self._entries is None:
                self._entries = {e.seq: e for e in entries}
            return self._entries.get(seq)  # just read: nothing to look up again
        found = self._entries.get(seq)
        if found is None and self.shared:
            # Read earlier: the other attempt (a hedge, or the straggler it hedges) may have
            # recorded this call since.
            found = await self._store.entry(seq)
            if found is not None:
                self._entries[seq] = found
        return found

    def _mismatch(self, seq: int, name: str, recorded: str) -> DeterminismError:
        return DeterminismError(
            f"durable call {name!r} of step {self.step!r} (item {self.map_index}) is call "
            f"number {seq} of its handler, but the journal recorded call {recorded!r} there: "
            f"the handler's calls changed order since they were recorded (a replay would hand "
            f"{name!r} the result of {recorded!r})",
            step=self.step, map_index=self.map_index, name=name, seq=seq, recorded=recorded)

    def _replay(self, entry: Recorded, name: str) -> Any:
        if entry.name != name:
            raise self._mismatch(entry.seq, name, entry.name)
        with self._lock:
            self._unmarked.append(entry.seq)
            self.replayed += 1
        return decode_result(entry.result)

    async def _flush(self) -> None:
        with self._lock:
            seqs, self._unmarked = self._unmarked, []
        if seqs:
            await self._store.mark_replayed(seqs)

    async def _record(self, seq: int, name: str, value: Any, duration: float) -> Any:
        text = encode_result(value, max_bytes=self._max_bytes,
                             what=f"the result of durable call {name!r} of step {self.step!r}")
        entry = Recorded(seq, name, text)
        kept = await self._store.record(entry, content_hash(text), duration)
        if kept is None:
            raise LeaseLost(
                f"durable call {name!r} of step {self.step!r} (call number {seq}) was not "
                f"recorded: this attempt no longer holds the task's lease (rescued, ended by its "
                f"deadline, cancelled or outrun), and ends here",
                step=self.step, name=name, seq=seq)
        if kept.name != name:  # another attempt of the task (a hedge) recorded another call
            raise self._mismatch(seq, name, kept.name)
        if self._entries is not None:
            self._entries[seq] = kept
        with self._lock:
            self.live += 1
        return decode_result(kept.result)


class RefusedJournal:
    """Where no journal can be written (a handler run in a child process): every durable call
    raises :class:`~konduit.errors.JournalUnavailable` saying why."""

    def __init__(self, reason: str):
        self.reason = reason

    async def call(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
        raise JournalUnavailable(f"durable call {name!r}: {self.reason}")

    def call_sync(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        raise JournalUnavailable(f"durable call {name!r}: {self.reason}")

    async def close(self) -> None:
        return None


async def call_directly(fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> Any:
    """A context without a journal (one a test built itself) calls through, unrecorded."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


Journal = CallJournal | RefusedJournal
"""What a context holds to make durable calls with."""

__all__ = ["CallJournal", "Journal", "JournalStore", "Recorded", "RefusedJournal",
           "call_directly", "check_name", "decode_result", "encode_result"]
