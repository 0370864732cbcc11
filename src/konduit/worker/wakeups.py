"""When a worker's maintenance loop wakes: at the next moment that has work, not at the next poll.

The loop runs its full pass (rescue, deadlines, waits, timeouts, housekeeping) every
``maintenance_interval``. Between two, it wakes for what is due sooner (a dead worker's
branch used to end up to interval + grace after its deadline; a 20 s repair window could fall
between two 30 s looks), each read from the database after every pass by one statement
(``task_get_next_due``: a first-row scan of a partial index per kind):

* ``deadline``: the earliest deadline of a ready, running or waiting task (or the end of a live
  worker's grace): the deadline sweep alone runs;
* ``timer``: the earliest durable-wait timer: the wake of due waits alone runs;
* ``repair``: the earliest automatic repair (``repair_within=``): the due repairs are taken.
  A worker that finishes an execution of a workflow with a repair contract also expects one at
  ``repair_delay`` from then (:meth:`SweepClock.expect`), so a repair armed after its last read
  is on time too; one armed by another worker is read at this worker's next pass.

A deadline set after the last read (a task claimed by another worker) is the only thing this
read can miss. Every worker re-reads at least once per interval, so a deadline at least an interval
away is known in time by all; a shorter one is announced: the worker whose claim set it sends one
``konduit_deadline`` notification, and only when that deadline is earlier than its own next
wake-up (so, in practice, before anyone knew of it): every NOTIFY costs each listening backend a
transaction, so none is sent per task. A notified worker re-reads and sleeps again.

Several workers waking at the same deadline is harmless: the sweep's writes are guarded and its
list skips what another worker's job holds. Passes driven by deadlines are at least
:data:`MIN_GAP` apart, so a storm of timeouts costs a few statements a second, not one per task.
"""

from __future__ import annotations

import asyncio

from konduit.core import clock as time_source
from konduit.db.database import Database

MIN_GAP = 0.1
"""Seconds between two passes driven by due times (not the interval): deadlines that come close
together are swept together. Small next to the half second a deadline may be late by."""

KINDS = ("deadline", "timer", "repair")


class SweepClock:
    """The maintenance loop's schedule: the interval's next full pass and the due times read."""

    def __init__(self, interval: float, *, grace: float):
        self.interval = interval
        self.grace = grace
        self._tick = time_source.monotonic() + interval
        self._due: dict[str, float] = {}  # kind -> monotonic time it comes due
        self._last = 0.0  # monotonic time of the last pass driven by a due time
        self._poked = asyncio.Event()

    def planned(self) -> float:
        """The monotonic time of the next wake-up."""
        return min([self._tick, *self._due.values()])

    async def reread(self, db: Database) -> None:
        """Read the next due times (after a pass, and when poked)."""
        # Cleared before the read: a notification that arrives while it runs pokes again.
        self._poked.clear()
        row = await db.one("task_get_next_due", grace_seconds=self.grace)
        now = time_source.monotonic()
        self._due = {kind: now + max(0.0, float(row[kind]))
                     for kind in KINDS if row is not None and row[kind] is not None}

    def unpoke(self) -> None:
        """A worker that does not lead reads nothing when poked: it sleeps on."""
        self._poked.clear()

    def poke(self) -> None:
        """Another worker announced an earlier deadline: re-read before sleeping on."""
        self._poked.set()

    def claimed(self, remaining: float) -> bool:
        """A claim of this worker set a deadline ``remaining`` seconds from now. True when it is
        earlier than this worker's next wake-up, which every worker's is close to (they read the
        same next due, and wake at least every interval): the caller announces it. This worker
        wakes then too, so the next claims with deadlines after it announce nothing."""
        at = time_source.monotonic() + max(0.0, remaining)
        if at >= self.planned():
            return False
        self._due["deadline"] = at
        return True

    def expect(self, kind: str, seconds: float) -> None:
        """Something of ``kind`` may come due ``seconds`` from now (this worker just finished an
        execution whose automatic repair may be armed): wake then, unless sooner anyway. Needs
        no statement; if nothing is due then, the pass finds nothing and the read moves on."""
        at = time_source.monotonic() + max(0.0, seconds)
        self._due[kind] = min(self._due.get(kind, at), at)

    async def sleep(self) -> set[str]:
        """Sleep until something is due; returns what: ``{"full"}`` (the interval's pass), some
        of :data:`KINDS`, or nothing when poked (re-read, then sleep again)."""
        while True:
            delay = self.planned() - time_source.monotonic()
            if delay > 0 and await time_source.wait_event(self._poked, delay):
                return set()
            now = time_source.monotonic()
            if now >= self._tick:
                self._tick = now + self.interval
                self._due = {}  # the full pass does all of it, and is followed by a read
                return {"full"}
            due = {kind for kind, at in self._due.items() if at <= now}
            if not due:
                continue
            if now < self._last + MIN_GAP:
                # Too soon after the last such pass: coalesce with whatever comes meanwhile.
                for kind in due:
                    self._due[kind] = self._last + MIN_GAP
                continue
            for kind in due:
                del self._due[kind]
            self._last = now
            return due
