"""Window-aware time budgets (pure): how long a branch may run so that its execution still makes
its window.

A branch with a deadline has a budget of its own (static, or adaptive from its history). When
its execution has a window (``deadline_at``), the branch must also end early enough for
everything after its deadline to happen before the window closes: its budget is the smaller of
its own and the time left in the window minus the **reserve** (:class:`Reserve`), which covers

- ``fallback``: from the branch's deadline to its branch ended (the expiry found, the fallback
  run, the outcome recorded and the join fired), the p99 of the workflow's expired tasks;
- ``dispatch``: the join's task waiting for a worker, the p99 of the workflow's tasks' waits;
- ``downstream``: the p99 of the critical path after the branch (the longest chain of steps
  after it, each weighing the p99 of its span in history, as ``konduit plan`` weighs them);
- ``finish``: from the last step's end to the execution's finish, its p99;
- ``margin``: room for a machine busier than its history (:func:`safety_margin`).

Each part without history takes a default (:class:`Overheads`). So a slow branch degrades early
enough for publish to make the window, not at a deadline that aims at its edge.

**The window wins.** A step's minimum (an adaptive deadline's floor) bounds what its history may
shorten its own budget to, not what a window needs: a window shorter than the floor cuts below
it. When the window leaves nothing (``window_left <= reserve``), the branch gets a token budget
(:data:`IMMEDIATE`): its fallback runs at once, which is the best the window can still get, and
the budget is :attr:`Budget.unkeepable` (the window alert says so at once, not at the miss).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from konduit.core.workflow import WorkflowSpec

IMMEDIATE = 0.001
"""Seconds: the budget of a branch whose window leaves no time at all (a budget is always
positive; the schema checks it): its deadline passes at once and its fallback runs."""

MIN_MARGIN = 0.25
"""Seconds: the least safety margin a reserve keeps (:func:`safety_margin`)."""
MARGIN_FRACTION = 0.1
"""The safety margin's share of the measured parts of a reserve (:func:`safety_margin`)."""


@dataclass(frozen=True)
class Overheads:
    """What happens after a branch's deadline besides the steps after it, in seconds, at their
    p99 over the workflow's recent history (:func:`konduit.engine.deadlines.BudgetCache`); the
    defaults stand in for a part with too little history (a first run)."""

    fallback: float = 0.5  # deadline -> branch ended: expiry found, fallback run, recorded
    dispatch: float = 0.1  # a task created -> claimed by a worker
    finish: float = 0.1  # the last step's end -> the execution's finish

    def to_json(self) -> dict[str, float]:
        return {"fallback": self.fallback, "dispatch": self.dispatch, "finish": self.finish}


def safety_margin(measured: float) -> float:
    """The margin kept on top of the measured parts of a reserve: :data:`MARGIN_FRACTION` of
    them, at least :data:`MIN_MARGIN`. The parts are this machine's own p99s: a margin in
    proportion to them grows with the machine's noise (a busy machine's p99s are long)."""
    return max(MIN_MARGIN, MARGIN_FRACTION * max(0.0, measured))


@dataclass(frozen=True)
class Reserve:
    """The seconds a window keeps free after a branch's deadline, part by part."""

    fallback: float = 0.0
    dispatch: float = 0.0
    downstream: float = 0.0
    finish: float = 0.0
    margin: float = 0.0

    @classmethod
    def of(cls, downstream: float, overheads: Overheads, *, final: bool = False) -> Reserve:
        """The reserve of a branch with ``downstream`` seconds of steps after it (p99 critical
        path) under ``overheads``, with its safety margin. A ``final`` step (nothing after it)
        has no join to dispatch."""
        dispatch = 0.0 if final else max(0.0, overheads.dispatch)
        parts = (max(0.0, overheads.fallback), dispatch, max(0.0, downstream),
                 max(0.0, overheads.finish))
        return cls(*parts, margin=safety_margin(sum(parts)))

    @property
    def seconds(self) -> float:
        return self.fallback + self.dispatch + self.downstream + self.finish + self.margin

    def to_json(self) -> dict[str, float]:
        return {"fallback": self.fallback, "dispatch": self.dispatch,
                "downstream": self.downstream, "finish": self.finish, "margin": self.margin,
                "seconds": self.seconds}


@dataclass(frozen=True)
class Budget:
    """The budget a task gets, and whether (and by how much) its execution's window cut it."""

    seconds: float  # the task's budget
    own: float  # the step's own deadline (static, or adaptive from history)
    cut: bool = False  # True when the window made it shorter than ``own``
    reserve: float | None = None  # seconds kept free after the deadline (with a window)
    window_left: float | None = None  # seconds left in the window when the budget was set
    parts: Reserve | None = None  # what the reserve is made of (with a window)

    @property
    def unkeepable(self) -> bool:
        """The window leaves no time for this branch: even its fallback run at once may not
        let the execution make it."""
        return (self.window_left is not None and self.reserve is not None
                and self.window_left - self.reserve <= IMMEDIATE)

    def to_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "own": self.own, "cut": self.cut,
                "reserve": self.reserve, "window_left": self.window_left,
                "unkeepable": self.unkeepable,
                "parts": None if self.parts is None else self.parts.to_json()}


def window_budget(
    own: float, *, window_left: float | None, reserve: float | Reserve
) -> Budget:
    """A branch's budget: ``min(own, window_left - reserve)``, never below :data:`IMMEDIATE`.

    ``own`` is the step's own budget in seconds (already within its floor and ceiling),
    ``window_left`` the seconds from now to the execution's window (``None``: no window;
    negative: already past) and ``reserve`` what to keep free after the branch's deadline (a
    :class:`Reserve`, or its seconds). The window wins over the step's floor: the floor bounds
    what history may shorten, not what the window needs."""
    if window_left is None:
        return Budget(own, own)
    parts = reserve if isinstance(reserve, Reserve) else None
    kept = max(0.0, reserve.seconds if isinstance(reserve, Reserve) else reserve)
    allowed = max(window_left - kept, min(IMMEDIATE, own))
    if allowed < own:
        return Budget(allowed, own, True, kept, window_left, parts)
    return Budget(own, own, False, kept, window_left, parts)


def downstream_reserves(spec: WorkflowSpec, weights: Mapping[str, float]) -> dict[str, float]:
    """For each step: the longest path strictly after it to a final step, each step on the way
    weighing ``weights[step]`` (its p99 span; a step without history weighs 0). A final step's
    reserve is 0. Like the plan's critical path, a sum of quantiles along a path: a planning
    approximation (see :func:`konduit.observe.plan.critical_path`)."""
    tail: dict[str, float] = {}
    for step in reversed(spec.order):
        tail[step] = max(
            (max(0.0, weights.get(d, 0.0)) + tail[d] for d in spec.downstream[step]),
            default=0.0,
        )
    return tail
