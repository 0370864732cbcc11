"""An event loop on a thread of its own: how sync code (the App's sync face, the metrics
collector, the benchmarks) drives the async core without owning the caller's thread.

The thread is a daemon, so a forgotten ``close()`` never keeps a process alive; ``close()``
stops the loop and waits for the thread, so connections opened on the loop must be closed
through :meth:`LoopThread.run` before it.

Nothing the coroutines raise ends the thread. asyncio re-raises a ``KeyboardInterrupt`` or
``SystemExit`` that escapes a task out of ``run_forever``: on this thread no signal delivers
one (signals go to the main thread), so it can only come from user code the loop ran (a key
function, a validator), and it must end that call, not every later call of every thread. A
coroutine run here has it turned into :class:`~konduit.errors.UserCodeInterrupted` before its
task sees it; one that escapes another task anyway is logged and the loop runs on."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from konduit.threads import interrupted

T = TypeVar("T")

log = logging.getLogger(__name__)


async def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    """``await coro``, with what it raises that is no ``Exception`` (but a cancellation)
    turned into :class:`~konduit.errors.UserCodeInterrupted`."""
    try:
        return await coro
    except (Exception, asyncio.CancelledError):
        raise  # a cancellation ends its task as asyncio means it to
    except BaseException as exc:
        raise interrupted(exc) from exc


class LoopThread:
    """A new event loop running forever on a daemon thread named ``name``."""

    def __init__(self, name: str = "konduit-loop"):
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                self.loop.run_forever()
            except BaseException as exc:  # from a task or callback: see the module's docstring
                log.error("loop thread %s: %s escaped a task (user code raised it); the loop "
                          "runs on", threading.current_thread().name, type(exc).__name__,
                          exc_info=exc)
                if not self.closed:
                    continue
            return

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread; its future (cancel it to cancel it)."""
        return asyncio.run_coroutine_threadsafe(_guarded(coro), self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout`` seconds). What
        it raised that is no ``Exception`` comes back as
        :class:`~konduit.errors.UserCodeInterrupted`; a ``KeyboardInterrupt`` delivered to the
        waiting thread itself (Ctrl-C in the main thread) is raised as it is."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except Exception:
            raise
        except BaseException as exc:
            if future.done() and not future.cancelled() and future.exception() is exc:
                raise interrupted(exc) from exc
            raise

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and wait up to ``timeout`` seconds for its thread; idempotent."""
        if self.closed:
            return
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)
        # A loop still running (a callback that would not return) cannot be closed: the
        # daemon thread goes with the process.
        if not self.thread.is_alive():
            self.loop.close()
