"""Forecasts: when will a running execution finish? (The in-flight twin of a plan.)

A plan (:mod:`konduit.observe.plan`) predicts an execution that has not started: every step weighs
the quantile of its span in history, and the execution lasts as long as its longest path. A
forecast does the same for an execution that is already running, from what it has done so far:

- a step that has **ended** weighs nothing more: it finished at its ``ended_at``;
- a step whose join has **fired** (its tasks exist) finishes at ``fired_at`` + its quantile, but
  never before now: a step already past its usual span is at least still running;
- a step still **waiting** starts when its last upstream finishes (or now, if that is past) and
  takes its quantile.

The execution finishes when its last step does. The same history (``load_durations``, the
spans of ``konduit plan``) and the same approximations apply: quantiles summed along a path, every
join waiting for all its branches (a conservative bound for ``quorum`` and for optional branches
under ``Join.required()``), steps without history weighing nothing.

The quantiles themselves (:class:`StepQuantiles`, read by
:func:`konduit.engine.spans.load_durations`) are the data plans weigh steps by too
(:mod:`konduit.observe.plan`). Everything here is pure; :mod:`konduit.engine.alerting` loads the
rows and calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from konduit.core.durations import Duration, parse_duration
from konduit.core.workflow import WorkflowSpec
from konduit.errors import KonduitError, PlanError

Quantile = Literal["p50", "p95", "p99"]
QUANTILES: tuple[Quantile, ...] = ("p50", "p95", "p99")
_BY_FRACTION: dict[float, Quantile] = {0.5: "p50", 0.95: "p95", 0.99: "p99"}

DEFAULT_HISTORY = "7d"
"""How far back the spans of plans and forecasts are read by default."""


@dataclass(frozen=True)
class StepQuantiles:
    """How long one step took in recent executions: quantiles of its span, in seconds."""

    p50: float
    p95: float
    p99: float
    samples: int
    degraded: int = 0  # how many of the samples ended degraded (at their deadline, usually)

    def at(self, quantile: Quantile | float) -> float:
        return float(getattr(self, quantile_name(quantile)))


def quantile_name(quantile: Quantile | float) -> Quantile:
    """``"p95"`` for ``"p95"`` or ``0.95``."""
    if isinstance(quantile, str) and quantile in QUANTILES:
        return quantile
    if isinstance(quantile, float | int) and not isinstance(quantile, bool):
        found = _BY_FRACTION.get(float(quantile))
        if found is not None:
            return found
    raise PlanError(f"a plan knows the quantiles p50, p95 and p99 (or 0.5, 0.95, 0.99), "
                    f"not {quantile!r}")


def history_seconds(history: Duration) -> float:
    """``--history`` in seconds (a :class:`PlanError` when it is not a duration)."""
    try:
        return parse_duration(history, what="--history")
    except KonduitError as exc:
        raise PlanError(str(exc)) from None


ENDED = frozenset({"succeeded", "degraded", "timed_out", "failed", "cancelled", "skipped"})
"""Step statuses after which a step adds nothing to an execution's duration."""


@dataclass(frozen=True)
class StepProgress:
    """Where one step of a running execution stands (a row of ``konduit_steps``)."""

    status: str
    fired_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED


@dataclass(frozen=True)
class Forecast:
    """A running execution's predicted finish at one quantile."""

    quantile: Quantile
    finish_at: datetime
    path: tuple[str, ...]  # the unfinished steps on the way to the predicted finish, in order
    no_history: tuple[str, ...]  # unfinished steps without history: they weigh nothing

    def slack_seconds(self, window: datetime) -> float:
        """Seconds from the predicted finish to ``window``: negative means late."""
        return (window - self.finish_at).total_seconds()

    def to_json(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "finish_at": self.finish_at.isoformat(),
                "path": list(self.path), "no_history": list(self.no_history)}


def forecast(
    spec: WorkflowSpec,
    progress: Mapping[str, StepProgress],
    durations: Mapping[str, StepQuantiles],
    *,
    now: datetime,
    quantile: Quantile | float = "p95",
) -> Forecast:
    """When the execution of ``spec`` whose steps stand as in ``progress`` finishes, if every
    step still to run takes its ``quantile`` of ``durations`` (see the module's rules).

    A step missing from ``progress`` has not been created yet: it is waiting. The finish is never
    before ``now``: a running execution has not finished yet. Pure: no I/O, no clock."""
    name = quantile_name(quantile)
    finish: dict[str, datetime] = {}
    via: dict[str, str | None] = {}
    for step in spec.order:
        state = progress.get(step, StepProgress("waiting"))
        weight = timedelta(seconds=max(0.0, durations[step].at(name))) if step in durations \
            else timedelta(0)
        best: str | None = None
        for up in spec[step].after:
            if best is None or finish[up] > finish[best]:
                best = up
        if state.ended:
            # An ended step without an end time (never fired, skipped) ends with its upstream.
            ended = state.ended_at or state.fired_at
            finish[step] = ended if ended is not None else \
                (finish[best] if best is not None else now)
            via[step] = None
        elif state.fired_at is not None:
            finish[step] = max(state.fired_at + weight, now)
            via[step] = None
        else:
            start = max(finish[best], now) if best is not None else now
            finish[step] = start + weight
            via[step] = best
    last = max(spec.order, key=lambda s: finish[s])  # first of the latest, in topological order
    path: list[str] = []
    node: str | None = last
    while node is not None:
        if not progress.get(node, StepProgress("waiting")).ended:
            path.append(node)
        node = via[node]
    path.reverse()
    unknown = tuple(s for s in spec.order if s not in durations
                    and not progress.get(s, StepProgress("waiting")).ended)
    return Forecast(name, max(finish[last], now), tuple(path), unknown)
