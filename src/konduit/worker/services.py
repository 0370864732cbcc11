"""The maintenance passes of a worker as services: each with its cadence, its test signal (its
count in :class:`~konduit.worker.passes.Passes`) and its own error handling.

The leader of a deployment (:mod:`konduit.worker.leadership`) runs them; the others run only
the passes that their own wake-ups call for (a repair armed by an execution they finished).
A pass that fails is logged and the next one runs: a database error, a bug in one pass, a
workflow whose code raises, none of them skips the others (they used to share one ``try``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from konduit.aio import cancelling
from konduit.errors import DatabaseError, DatabaseUnavailable, KonduitError
from konduit.worker.connectivity import Connectivity
from konduit.worker.passes import Passes

log = logging.getLogger(__name__)


@dataclass
class Service:
    """One maintenance pass."""

    name: str
    """Its name in :data:`konduit.worker.passes.SERVICES`: what a test waits for."""
    run: Callable[[], Awaitable[object]]
    """One pass."""
    every: float
    """Seconds between two of its passes (at the full passes of the maintenance interval:
    a cadence shorter than the interval is the interval)."""
    due: frozenset[str] = frozenset()
    """Kinds of due times (:data:`konduit.worker.wakeups.KINDS`) that run it in between."""
    enabled: Callable[[], bool] = lambda: True
    """Checked before each pass (rescue waits until the worker may rescue)."""
    own: bool = False
    """A worker that does not lead runs it too, when a due time of its own comes."""
    next_at: float = field(default=0.0, init=False)


async def run_passes(services: Iterable[Service], due: set[str], *, leading: bool,
                     interval: float, passes: Passes, connectivity: Connectivity) -> int:
    """Run each service that ``due`` calls for (``"full"``: the interval's pass; kinds of due
    times), in order, each on its own: one's error is logged and the others go on. Returns how
    many failed."""
    failed = 0
    full = "full" in due
    for service in services:
        now = time.monotonic()
        cadence = full and leading and now >= service.next_at
        woken = bool(service.due & due) and (leading or service.own)
        if not (cadence or woken) or not service.enabled():
            continue
        if cadence:
            # Half an interval early: a cadence of one interval runs at every full pass.
            service.next_at = now + service.every - interval / 2
        try:
            await service.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if cancelling():
                raise  # the stop, turned into another error on its way up: not a failed pass
            if isinstance(exc, DatabaseUnavailable):
                connectivity.disconnected()
            if isinstance(exc, DatabaseError | KonduitError):
                log.warning("maintenance pass %r failed: %s", service.name, exc)
            else:  # a bug in one pass must not stop the others
                log.exception("maintenance pass %r failed", service.name)
        else:
            passes.done(service.name)  # only a pass that ran to its end counts
            continue
        failed += 1
    return failed
