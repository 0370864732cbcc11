"""The fan-in alert rule, pure: a join whose fan-in wait exceeded a threshold in each of its
last executions (``konduit stats`` shows it, :mod:`konduit.engine.alerting` raises it as the
``fan_in_wait`` alert, :mod:`konduit.observe.stats` reads the waits for the stats)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from konduit.core.durations import Duration, format_duration, format_elapsed, parse_duration
from konduit.errors import KonduitError, StatsError, blamed

DEFAULT_HISTORY = "24h"
"""How far back fan-in waits are read by default."""


@dataclass(frozen=True)
class Wait:
    """One execution's fan-in wait at one join, in seconds."""

    seconds: float
    straggler: str | None = None  # the branch that ended last before the join fired
    waiting: bool = False  # the join has not fired yet: ``seconds`` is the wait so far
    execution_id: str | None = None


@dataclass(frozen=True)
class Alert:
    """A join whose fan-in wait exceeded the threshold in each of its last executions."""

    workflow: str
    join: str
    waits: tuple[Wait, ...]  # the last executions' waits, oldest first
    threshold: float

    @property
    def straggler(self) -> str | None:
        """The most recent straggler known (a join still waiting has none yet)."""
        return next((w.straggler for w in reversed(self.waits) if w.straggler), None)

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "join": self.join, "waits": [w.seconds for w in self.waits],
                "straggler": self.straggler, "still_waiting": self.waits[-1].waiting,
                "executions": [w.execution_id for w in self.waits],
                "threshold_seconds": self.threshold}

    def describe(self) -> str:
        waits = ", ".join(format_elapsed(w.seconds) + (" so far" if w.waiting else "")
                          for w in self.waits)
        straggler = f"; straggler: {self.straggler}" if self.straggler else ""
        return (f"{self.workflow}/{self.join}: fan-in wait above {format_duration(self.threshold)} "
                f"in the last {len(self.waits)} execution(s) ({waits}){straggler}")


def fan_in_alert(waits: Sequence[Wait], *, threshold: float, consecutive: int) -> tuple[Wait, ...] | None:
    """The last ``consecutive`` waits (oldest first, as given) when every one of them exceeded
    ``threshold`` seconds, else None. Fewer executions than ``consecutive`` never alert; one
    fast execution among the last ``consecutive`` resets the count."""
    if consecutive < 1:
        raise blamed(StatsError(f"--consecutive must be at least 1, got {consecutive}"),
                     "consecutive")
    last = tuple(waits[-consecutive:])
    if len(last) < consecutive or any(w.seconds <= threshold for w in last):
        return None
    return last


def fan_in_alerts(
    recent: Mapping[tuple[str, str], Sequence[Wait]], *, threshold: float, consecutive: int
) -> list[Alert]:
    """Apply :func:`fan_in_alert` to every ``(workflow, join)``'s waits (oldest first)."""
    alerts = []
    for (workflow, join), waits in sorted(recent.items()):
        last = fan_in_alert(waits, threshold=threshold, consecutive=consecutive)
        if last is not None:
            alerts.append(Alert(workflow, join, last, threshold))
    return alerts


def seconds_option(value: Duration, what: str) -> float:
    """A duration option in seconds (a :class:`StatsError` naming it when it is not one; its
    ``field`` is the option's name, ``history`` for ``--history``)."""
    try:
        return parse_duration(value, what=what)
    except KonduitError as exc:
        raise blamed(StatsError(str(exc)), what.lstrip("-").replace("-", "_")) from None
