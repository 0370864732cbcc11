"""Whether a worker has its database, and how its calls get through an outage.

A worker rescues other workers' tasks only after a full lease of being connected
(:attr:`Connectivity.may_rescue`): by then every live worker's heartbeat has landed since the
outage, so the leases still expired belong to dead workers, and an outage is never charged to
live ones. :func:`retrying` runs a database call until the server answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from konduit.errors import DatabaseConflict, DatabaseUnavailable, PoolExhausted

log = logging.getLogger("konduit.worker")
T = TypeVar("T")


class Connectivity:
    """When this worker last (re)gained the database, as its calls see it."""

    def __init__(self, lease_seconds: float):
        self.lease_seconds = lease_seconds
        self._since: float | None = None

    def connected(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def disconnected(self) -> None:
        self._since = None

    @property
    def may_rescue(self) -> bool:
        """Connected for at least a lease: long enough for every live worker's heartbeat to have
        landed since the outage, so the leases still expired belong to dead workers."""
        since = self._since
        return since is not None and time.monotonic() - since >= self.lease_seconds


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
            delay = min(delay * 2, 5.0)
