"""Whether a worker has its database, and how its calls get through an outage.

A worker that lost the database rescues other workers' tasks again only after a full lease of
being connected (:attr:`Connectivity.may_rescue`): by then every live worker's heartbeat has
landed since the outage, so the leases still expired belong to dead workers, and an outage is
never charged to live ones. A worker that never lost it saw no outage: it rescues once connected
for a heartbeat interval (a live worker's heartbeat due after an outage that ended just before
this worker came up lands by then), without having lived a lease: when every worker keeps dying
young, their tasks are still rescued. Either way the rescue statement itself judges the holder
gone by the server's clock (its heartbeat older than its lease, or it stopped).
:func:`retrying` runs a database call until the server answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from konduit.errors import DatabaseConflict, DatabaseUnavailable, PoolExhausted

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_MAX_DELAY = 1.0
"""Longest pause between a worker's retries of a database call (and of its claim). A failover
is over the moment the new primary takes writes; a worker that had backed off for 5 or 10 s
would sit idle most of that after it. A failed call is cheap (a refused connection, or a wait
in the pool that is already reconnecting), so retrying every second costs next to nothing."""


class Connectivity:
    """When this worker last (re)gained the database, as its calls see it."""

    def __init__(self, lease_seconds: float, settle_seconds: float | None = None):
        self.lease_seconds = lease_seconds
        self.settle_seconds = lease_seconds if settle_seconds is None else settle_seconds
        self._since: float | None = None
        self._lost = False  # the database failed this worker since it started

    def connected(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def disconnected(self) -> None:
        self._since = None
        self._lost = True

    @property
    def may_rescue(self) -> bool:
        """Connected for a lease since the database was last lost (long enough for every live
        worker's heartbeat to have landed since the outage, so the leases still expired belong
        to dead workers), or, never having lost it, for ``settle_seconds``."""
        since = self._since
        wait = self.lease_seconds if self._lost else self.settle_seconds
        return since is not None and time.monotonic() - since >= wait


async def retrying(make: Callable[[], Awaitable[T]], connectivity: Connectivity) -> T:
    """Run a database call, retrying through outages with backoff. The lease fence makes a late
    write harmless, so retrying until the database answers is always safe. Errors that are not
    about reaching the server are raised: retrying them would loop forever."""
    delay = 0.2
    while True:
        try:
            return await make()
        except (DatabaseUnavailable, DatabaseConflict, PoolExhausted) as exc:
            if isinstance(exc, DatabaseUnavailable):
                connectivity.disconnected()
            log.warning("%s; retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_DELAY)
