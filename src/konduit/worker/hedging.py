"""The worker's side of hedged attempts: which steps to hedge after how long, and when to look.

A worker that has slots free after its claim asks :meth:`Hedger.claim` for hedges; it looks at
most once per :attr:`Hedger.poll` seconds. Thresholds of ``hedge="pNN"`` steps come from their
history (:func:`konduit.core.hedging.threshold`), read again every :data:`REFRESH_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from konduit.core.hedging import HISTORY_SECONDS, Hedge, threshold
from konduit.core.model import TaskAttempt
from konduit.db.database import Database
from konduit.engine import transitions
from konduit.engine.registry import Registry, workflow_key
from konduit.errors import DatabaseError
from konduit.worker.config import WorkerConfig

log = logging.getLogger(__name__)

REFRESH_SECONDS = 60.0
"""How long a history-based threshold is used before it is read again."""
MIN_POLL = 0.1
"""The most often a worker with free slots looks for stragglers (seconds between looks)."""


class Hedger:
    """Hedge claims for one worker: the hedged steps it serves and their thresholds."""

    def __init__(self, db: Database, registry: Registry, config: WorkerConfig, *,
                 looked: Callable[[], None] = lambda: None):
        self.db = db
        self.config = config
        self.looked = looked  # called after each look that ran to its end (Worker.passes)
        self.steps: list[tuple[str, str, Hedge]] = [
            (workflow_key(spec.name, spec.version), step.name, step.hedge)
            for spec in registry
            for step in spec.steps.values()
            if step.hedge is not None and step.queue in config.queues
        ]
        self._thresholds: dict[tuple[str, str], float | None] = {}
        self._read_at: dict[tuple[str, str], float] = {}
        self._next_look = 0.0
        self.started = 0  # hedges this worker claimed

    @property
    def enabled(self) -> bool:
        return bool(self.steps)

    @property
    def poll(self) -> float:
        """Seconds between looks: a quarter of the shortest threshold known, within
        [:data:`MIN_POLL`, the worker's poll interval]."""
        known = [t for t in self._thresholds.values() if t is not None]
        known += [h.seconds for _, _, h in self.steps if h.seconds is not None]
        if not known:
            return self.config.poll_interval
        return max(MIN_POLL, min(self.config.poll_interval, min(known) / 4))

    async def thresholds(self) -> list[tuple[str, str, float]]:
        """(``name@version``, step, seconds) of every hedged step that hedges now."""
        now = time.monotonic()
        plan: list[tuple[str, str, float]] = []
        for workflow, step, hedge in self.steps:
            key = (workflow, step)
            if hedge.quantile is not None and now - self._read_at.get(key, -1e9) >= REFRESH_SECONDS:
                row = await self.db.one(
                    "step_attempt_quantile_unhedged", quantile=hedge.quantile,
                    window_seconds=HISTORY_SECONDS, workflow=workflow, step=step,
                )
                samples = int(row["samples"]) if row else 0
                seconds = row["seconds"] if row else None
                self._thresholds[key] = threshold(hedge, samples=samples, quantile_seconds=seconds)
                self._read_at[key] = now
                log.debug("hedge threshold of %s/%s: %s (%s samples)", workflow, step,
                          self._thresholds[key], samples)
            seconds_or_none = threshold(hedge) if hedge.seconds is not None \
                else self._thresholds.get(key)
            if seconds_or_none is not None:
                plan.append((workflow, step, seconds_or_none))
        return plan

    async def claim(self, limit: int) -> list[TaskAttempt]:
        """Lease hedges of up to ``limit`` stragglers, if a look is due (else nothing)."""
        now = time.monotonic()
        if not self.steps or limit <= 0 or now < self._next_look:
            return []
        self._next_look = now + self.poll
        try:
            plan = await self.thresholds()
            rows = await transitions.hedge(
                self.db, hedged=plan, limit=limit, lease_seconds=self.config.lease_seconds,
                worker_id=self.config.worker_id,
            )
        except DatabaseError as exc:
            # Never the claim's failure: the tasks it leased must still start. The next look
            # tries again.
            log.warning("looking for stragglers to hedge failed: %s", exc)
            return []
        hedges = [TaskAttempt.from_row(r) for r in rows]
        self.looked()
        for h in hedges:
            log.info("hedging task %s (%s) attempt %s: it is straggling", h.id, h.step, h.attempt)
        self.started += len(hedges)
        return hedges
