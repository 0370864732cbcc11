"""Analysis of the stored history: ``konduit stats`` (branches and joins, the fan-in alerts),
``konduit plan`` (a workflow's critical path and its window's risk) and the budgets a plan
predicts from (:func:`own_budgets`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from konduit.core.budgets import Reserve
from konduit.core.durations import Duration
from konduit.core.workflow import WorkflowSpec
from konduit.engine.deadlines import budgets
from konduit.observe.plan import Plan, load_plan
from konduit.observe.stats import Stats, load_stats
from konduit.reads.base import ReadBase


class AnalyticsReads(ReadBase):
    """The analyses of history: stats, plans, budgets."""

    async def stats(self, workflow: str | None = None, *, history: Duration = "24h",
                    fan_in_alert: Duration = "20s", consecutive: int = 2) -> Stats:
        """``konduit stats``: per branch and join over ``history``, with the fan-in alerts."""
        return await self.reads.call(lambda db: load_stats(
            db, workflow, history=history, fan_in_alert=fan_in_alert, consecutive=consecutive))

    async def plan(self, spec: WorkflowSpec, *, history: Duration = "7d",
                   start: datetime | None = None, window: datetime | None = None) -> Plan:
        """``konduit plan``: ``spec``'s critical path from its history, and the window's risk."""
        return await load_plan(self.db, spec, history=history, start=start, window=window)

    async def own_budgets(self, spec: WorkflowSpec) -> dict[str, float]:
        """The budget each step with a deadline would get now, before any window."""
        return await own_budgets(self.db, spec)

    async def window_reserves(self, spec: WorkflowSpec) -> dict[str, Reserve]:
        """What a window keeps free after each step's deadline now (the engine's reserves)."""
        return await budgets.reserves(self.db, spec)


async def own_budgets(db: Any, spec: WorkflowSpec) -> dict[str, float]:
    """The budget each step with a deadline would get now, before any window (static, or
    adaptive from its history: :class:`konduit.engine.deadlines.BudgetCache`)."""
    found: dict[str, float] = {}
    for name in spec.order:
        value = await budgets.budget(db, spec.name, name, spec[name].deadline)
        if value is not None:
            found[name] = value
    return found
