"""A worker's arming attempts (wait steps, docs/durable-waits.md): record running -> waiting,
and wake a timer armed here at its own time rather than at a maintenance pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from konduit.core import clock
from konduit.core.model import Completion, Recorded, WaitKind
from konduit.engine.advancer import Advanced
from konduit.engine.waits import arm
from konduit.worker.maintenance import Maintenance

log = logging.getLogger(__name__)


class Arming:
    """Records a worker's arming attempts; ``stopping()`` says when to schedule no more wakes."""

    def __init__(self, maintenance: Maintenance, stopping: Callable[[], bool], *,
                 max_payload_bytes: int):
        self.maintenance = maintenance
        self.stopping = stopping
        self.max_payload_bytes = max_payload_bytes

    async def record(self, completion: Completion) -> tuple[Recorded, Advanced | None]:
        """running -> waiting. A timer armed here is woken by this worker at its time (the
        maintenance sweep of any worker does it otherwise)."""
        m = self.maintenance
        recorded = await arm(m.db, m.registry, completion,
                             max_payload_bytes=self.max_payload_bytes)
        armed = completion.payload
        if recorded[0] is Recorded.WAITING and armed.kind == WaitKind.TIMER:
            delay = armed.delay if armed.delay is not None else \
                (armed.until - clock.now()).total_seconds()
            clock.call_later(max(delay, 0.0) + 0.05, self._wake_waits_soon)
        return recorded

    def _wake_waits_soon(self) -> None:
        if self.stopping():
            return
        job = asyncio.ensure_future(self.maintenance.wake_waits())
        job.add_done_callback(_log_failed_wake)


def _log_failed_wake(job: asyncio.Future[int]) -> None:
    if not job.cancelled() and job.exception() is not None:
        log.info("waking due waits failed (the maintenance sweep retries): %s", job.exception())
