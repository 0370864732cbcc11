"""The budgets a plan predicts: what each step with a deadline would get in an execution with
the plan's start and window, and whether the window would cut it (``konduit plan``).

The engine cuts a branch's budget when its task is created (:mod:`konduit.engine.deadlines`);
a plan predicts that moment as the step's p95 start (its upstream's p95 critical path from the
plan's start), with the same pure rule (:func:`konduit.core.budgets.window_budget`) and the same
reserve (:class:`~konduit.core.budgets.Reserve`: the p99 critical path downstream of the step and
the workflow's measured overheads, as the engine reads them). A step's own budget, before any
window, is read by :func:`konduit.reads.analytics.own_budgets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from konduit.core.budgets import Budget, Overheads, Reserve, downstream_reserves, window_budget
from konduit.core.durations import format_elapsed
from konduit.core.workflow import WorkflowSpec
from konduit.observe.plan import Plan


def plan_budgets(spec: WorkflowSpec, plan: Plan, own: Mapping[str, float],
                 reserves: Mapping[str, Reserve] | None = None) -> dict[str, Budget]:
    """Per step with a deadline (``own``: its own budget): the budget an execution following
    ``plan`` would give its task, keeping ``reserves`` free after each (the engine's, from
    :meth:`konduit.engine.deadlines.BudgetCache.reserves`; by default the plan's p99 spans with
    the default overheads). Pure."""
    p95 = {name: d.p95 for name, d in plan.durations.items()}
    if reserves is None:
        tails = downstream_reserves(spec, {name: d.p99 for name, d in plan.durations.items()})
        reserves = {step: Reserve.of(tails[step], Overheads(), final=not spec.downstream[step])
                    for step in spec.order}
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
        out[name] = window_budget(seconds, window_left=left, reserve=reserves[name])
    return out


def budget_text(step: str, b: Budget) -> str:
    """One line (Rich markup) on a step's budget."""
    from rich.markup import escape

    if not b.cut:
        return f"{escape(step)}: {format_elapsed(b.seconds)}"
    assert b.reserve is not None
    if b.unkeepable:
        return (f"{escape(step)}: [red]fallback at once: the window leaves no time for it[/red]"
                f" (its own {format_elapsed(b.own)}; {reserve_text(b)} needed after it)")
    return (f"{escape(step)}: [yellow]{format_elapsed(b.seconds)}, budget cut by the window[/yellow]"
            f" (its own {format_elapsed(b.own)}; {reserve_text(b)} kept for what follows it)")


def reserve_text(b: Budget) -> str:
    """The reserve of a cut budget in words, part by part when known."""
    assert b.reserve is not None
    if b.parts is None:
        return format_elapsed(b.reserve)
    r = b.parts
    named = [("fallback", r.fallback), ("dispatch", r.dispatch), ("steps after", r.downstream),
             ("finish", r.finish), ("margin", r.margin)]
    return (f"{format_elapsed(b.reserve)}: "
            + ", ".join(f"{format_elapsed(v)} {what}" for what, v in named if v > 0))


def budget_renderables(found: Mapping[str, Budget]) -> list[Any]:
    """The plan's lines on budgets: one per step with a deadline, in the order given."""
    if not found:
        return []
    return ["budgets (deadline per branch, from its first attempt):",
            *(f"  {budget_text(step, b)}" for step, b in found.items())]
