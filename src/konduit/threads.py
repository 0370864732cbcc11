"""Threads for user code that never let a hung call hold a slot or a loop: sync handlers, and
the code the engine calls on its own loops (a trigger's ``input=``/``key=``, a map's ``over()``,
a start's key functions: :func:`call_within`).

A thread cannot be killed. When the worker gives up on a sync call (its deadline passed, its
execution was cancelled, its lease was lost) the thread is *abandoned*: it keeps running until the
user's code returns, but it no longer counts as one of the worker's slots, and the next call gets
another thread. Finished threads are reused; idle ones exit after a while. The count of abandoned
threads is reported (``konduit workers``, metrics) and bounded by the worker, which counts the
process-wide pools of the code it runs on its loop too (:func:`process_abandoned`); a pool may
bound them itself (``max_abandoned``: past it, :class:`~konduit.errors.UserCodeStuck` instead
of one more thread).

Whatever user code raises comes back as an exception of the call, never as a
``KeyboardInterrupt`` or ``SystemExit`` set on the future a loop awaits: thrown into the
awaiting task, those end the loop's run (asyncio re-raises them out of ``run_forever``), so they
are carried as :class:`~konduit.errors.UserCodeInterrupted` (the original as its cause).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from konduit.errors import UserCodeInterrupted, UserCodeStuck

T = TypeVar("T")

log = logging.getLogger(__name__)

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


_PROCESS_POOLS: weakref.WeakSet[HandlerThreads] = weakref.WeakSet()


def process_abandoned() -> int:
    """Abandoned calls of the process-wide pools (``process_wide=True``): the user code the
    engine runs on any loop of this process (start-time code, triggers' code, maps' ``over()``),
    still running past its limit."""
    return sum(pool.abandoned for pool in list(_PROCESS_POOLS))


def interrupted(exc: BaseException) -> BaseException:
    """``exc`` itself if it is an ``Exception``; else (``KeyboardInterrupt``, ``SystemExit``,
    ``GeneratorExit``, a ``CancelledError`` of the code's own) a
    :class:`~konduit.errors.UserCodeInterrupted` saying what, with ``exc`` as its cause."""
    if isinstance(exc, Exception):
        return exc
    try:
        text = str(exc)
    except Exception:
        text = "(unprintable)"
    error = UserCodeInterrupted(f"user code raised {type(exc).__name__}"
                                + (f": {text}" if text else ""))
    error.__cause__ = exc
    return error


class HandlerThreads:
    """An elastic pool: a free thread if there is one, else a new one; never a queue behind a
    hung call. With ``max_abandoned``, at most that many calls may be abandoned and still
    running: past it :meth:`submit` raises :class:`~konduit.errors.UserCodeStuck` (``what``
    names the code in its message) until one returns. ``process_wide``: the pool's abandoned
    calls count in :func:`process_abandoned` (a worker's limit)."""

    def __init__(self, *, idle_seconds: float = 60.0, name: str = "konduit-handler",
                 max_abandoned: int | None = None, what: str = "user code",
                 process_wide: bool = False):
        self.idle_seconds = idle_seconds
        self.name = name
        self.max_abandoned = max_abandoned
        self.what = what
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job and not yet promised to a submitter
        self._threads = 0
        self._abandoned: set[Future[Any]] = set()
        self._names = itertools.count(1)
        if process_wide:
            _PROCESS_POOLS.add(self)

    @property
    def threads(self) -> int:
        with self._lock:
            return self._threads

    @property
    def abandoned(self) -> int:
        """Calls given up on whose thread is still running the user's code."""
        with self._lock:
            return len(self._abandoned)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            stuck = len(self._abandoned)
            if self.max_abandoned is not None and stuck >= self.max_abandoned:
                raise UserCodeStuck(
                    f"{stuck} calls of {self.what} did not return within their limit and are "
                    f"still running (at most {self.max_abandoned} may be): refused until one "
                    f"of them returns")
            spawn = self._idle == 0
            if spawn:
                self._threads += 1
            else:
                self._idle -= 1  # promised: an idle thread takes the job we are about to queue
        self._jobs.put((future, fn, args))
        if spawn:
            threading.Thread(
                target=self._serve, name=f"{self.name}-{next(self._names)}", daemon=True
            ).start()
        return future

    def abandon(self, future: Future[Any]) -> None:
        """The caller stopped waiting for ``future``; count its thread until it returns."""
        with self._lock:
            if future.done():
                return
            self._abandoned.add(future)
        future.add_done_callback(self._returned)

    def _returned(self, future: Future[Any]) -> None:
        with self._lock:
            self._abandoned.discard(future)

    def _serve(self) -> None:
        job: _Job | None = self._jobs.get()
        while job is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # SystemExit too: it ends the call, not the thread
                    future.set_exception(interrupted(exc))
            del job, future, fn, args
            with self._lock:
                self._idle += 1
            job = self._next_job()

    def _next_job(self) -> _Job | None:
        while True:
            try:
                return self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # no submitter promised this thread a job: retire
                        self._idle -= 1
                        self._threads -= 1
                        return None
                # every idle thread is promised a job, this one included: it is on its way


async def call_within(threads: HandlerThreads, call: Callable[[], T], seconds: float) -> T:
    """``call`` (user code) on one of ``threads``, awaited for at most ``seconds``: past them
    the call is abandoned and :class:`TimeoutError` raised, so code that never returns holds
    neither the awaiting loop nor a thread the rest of the process needs (the loop's default
    executor is a small fixed pool)."""
    future = threads.submit(call)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), seconds)
    except TimeoutError:
        threads.abandon(future)
        raise
