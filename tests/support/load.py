"""How overloaded the machine is right now, for the few tests whose point is a time bound.

Most tests wait for an event (:mod:`tests.support.waiting`) and bound only a hang. A test whose
promise *is* a time ("the join fires within half a second of its deadline") keeps its bound,
stretched by the machine's measured overload: on a machine that other processes overload (the
README's ``pytest`` beside other suites, load 15-22 on 2 cores), every step of the engine waits
for a core, and a bound made for an idle machine fails without any bug. The stretch is capped
(``cap``) below what the bug the test catches would take, so the test can still fail.

The measure is direct: a short busy loop (a few ms of CPU) is timed against the CPU time it got;
wall / CPU is how many times longer any CPU work of this process takes now (1.0 on an idle
machine, ~10-16 with ``stress --cpu 14`` on 2 cores). A short sleep's lateness is not used: the
scheduler wakes a sleeper at once (it measured < 1 ms late at load 18), then makes it wait for
the core like everyone else. The 1-minute load average per core covers the recent past (a test
that ran in a burst that is over now).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from types import TracebackType

__all__ = ["Overload", "overload", "scaled"]


def _busy_ratio(cpu_seconds: float = 0.003) -> float:
    """Wall time over CPU time of a busy loop that burns ``cpu_seconds`` of this thread's CPU."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.thread_time() - cpu < cpu_seconds:
        pass
    return (time.perf_counter() - wall) / max(time.thread_time() - cpu, 1e-9)


def _load_per_core() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return 1.0


def overload(samples: int = 9) -> float:
    """How many times slower than on an idle machine this process's work runs right now: the
    larger of the busy loop's wall/CPU ratio (the median of ``samples``) and the load average
    per core; never below 1."""
    measured = statistics.median(_busy_ratio() for _ in range(samples))
    return max(1.0, measured, _load_per_core())


def scaled(bound: float, cap: float, factor: float | None = None) -> float:
    """``bound`` (seconds, as on an idle machine) stretched by ``factor`` (default: the
    :func:`overload` now), but never past ``cap``: the lateness the bug under test would show,
    so a stretched bound still catches it."""
    return min(bound * (overload() if factor is None else factor), cap)


class Overload:
    """Watches the overload through a block: a thread takes an :func:`overload` sample every
    ``every`` seconds; :attr:`factor` is the worst seen (a test's slow moment is when the bound
    is met or missed, not the moment it asserts)."""

    def __init__(self, every: float = 0.5):
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="overload-watch", daemon=True)

    def _watch(self) -> None:
        while True:
            self.samples.append(overload(samples=3))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> Overload:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(overload())

    @property
    def factor(self) -> float:
        return max(self.samples, default=1.0)

    def scaled(self, bound: float, cap: float) -> float:
        """``bound`` stretched by the worst overload seen, at most ``cap`` (see :func:`scaled`)."""
        return scaled(bound, cap, self.factor)
