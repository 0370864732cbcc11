"""A task's time budget: static, or adaptive from its step's own latency history (seed 004:
"1.5x the p99 from the last 7 days, clamped between 10s and 45s")."""

from __future__ import annotations

import time

from konduit.core.policies import Deadline
from konduit.db.database import Tx

MIN_SAMPLES = 20
"""Below this many successful runs in the window, history is thin and the default applies."""


def adaptive_budget(deadline: Deadline, quantile_seconds: float | None, samples: int) -> float | None:
    """factor x quantile of the step's successful durations, clamped to [floor, ceiling]; while
    history is thin, the default (or else the ceiling, or no deadline at all)."""
    if not deadline.adaptive_:
        return deadline.seconds
    if quantile_seconds is None or samples < MIN_SAMPLES:
        return deadline.default if deadline.default is not None else deadline.ceiling
    budget = deadline.factor * quantile_seconds
    budget = max(budget, deadline.floor)
    if deadline.ceiling is not None:
        budget = min(budget, deadline.ceiling)
    return budget if budget > 0 else None


class BudgetCache:
    """Adaptive budgets change slowly: compute each at most once per ``ttl`` per process, so the
    fan-in transaction rarely pays for the percentile query."""

    def __init__(self, ttl: float = 30.0):
        self.ttl = ttl
        self._cache: dict[tuple[str, str], tuple[float, float | None]] = {}

    async def budget(self, tx: Tx, workflow: str, step: str, deadline: Deadline | None) -> float | None:
        if deadline is None:
            return None
        if not deadline.adaptive_:
            return deadline.seconds
        key = (workflow, step)
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        row = await tx.one(
            "step_duration_quantile",
            workflow_name=workflow,
            step=step,
            quantile=deadline.quantile,
            window_seconds=deadline.window,
        )
        seconds = row["seconds"] if row else None
        samples = int(row["samples"]) if row else 0
        value = adaptive_budget(deadline, seconds, samples)
        self._cache[key] = (now, value)
        return value


budgets = BudgetCache()
