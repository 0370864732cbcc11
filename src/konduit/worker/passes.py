"""Passes done: each background service of a worker counts the passes it completed, so that a
caller (a test, a health check) can wait for the next ones instead of sleeping for a guess.

A service calls :meth:`Passes.done` at the end of every pass, whether it found work or not (a
pass that failed with a database error does not count: it did not look). Waiting is by
thread-safe condition, since the worker runs on an event loop while its tests wait on another
thread; :meth:`Passes.done` never blocks, so the loop is not slowed by a waiter.
"""

from __future__ import annotations

import threading
import time

SERVICES: tuple[str, ...] = (
    # The leader of the worker's deployment runs these (konduit.worker.leadership); a worker that
    # does not lead counts none of them but "repair" at its own wake-ups, "hedging" and "leader".
    "maintenance",  # one full pass of the maintenance loop: every sweep below that is due
    "rescue",       # tasks whose worker is gone (and hedges whose lease ran out)
    "deadlines",    # tasks past their deadline
    "waits",        # waiting tasks that are due (timers, events, ended children)
    "starts",       # scheduled executions (start(run_at=, delay=)) whose time came
    "triggers",     # events that start work (wf.on_event): pending ones, bursts and batches due
    "timeouts",     # executions past their timeout
    "stalls",       # the stall watchdog
    "repair",       # automatic repairs that are due
    "retention",    # pruning of old executions (when retention is set)
    "history",      # moves of finished executions into the history (when history_after is set)
    "alerts",       # alert rules (fan-in waits, windows)
    "schedules",    # schedule ticks
    "hedging",      # the hedger's look for straggling attempts
    "map_chunks",   # the chunk taker's look for maps' items to create (until none is left)
    "leader",       # a try (or renewal) of the maintenance leader's lease that got an answer
)
"""The services whose passes are counted, by the name :meth:`Passes.wait` takes."""


class Passes:
    """How many passes each service of one worker completed; waitable from any thread."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = dict.fromkeys(SERVICES, 0)
        self._changed = threading.Condition()

    def done(self, service: str) -> None:
        """``service`` completed one more pass (called by the service itself)."""
        with self._changed:
            self._counts[_known(service)] += 1
            self._changed.notify_all()

    def count(self, service: str) -> int:
        """How many passes ``service`` completed so far."""
        with self._changed:
            return self._counts[_known(service)]

    def wait(self, service: str, n: int = 2, timeout: float = 30.0) -> int:
        """Block until ``service`` completes ``n`` more passes than it had when called; return
        the count reached. A pass under way at the call counts as one, so ``n=2`` (the default)
        waits for at least one pass that began after the call. Raises :class:`TimeoutError`
        naming the service after ``timeout`` seconds."""
        if n < 1:
            raise ValueError(f"n must be at least 1 (got {n!r})")
        goal = self.count(service) + n
        if not self.reach(service, goal, timeout):
            raise TimeoutError(f"the {service!r} service completed "
                               f"{self.count(service) - goal + n} of {n} passes within {timeout} s")
        return self.count(service)

    def reach(self, service: str, goal: int, timeout: float) -> bool:
        """Block until ``service`` has completed ``goal`` passes in all, at most ``timeout``
        seconds; whether it did."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._counts[_known(service)] < goal:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True


def _known(service: str) -> str:
    if service not in SERVICES:
        raise ValueError(f"no service named {service!r}: the services are {', '.join(SERVICES)}")
    return service
