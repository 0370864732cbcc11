"""Window-aware time budgets (pure): how long a branch may run so that its execution still makes
its window.

A branch with a deadline has a budget of its own (static, or adaptive from its history). When
its execution has a window (``deadline_at``), the branch must also end early enough for the
steps after it to run before the window closes: its budget is the smaller of its own and the
time left in the window minus the **reserve**, the p95 of the critical path downstream of it
(the longest chain of steps after it, each weighing the p95 of its span in history, as
``konduit plan`` weighs them). So a slow branch degrades early enough for publish to make the
window, instead of at a deadline that only fits an empty night.

The cut never takes a budget below the step's **minimum** (:func:`minimum_budget`: an adaptive
deadline's floor, else :data:`MIN_WINDOW_BUDGET`, never more than the step's own budget): with
a window already spent, a branch still gets a short real try, not a budget of zero or less.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from konduit.core.policies import Deadline
from konduit.core.workflow import WorkflowSpec

MIN_WINDOW_BUDGET = 1.0
"""Seconds: the least budget a window cut leaves a step with a static deadline (an adaptive
deadline keeps its own floor instead), unless its own budget is shorter still."""


@dataclass(frozen=True)
class Budget:
    """The budget a task gets, and whether (and by how much) its execution's window cut it."""

    seconds: float  # the task's budget
    own: float  # the step's own deadline (static, or adaptive from history)
    cut: bool = False  # True when the window made it shorter than ``own``
    reserve: float | None = None  # the downstream critical path's p95 kept free (with a window)
    window_left: float | None = None  # seconds left in the window when the budget was set

    def to_json(self) -> dict[str, float | bool | None]:
        return {"seconds": self.seconds, "own": self.own, "cut": self.cut,
                "reserve": self.reserve, "window_left": self.window_left}


def minimum_budget(deadline: Deadline, own: float) -> float:
    """The least a window cut leaves: the adaptive floor, else :data:`MIN_WINDOW_BUDGET`;
    never more than ``own`` (a cut never lengthens a budget)."""
    least = deadline.floor if deadline.adaptive_ else MIN_WINDOW_BUDGET
    return min(max(least, 0.0), own)


def window_budget(
    own: float, *, window_left: float | None, reserve: float, minimum: float
) -> Budget:
    """A branch's budget: ``min(own, window_left - reserve)``, never below ``minimum``.

    ``own`` is the step's own budget in seconds, ``window_left`` the seconds from now to the
    execution's window (``None``: no window; negative: already past), ``reserve`` the p95 of the
    critical path downstream of the step (0 for a final step, or without history) and
    ``minimum`` the least budget the cut may leave (:func:`minimum_budget`)."""
    if window_left is None:
        return Budget(own, own)
    reserve = max(0.0, reserve)
    # A budget is always positive (the schema checks it): a minimum of 0 still leaves 1 ms.
    allowed = max(window_left - reserve, min(max(minimum, 0.001), own))
    if allowed < own:
        return Budget(allowed, own, True, reserve, window_left)
    return Budget(own, own, False, reserve, window_left)


def downstream_reserves(spec: WorkflowSpec, weights: Mapping[str, float]) -> dict[str, float]:
    """For each step: the longest path strictly after it to a final step, each step on the way
    weighing ``weights[step]`` (its p95 span; a step without history weighs 0). A final step's
    reserve is 0. Like the plan's critical path, a sum of quantiles along a path: a planning
    approximation (see :func:`konduit.observe.plan.critical_path`)."""
    tail: dict[str, float] = {}
    for step in reversed(spec.order):
        tail[step] = max(
            (max(0.0, weights.get(d, 0.0)) + tail[d] for d in spec.downstream[step]),
            default=0.0,
        )
    return tail
