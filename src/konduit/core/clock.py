"""The time the engine's Python side reads where it compares with the time of the workflow:
a task's deadline, a timer's wake-up, the next tick of a schedule, when maintenance comes due.

By default it is the real clock (``time.time``, ``time.monotonic``, ``asyncio.sleep``,
``asyncio.timeout``), each function one test of a module global away from it. A test may
install a :class:`VirtualClock` (``konduit.testing.run(..., clock="virtual")``, see
docs/testing.md): its time runs with the real one, ``offset`` seconds ahead, and jumps forward
when the test advances it. Whatever sleeps or waits on a deadline through this module wakes at
once when the clock jumps, and sees the new time. The database side follows the same offset
(``konduit_now()`` and its siblings, migration 0036).

Liveness stays on the real clock: heartbeats, poll intervals and reconnect back-offs are about
processes, not about the workflow's time.
"""

from __future__ import annotations

import asyncio
import threading
import time as _time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any


async def wait_for_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed, on the real clock; True when
    it was set. A cancellation is never swallowed (``asyncio.timeout``, not ``wait_for``: see
    :mod:`konduit.aio`, which exports it as ``wait_event``)."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


__all__ = ["VirtualClock", "installed", "monotonic", "now", "sleep", "time", "timeout",
           "wait_event"]


class VirtualClock:
    """A clock ``offset`` seconds ahead of the real one, that only moves forward.

    :meth:`advance` moves it and wakes, on their own event loops, whatever waits through this
    module (sleeps, deadlines, timers). Thread-safe: a test's thread advances it while the
    worker's loop reads it.
    """

    def __init__(self, offset: float = 0.0) -> None:
        self._offset = float(offset)
        self._lock = threading.Lock()
        self._watchers: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
        self._next = 0
        self._moved: list[Callable[[float], None]] = []

    @property
    def offset(self) -> float:
        """Seconds this clock is ahead of the real one."""
        return self._offset

    def time(self) -> float:
        """Seconds since the epoch, on this clock."""
        return _time.time() + self._offset

    def monotonic(self) -> float:
        """A monotonic reading on this clock (the real one plus the offset)."""
        return _time.monotonic() + self._offset

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward (never back); returns the new offset. Everything
        waiting through :mod:`konduit.core.clock` wakes and looks at the time again."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward (asked to move {seconds!r} s)")
        with self._lock:
            self._offset += float(seconds)
            watchers = list(self._watchers.values())
            moved = list(self._moved)
        for loop, callback in watchers:
            try:
                loop.call_soon_threadsafe(callback)
            except RuntimeError:  # that loop is closed: nothing of it waits any more
                pass
        for hook in moved:
            hook(self._offset)
        return self._offset

    def on_advance(self, hook: Callable[[float], None]) -> None:
        """Call ``hook(offset)`` (on the advancing thread) after each :meth:`advance`."""
        with self._lock:
            self._moved.append(hook)

    def watch(self, callback: Callable[[], None]) -> int:
        """Call ``callback`` on the running loop after each :meth:`advance`; returns a key for
        :meth:`unwatch`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._next += 1
            self._watchers[self._next] = (loop, callback)
            return self._next

    def unwatch(self, key: int) -> None:
        """Stop calling the callback :meth:`watch` returned ``key`` for."""
        with self._lock:
            self._watchers.pop(key, None)


_virtual: VirtualClock | None = None
_install_lock = threading.Lock()


def install(clock: VirtualClock | None) -> None:
    """Make ``clock`` the process's clock (None: the real one again). One virtual clock at a
    time: installing a second over the first raises."""
    global _virtual
    with _install_lock:
        if clock is not None and _virtual is not None and _virtual is not clock:
            raise RuntimeError("a virtual clock is installed already in this process; "
                               "one test at a time may run on a virtual clock")
        _virtual = clock


def installed() -> VirtualClock | None:
    """The virtual clock in use, or None on the real clock."""
    return _virtual


def time() -> float:
    """Seconds since the epoch (``time.time()`` on the real clock)."""
    return _time.time() if _virtual is None else _virtual.time()


def monotonic() -> float:
    """A monotonic reading (``time.monotonic()`` on the real clock)."""
    return _time.monotonic() if _virtual is None else _virtual.monotonic()


def now() -> datetime:
    """The current time, aware, in UTC."""
    real = datetime.now(UTC)
    return real if _virtual is None else real + timedelta(seconds=_virtual.offset)


async def sleep(seconds: float) -> None:
    """``asyncio.sleep`` on this clock: on a virtual one, ends early when it jumps past."""
    clock = _virtual
    if clock is None:
        await asyncio.sleep(seconds)
        return
    await _virtual_wait(clock, None, seconds)


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """:func:`konduit.aio.wait_event` on this clock: until ``event`` is set (True) or
    ``seconds`` passed on it (False)."""
    clock = _virtual
    if clock is None:
        return await wait_for_event(event, seconds)
    return await _virtual_wait(clock, event, seconds)


async def _virtual_wait(clock: VirtualClock, event: asyncio.Event | None, seconds: float) -> bool:
    target = clock.monotonic() + max(0.0, seconds)
    moved = asyncio.Event()
    key = clock.watch(moved.set)
    try:
        while True:
            if event is not None and event.is_set():
                return True
            left = target - clock.monotonic()
            if left <= 0:
                return False
            moved.clear()
            if event is None:
                await wait_for_event(moved, left)
                continue
            waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(moved.wait())}
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
    finally:
        clock.unwatch(key)


def timeout(seconds: float) -> Any:
    """``asyncio.timeout(seconds)`` on this clock: on a virtual one, it expires when the clock
    jumps past its moment. The returned object has ``expired()`` as asyncio's has."""
    clock = _virtual
    if clock is None:
        return asyncio.timeout(seconds)
    return _VirtualTimeout(clock, seconds)


class _VirtualTimeout:
    """An ``asyncio.timeout`` whose moment is on a :class:`VirtualClock`: rescheduled on the
    loop's own clock each time the virtual one jumps."""

    def __init__(self, clock: VirtualClock, seconds: float) -> None:
        self._clock = clock
        self._target = clock.monotonic() + seconds
        self._inner = asyncio.timeout(seconds)
        self._key: int | None = None

    async def __aenter__(self) -> _VirtualTimeout:
        await self._inner.__aenter__()
        loop = asyncio.get_running_loop()

        def moved() -> None:
            if self._key is None or self._inner.expired():
                return
            left = self._target - self._clock.monotonic()
            self._inner.reschedule(loop.time() + max(0.0, left))

        self._key = self._clock.watch(moved)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._key is not None:
            self._clock.unwatch(self._key)
            self._key = None
        await self._inner.__aexit__(*exc_info)

    def expired(self) -> bool:
        """Whether the moment passed and the block was cancelled for it."""
        return self._inner.expired()


def call_later(delay: float, callback: Callable[[], None]) -> None:
    """``loop.call_later(delay, callback)`` on the running loop, on this clock."""
    clock = _virtual
    loop = asyncio.get_running_loop()
    if clock is None:
        loop.call_later(delay, callback)
        return

    async def later() -> None:
        await _virtual_wait(clock, None, delay)
        callback()

    task = loop.create_task(later())
    _later.add(task)
    task.add_done_callback(_later.discard)


_later: set[asyncio.Task[None]] = set()
