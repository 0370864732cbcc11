"""Flow control of a step across all workers: ``concurrency=N`` and ``rate="N/s"``.

Pure parts only: reading and checking the options at definition time, and the sliding-window
rule the claim applies (``task_claim_batch_flow_limited`` does it in SQL, under the step's row
lock; :func:`rate_allowance` states the same rule for tests and readers).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|m|h)\s*$")
_PERIOD = {"s": 1.0, "m": 60.0, "h": 3600.0}

MAX_RATE_COUNT = 10_000
"""Most starts a rate may allow per interval: the window keeps one timestamp per start, in the
step's row, rewritten by every claim of the step (use a longer interval's smaller count, or
``concurrency=``, above it)."""


@dataclass(frozen=True)
class FlowLimit:
    """A step's fleet-wide limits: at most ``concurrency`` running tasks, and at most
    ``rate_count`` starts (claims, retries included) in any ``rate_seconds``."""

    concurrency: int | None = None
    rate_count: int | None = None
    rate_seconds: float | None = None

    @property
    def rate(self) -> str | None:
        """The rate as written (``"4/s"``), or None."""
        if self.rate_count is None or self.rate_seconds is None:
            return None
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}[self.rate_seconds]
        return f"{self.rate_count}/{unit}"


def parse_flow_limit(concurrency: object, rate: object) -> FlowLimit | None:
    """Check ``step(concurrency=, rate=)``; None when neither is set.

    Raises ValueError with a message meant to follow "step 'x': "."""
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
    rate_count: int | None = None
    rate_seconds: float | None = None
    if rate is not None:
        match = _RATE.match(rate) if isinstance(rate, str) else None
        if match is None:
            raise ValueError(f"rate must look like '10/s', '100/m' or '1000/h', got {rate!r}")
        rate_count, rate_seconds = int(match.group(1)), _PERIOD[match.group(2)]
        if not 1 <= rate_count <= MAX_RATE_COUNT:
            raise ValueError(
                f"rate {rate!r}: the count must be between 1 and {MAX_RATE_COUNT} per interval"
            )
    if concurrency is None and rate_count is None:
        return None
    return FlowLimit(concurrency, rate_count, rate_seconds)


def rate_allowance(starts: Sequence[float], now: float, count: int, seconds: float) -> int:
    """How many tasks may start at ``now`` given the latest ``starts`` (times, oldest first):
    ``count`` minus the starts in the window ``(now - seconds, now]``. Starting that many at
    ``now`` keeps every half-open window of ``seconds`` at ``count`` starts or fewer."""
    recent = sum(1 for at in starts if at > now - seconds)
    return max(0, count - recent)


def record_starts(starts: Sequence[float], now: float, started: int, count: int) -> list[float]:
    """The window after ``started`` tasks started at ``now``: only the latest ``count`` starts
    matter to later decisions, so no more are kept."""
    return [*starts, *([now] * started)][-count:] if count else []
