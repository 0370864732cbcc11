"""A worker that was asked to stop and has not says where it is.

A stop (SIGTERM, SIGINT, ``stop_event``) lets running handlers finish for ``shutdown_grace``
seconds, hands the rest back and closes the connections: seconds. A worker still running well
past that is stuck somewhere, and a supervisor will kill it without a word on what held it. So
the first stop request arms a timer on its own thread (the event loop may be what is blocked):
when it fires, the worker writes to stderr, once, how long it has been stopping, every thread's
stack (``faulthandler``) and, through the loop when the loop still turns, every asyncio task's
stack. The dump is for the person (or the CI log) who has to find out why; a ``konduit worker``
process then ends itself (:data:`exit_when_stuck`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import os
import sys
import threading
import time
from typing import TextIO

from konduit.settings import settings


def stuck_after() -> float:
    """Seconds past the shutdown grace before a stopping worker says where it is (the
    ``stop_stuck_after`` setting, ``KONDUIT_STOP_STUCK_AFTER``, 20 s)."""
    return settings().stop_stuck_after

EXIT_CODE = 70
"""The exit status of a worker process that ended itself because its stop did not (EX_SOFTWARE)."""

exit_when_stuck: float | None = None
"""Seconds after saying where it is before the process ends itself (``os._exit``), or None to
wait on. ``konduit worker`` sets it (10 s): a worker process exists to run the worker, and one
whose stop hangs would otherwise wait for a supervisor's SIGKILL. Nothing is lost by it: the
tasks it still held come back when their leases expire, as after any crash."""


class StopWatch:
    """Armed by the first stop request; :meth:`done` when the worker ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, grace: float, *,
                 after: float | None = None, out: TextIO | None = None):
        self.loop = loop
        self.after = grace + (stuck_after() if after is None else after)
        self.out = out
        self.began: float | None = None
        self._timer: threading.Timer | None = None
        self._finished = False
        self._lock = threading.Lock()

    def arm(self) -> None:
        """Start the clock (the first call only). Safe in a signal handler: it never waits for
        a lock (a handler may interrupt the thread that holds it)."""
        if not self._lock.acquire(blocking=False):
            return  # being armed or disarmed right now: either way nothing to add
        try:
            if self.began is not None or self._finished:
                return
            self.began = time.monotonic()
            self._timer = threading.Timer(self.after, self._dump)
            self._timer.daemon = True
            self._timer.name = "konduit-stop-watch"
            self._timer.start()
        finally:
            self._lock.release()

    def on_signal(self, signum: int, frame: object) -> None:
        """A signal handler that arms the watch. asyncio learns of the signal from its wakeup
        descriptor, written before any handler runs, so its own handler (the worker's stop)
        still runs when the loop turns; this one runs even while the loop is blocked (user
        code that sleeps on it), between the main thread's bytecodes."""
        self.arm()

    def done(self) -> None:
        with self._lock:
            self._finished = True
            if self._timer is not None:
                self._timer.cancel()

    def _stream(self) -> TextIO:
        return self.out if self.out is not None else sys.stderr

    def _dump(self) -> None:
        out = self._stream()
        waited = time.monotonic() - (self.began or time.monotonic())
        out.write(f"konduit worker: still stopping {waited:.0f} s after the stop request "
                  "(its grace is over); where each thread is:\n")
        try:
            faulthandler.dump_traceback(file=out, all_threads=True)
        except (io.UnsupportedOperation, AttributeError, ValueError):
            # Not a real file (a test's StringIO): the Python-level stacks instead.
            for ident, frame in sys._current_frames().items():
                out.write(f"Thread {ident}:\n")
                import traceback

                out.write("".join(traceback.format_stack(frame)))
        out.flush()
        try:
            self.loop.call_soon_threadsafe(self._dump_tasks)
        except RuntimeError:
            out.write("konduit worker: its event loop is closed\n")
        if exit_when_stuck is not None:
            ending = threading.Timer(exit_when_stuck, self._exit)
            ending.daemon = True
            ending.name = "konduit-stop-exit"
            ending.start()

    def _exit(self) -> None:
        with self._lock:
            if self._finished:
                return
        out = self._stream()
        out.write(f"konduit worker: ending the process (exit status {EXIT_CODE}): its stop "
                  "did not end; the tasks it held come back when their leases expire\n")
        out.flush()
        os._exit(EXIT_CODE)

    def _dump_tasks(self) -> None:
        out = self._stream()
        tasks = asyncio.all_tasks(self.loop)
        out.write(f"konduit worker: {len(tasks)} asyncio task(s) still running:\n")
        for task in sorted(tasks, key=lambda t: t.get_name()):
            buffer = io.StringIO()
            task.print_stack(file=buffer)
            out.write(buffer.getvalue())
        out.flush()
