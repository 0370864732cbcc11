"""asyncio helpers the engine's loops share.

:func:`wait_event` replaces ``asyncio.wait_for(event.wait(), timeout)`` in every loop that runs
until cancelled. On Python 3.11, ``wait_for`` swallows a cancellation that arrives in the same
loop iteration as the event is set (it returns the inner result instead of raising), so a
``while True`` loop around it goes on forever and the worker that cancelled it never stops
(seen as "the test worker did not stop within 40 s" and worker processes that ignored SIGTERM,
under load). ``asyncio.timeout`` keeps the cancellation.
"""

from __future__ import annotations

import asyncio

# The one definition is core's (core imports only core): the same wait, on the real clock.
from konduit.core.clock import wait_for_event as wait_event

__all__ = ["cancelling", "wait_event"]


def cancelling() -> bool:
    """Whether the current task is being cancelled: a loop that logs and goes on after a
    failed round must not go on when the failure was its own cancellation, turned into another
    error on its way up (a driver's, a database error): it would swallow the stop."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
