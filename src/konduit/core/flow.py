"""Flow control of a step across all workers: ``concurrency=N`` and ``rate="N/s"``, for the
whole step or per key (``concurrency=Limit(2, key=...)``, ``rate=Rate("10/s", key=...)``).

Pure parts only: reading and checking the options at definition time, and the sliding-window
rule the claim applies (``task_claim_batch_flow_limited`` does it in SQL, under the step's row
lock; :func:`rate_allowance` states the same rule for tests and readers).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from konduit.core.key_paths import KeyPath, key_of

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|m|h)\s*$")
_PERIOD = {"s": 1.0, "m": 60.0, "h": 3600.0}

MAX_RATE_COUNT = 10_000
"""Most starts a rate may allow per interval: the window keeps one timestamp per start, in the
step's row, rewritten by every claim of the step (use a longer interval's smaller count, or
``concurrency=``, above it)."""


@dataclass(frozen=True)
class KeyContext:
    """What a step's limit key function sees: the execution's ``input`` (as handlers see it,
    the declared model's instance when the workflow declares one), and the ``workflow`` and
    ``step`` names. The key is computed once, when the execution starts, for every step with
    per-key limits (so a key cannot depend on an upstream's output)."""

    input: Any
    workflow: str
    step: str


KeyFunction = Callable[[KeyContext], str]
"""A step's limit key as code. A key declared as data instead is text: ``key="input.customer"``
(a :class:`~konduit.core.key_paths.KeyPath`), which every door can compute without the code."""


@dataclass(frozen=True)
class Limit:
    """``step(concurrency=Limit(2, key="input.customer"))``: at most ``count`` running tasks of
    the step per key, across every worker. ``key`` is a path into the execution's input
    (``"input.customer"``: data, so a start from any door computes it, with or without the
    workflow's code) or a function of a :class:`KeyContext` (code: only a process with the
    workflow's code can start it). Without ``key`` it is the step's fleet-wide
    ``concurrency=count``."""

    count: int
    key: KeyFunction | str | None = None


@dataclass(frozen=True)
class Rate:
    """``step(rate=Rate("10/s", key="input.api_key"))``: at most that many starts of the step
    per key in any interval, across every worker. ``key`` is a path into the input or a
    function, as for :class:`Limit`. Without ``key`` it is the step's fleet-wide ``rate=``."""

    rate: str
    key: KeyFunction | str | None = None


@dataclass(frozen=True)
class FlowLimit:
    """A step's fleet-wide limits: at most ``concurrency`` running tasks, and at most
    ``rate_count`` starts (claims, retries included) in any ``rate_seconds``; with ``key``,
    these apply to each key the function returns, not to the whole step."""

    concurrency: int | None = None
    rate_count: int | None = None
    rate_seconds: float | None = None
    key: KeyFunction | KeyPath | None = field(default=None, compare=False)

    @property
    def keyed(self) -> bool:
        """The limits apply per key."""
        return self.key is not None

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
    keys: list[KeyFunction | KeyPath] = []
    if isinstance(concurrency, Limit):
        if concurrency.key is not None:
            keys.append(_key(concurrency.key))
        concurrency = concurrency.count
    if isinstance(rate, Rate):
        if rate.key is not None:
            keys.append(_key(rate.key))
        rate = rate.rate
    if len(keys) == 2 and not (keys[0] is keys[1] or (isinstance(keys[0], KeyPath)
                                                      and keys[0] == keys[1])):
        raise ValueError("concurrency= and rate= per key must use the same key (one key per "
                         "task)")
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
    if len(keys) == 1 and concurrency is not None and rate_count is not None:
        raise ValueError("a step's limits are all per key or all for the whole step: give both "
                         "as konduit.Limit/konduit.Rate with the same key")
    return FlowLimit(concurrency, rate_count, rate_seconds, keys[0] if keys else None)


def _key(key: object) -> KeyFunction | KeyPath:
    found = key_of(key, what="a limit's key")
    assert found is not None
    return found


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
