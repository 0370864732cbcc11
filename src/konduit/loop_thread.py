"""An event loop on a thread of its own: how sync code (the App's sync face, the metrics
collector, the benchmarks) drives the async core without owning the caller's thread.

The thread is a daemon, so a forgotten ``close()`` never keeps a process alive; ``close()``
stops the loop and waits for the thread, so connections opened on the loop must be closed
through :meth:`LoopThread.run` before it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A new event loop running forever on a daemon thread named ``name``."""

    def __init__(self, name: str = "konduit-loop"):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        self.closed = False

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread; its future (cancel it to cancel it)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout`` seconds)."""
        return self.submit(coro).result(timeout)

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
