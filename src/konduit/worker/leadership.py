"""Leadership: which worker of a deployment runs the maintenance that is needed once per cluster.

The passes that look at everyone's work (rescue, the deadline sweep, due waits, scheduled starts,
triggers, timeouts, the stall watchdog, automatic repairs, retention, alerts, schedules) run on
one worker, the leader; the others do only what is theirs (their heartbeat, their LISTEN, their
claims, their own tasks' deadlines and timers). The leader holds a lease row in
``konduit_leaders`` (``leader_take``): it renews it every third of ``leader_lease``. The others
watch it in their heartbeat's statement (``worker_heartbeat`` says whether the lease is free: it
expired, its holder stopped, or the holder's heartbeat session is gone because its process died
and PostgreSQL closed its backend), so watching costs them no transaction of their own; one that
finds it free tries to take it (and every few leases anyway, a backstop). A leader that stops
gives the lease up and notifies (``konduit_leader``), so another takes over now.

A row, not an advisory lock: it holds behind a transaction pooler (PgBouncer in transaction
mode), where a session lock would be held by whichever server connection the pooler lent.

One lease per *deployment*: the workers that serve the same workflow versions with the same
maintenance settings (:func:`deployment`). The passes need the workflows' code (a rescued
task's retry policy, a deadline's fallback, a schedule's tick), so during a rolling deploy each
generation of workers elects its own leader, and a version some workers still serve is never
left without one. Most fleets run one deployment: one leader.

Leadership is a saving, not a lock the passes rely on: every write of a pass re-checks its
guard, as when every worker ran them, so a deposed leader finishing its pass, or two workers
that both believe they lead for a moment, change each task at most once. A leader whose renewal
fails keeps leading until its lease would have expired by its own clock, then stops.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable

from konduit.aio import cancelling, wait_event
from konduit.db.database import Database
from konduit.errors import DatabaseError

log = logging.getLogger(__name__)

PREFIX = "maintenance:"
BACKSTOP = 5
"""A follower tries the lease itself every this many leases (its heartbeat watches it)."""


def deployment(workflows: Iterable[str], *, settings: Iterable[object] = ()) -> str:
    """The lease name of the workers serving ``workflows`` (their keys) with these maintenance
    ``settings``: equal for equal sets, whatever their order."""
    text = "\n".join(sorted(set(workflows))) + "\n--\n" + "\n".join(map(repr, settings))
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


class Leadership:
    """Whether this worker leads its deployment's maintenance, kept by :meth:`run`."""

    def __init__(self, db: Database, *, name: str, worker_id: str, lease_seconds: float,
                 changed: Callable[[bool], None] = lambda leading: None,
                 tried: Callable[[], None] = lambda: None):
        if lease_seconds <= 0:
            raise ValueError(f"the leader lease must be > 0 s, got {lease_seconds}")
        self.db = db
        self.name = name
        self.worker_id = worker_id
        self.lease_seconds = lease_seconds
        self.changed = changed  # called on the loop when leading starts or stops
        self.tried = tried  # called after every try that reached the database
        self._until = 0.0  # monotonic time the lease holds until, by this process's clock
        self._leading = False
        self._poked = asyncio.Event()
        self.elections = 0  # how many times this worker took the lease

    @property
    def renew_every(self) -> float:
        return self.lease_seconds / 3

    @property
    def try_every(self) -> float:
        """Seconds between a follower's own tries: a backstop, since its heartbeat watches the
        lease (:meth:`watched`) and pokes it when the lease is free."""
        return self.lease_seconds * BACKSTOP

    def watched(self) -> str | None:
        """The lease a follower's heartbeat watches: this one, unless this worker holds it."""
        return None if self._leading else self.name

    @property
    def leading(self) -> bool:
        """Whether this worker leads now (its lease holds by its own clock)."""
        if self._leading and time.monotonic() >= self._until:
            self._set(False, "its lease ran out before it could renew it")
        return self._leading

    def poke(self) -> None:
        """The leader resigned (a notification): try to take the lease now."""
        self._poked.set()

    def _set(self, leading: bool, why: str) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            self.elections += 1
            log.info("worker %s leads the maintenance of its deployment (%s)", self.worker_id,
                     why)
        else:
            log.warning("worker %s no longer leads the maintenance (%s)", self.worker_id, why)
        self.changed(leading)

    async def attempt(self) -> bool:
        """One try (a renewal when leading); returns whether this worker leads afterwards."""
        sent = time.monotonic()
        try:
            row = await self.db.one("leader_take", name=self.name, worker_id=self.worker_id,
                                    lease_seconds=self.lease_seconds)
        except DatabaseError as exc:
            if cancelling():
                raise  # the stop, not a failed try
            log.warning("leader lease %s: %s", "renewal failed" if self._leading
                        else "try failed", exc)
            return self.leading
        self.tried()
        if row is not None:
            # Counted from before the statement was sent: the server's expiry is later.
            self._until = sent + self.lease_seconds
            self._set(True, "the lease was free" if not self._leading else "renewed")
        else:
            self._set(False, "another worker took the lease")
        return self._leading

    async def run(self) -> None:
        """Forever: try at once, then renew every third of the lease while leading, and try
        every half of it (or when poked) while not. Resigns when cancelled while leading."""
        try:
            while True:
                leading = await self.attempt()
                pause = self.renew_every if leading else self.try_every
                if leading:
                    # Wake before the lease runs out by this clock, even if a renewal is slow.
                    pause = min(pause, max(0.0, self._until - time.monotonic()))
                await wait_event(self._poked, pause)
                self._poked.clear()
        finally:
            await asyncio.shield(self.resign())

    async def resign(self) -> None:
        """Give the lease up (a worker stopping): another worker takes it now."""
        if not self._leading:
            return
        self._leading = False
        try:
            await self.db.one("leader_resign", name=self.name, worker_id=self.worker_id)
        except DatabaseError as exc:  # it expires anyway
            log.info("could not give up the leader lease (%s); it expires in %.0f s", exc,
                     self.lease_seconds)
        self.changed(False)
