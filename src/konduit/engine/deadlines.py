"""A task's time budget: static, or adaptive from its step's own latency history (by default
"1.5x the p99 from the last 7 days, clamped between 10s and 45s"), cut by its execution's
window when the steps after it would not fit otherwise (:mod:`konduit.core.budgets`).

Budgets are resolved when a task is created. A task's ``deadline_seconds`` is its budget; the
deadline itself (``deadline_at``) is set at its first claim, from then on, unless the window cut
the budget: a window is a moment, so a cut task's ``deadline_at`` is set at once (creation +
budget), and the cut is recorded (``deadline_uncut_seconds``: the step's own budget,
``deadline_reserve_seconds``: the reserve kept free after its deadline) for ``konduit plan``
and the execution page.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from konduit.core.budgets import Budget, Overheads, Reserve, downstream_reserves, window_budget
from konduit.core.policies import Deadline
from konduit.core.workflow import StepSpec, WorkflowSpec
from konduit.db.database import Row

MIN_SAMPLES = 20
"""Below this many successful runs in the window, history is thin and the default applies."""
MAX_SAMPLES = 1000
"""The adaptive quantile is taken over at most this many of the step's most recent successful
tasks in its window: the read stays an index range scan of bounded size however big the
history (``konduit_tasks_succeeded_by_step``), and the p99 of the last thousand runs is what a
deadline should follow anyway."""
RESERVE_HISTORY = 7 * 86400.0
"""Seconds of history the window reserve (p99 spans and overheads) is read over: the plan's
default."""
OVERHEAD_EXECUTIONS = 500
"""The window reserve's overheads are read over at most this many of the workflow's newest
succeeded executions (a bounded read, like :data:`MAX_SAMPLES`)."""
OVERHEAD_MIN_SAMPLES = 3
"""Below this many samples, an overhead takes its default (:class:`Overheads`)."""


def overheads_from(row: Row | None) -> Overheads:
    """The overheads a ``workflow_overhead_quantiles`` row measured; each part with fewer than
    :data:`OVERHEAD_MIN_SAMPLES` samples keeps its default."""
    default = Overheads()
    if row is None:
        return default

    def part(name: str) -> float:
        value = row[name]
        if value is None or int(row[f"{name}_samples"]) < OVERHEAD_MIN_SAMPLES:
            return float(getattr(default, name))
        return max(0.0, float(value))

    return Overheads(fallback=part("fallback"), dispatch=part("dispatch"), finish=part("finish"))


class _Reads(Protocol):
    """A transaction or a database: anything that runs a named query."""

    async def one(self, query: str, /, **params: object) -> Row | None: ...

    async def all(self, query: str, /, **params: object) -> list[Row]: ...


def adaptive_budget(deadline: Deadline, quantile_seconds: float | None, samples: int) -> float | None:
    """factor x quantile of the step's successful durations, clamped to [floor, ceiling]; while
    history is thin, the default (else the ceiling). Always a budget for an adaptive deadline;
    a static one returns its seconds."""
    if not deadline.adaptive_:
        return deadline.seconds
    if quantile_seconds is None or samples < MIN_SAMPLES:
        return deadline.thin_history_budget
    budget = max(deadline.factor * float(quantile_seconds), deadline.floor)
    if deadline.ceiling is not None:
        budget = min(budget, deadline.ceiling)
    return budget


class BudgetCache:
    """Adaptive budgets and window reserves change slowly: compute each at most once per ``ttl``
    per process, so the fan-in transaction rarely pays for the percentile queries."""

    def __init__(self, ttl: float = 30.0):
        self.ttl = ttl
        self._cache: dict[tuple[str, str, Deadline], tuple[float, float | None]] = {}
        self._reserves: dict[tuple[str, str], tuple[float, dict[str, Reserve]]] = {}

    def clear(self) -> None:
        """Forget every cached budget and reserve (tests that write history by hand)."""
        self._cache.clear()
        self._reserves.clear()

    async def budget(self, tx: _Reads, workflow: str, step: str, deadline: Deadline | None
                     ) -> float | None:
        """The step's own budget in seconds (None: the step has no deadline)."""
        if deadline is None:
            return None
        if not deadline.adaptive_:
            return deadline.seconds
        key = (workflow, step, deadline)
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        row = await tx.one(
            "step_duration_quantile",
            workflow_name=workflow,
            step=step,
            quantile=deadline.quantile,
            window_seconds=deadline.window,
            max_samples=MAX_SAMPLES,
        )
        seconds = row["seconds"] if row else None
        samples = int(row["samples"]) if row else 0
        value = adaptive_budget(deadline, seconds, samples)
        self._cache[key] = (now, value)
        return value

    async def reserves(self, tx: _Reads, spec: WorkflowSpec) -> dict[str, Reserve]:
        """Per step of ``spec``: what a window keeps free after its deadline
        (:class:`~konduit.core.budgets.Reserve`): the p99 of the critical path downstream of it,
        from the span history ``konduit plan`` reads (``step_span_quantiles_by_workflow``), and
        the workflow's measured overheads (``workflow_overhead_quantiles``)."""
        key = (spec.name, spec.spec_hash)
        hit = self._reserves.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        rows = await tx.all("step_span_quantiles_by_workflow", workflow_name=spec.name,
                            history_seconds=RESERVE_HISTORY)
        tails = downstream_reserves(spec, {r["step"]: float(r["p99"]) for r in rows})
        overheads = overheads_from(await tx.one(
            "workflow_overhead_quantiles", workflow_name=spec.name,
            history_seconds=RESERVE_HISTORY, max_executions=OVERHEAD_EXECUTIONS))
        value = {step: Reserve.of(tails[step], overheads, final=not spec.downstream[step])
                 for step in spec.order}
        self._reserves[key] = (now, value)
        return value


budgets = BudgetCache()


async def task_budgets(
    tx: _Reads, spec: WorkflowSpec, steps: Sequence[StepSpec], window_left: float | None
) -> list[Budget | None]:
    """The budget of each step's new task: its own, cut by the execution's window when
    ``window_left`` (seconds to its ``deadline_at``) is given (see
    :func:`konduit.core.budgets.window_budget`); None for a step without a deadline."""
    own = [await budgets.budget(tx, spec.name, s.name, s.deadline) for s in steps]
    reserves = await budgets.reserves(tx, spec) if window_left is not None and any(
        o is not None for o in own) else {}
    out: list[Budget | None] = []
    for step, seconds in zip(steps, own, strict=True):
        if seconds is None or step.deadline is None:
            out.append(None)
        elif window_left is None:
            out.append(Budget(seconds, seconds))
        else:
            out.append(window_budget(seconds, window_left=window_left,
                                     reserve=reserves[step.name]))
    return out


def cut_columns(found: Sequence[Budget | None]) -> dict[str, list[float | None]]:
    """The ``deadline_uncut_seconds``/``deadline_reserve_seconds`` parameters of a task insert:
    set only for budgets the window cut."""
    return {
        "deadline_uncuts": [b.own if b is not None and b.cut else None for b in found],
        "deadline_reserves": [b.reserve if b is not None and b.cut else None for b in found],
    }
