"""The budgets a plan predicts: what each step with a deadline would get in an execution with
the plan's start and window, and whether the window would cut it (``konduit plan``).

The engine cuts a branch's budget when its task is created (:mod:`konduit.engine.deadlines`);
a plan predicts that moment as the step's p95 start (its upstream's p95 critical path from the
plan's start), with the same pure rule (:func:`konduit.core.budgets.window_budget`) and the same
reserve (the p95 critical path downstream of the step, from the spans the plan shows). A step's
own budget, before any window, is read by :func:`konduit.reads.analytics.own_budgets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from konduit.core.budgets import Budget, downstream_reserves, minimum_budget, window_budget
from konduit.core.durations import format_elapsed
from konduit.core.workflow import WorkflowSpec
from konduit.observe.plan import Plan


def plan_budgets(spec: WorkflowSpec, plan: Plan, own: Mapping[str, float]) -> dict[str, Budget]:
    """Per step with a deadline (``own``: its own budget): the budget an execution following
    ``plan`` would give its task. Pure."""
    p95 = {name: d.p95 for name, d in plan.durations.items()}
    reserves = downstream_reserves(spec, p95)
    starts: dict[str, float] = {}
    finish: dict[str, float] = {}
    for step in spec.order:
        starts[step] = max((finish[up] for up in spec[step].after), default=0.0)
        finish[step] = starts[step] + max(0.0, p95.get(step, 0.0))
    window_seconds = None if plan.window is None else (plan.window - plan.start).total_seconds()
    out: dict[str, Budget] = {}
    for name, seconds in own.items():
        deadline = spec[name].deadline
        if deadline is None:
            continue
        left = None if window_seconds is None else window_seconds - starts[name]
        out[name] = window_budget(seconds, window_left=left, reserve=reserves[name],
                                  minimum=minimum_budget(deadline, seconds))
    return out


def budget_text(step: str, b: Budget) -> str:
    """One line (Rich markup) on a step's budget."""
    from rich.markup import escape

    if not b.cut:
        return f"{escape(step)}: {format_elapsed(b.seconds)}"
    assert b.reserve is not None
    return (f"{escape(step)}: [yellow]{format_elapsed(b.seconds)}, budget cut by the window[/yellow]"
            f" (its own {format_elapsed(b.own)}; {format_elapsed(b.reserve)} kept for the steps "
            f"after it)")


def budget_renderables(found: Mapping[str, Budget]) -> list[Any]:
    """The plan's lines on budgets: one per step with a deadline, in the order given."""
    if not found:
        return []
    return ["budgets (deadline per branch, from its first attempt):",
            *(f"  {budget_text(step, b)}" for step, b in found.items())]
