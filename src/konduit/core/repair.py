"""Repair and redrive: re-run only the degraded or failed branches of a finished execution,
and what depends on them ("retry the full pipeline once within 24 hours to replace the degraded
version"), as a pure plan the client applies under the execution lock.

Both are one plan with two choices of the steps it re-runs: a repair re-runs every step that
ended degraded, failed, timed out or cancelled (:data:`REPAIRABLE`: it replaces a degraded
output); a redrive re-runs only those that did not succeed at all (:data:`REDRIVABLE`: a
degraded step's fallback payload is kept, as every succeeded output is)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from konduit.core.advance import FAILURE_OUTCOMES, OK_OUTCOMES, StepState, join_verdict
from konduit.core.model import Outcome, StepStatus
from konduit.core.workflow import WorkflowSpec
from konduit.errors import KonduitError
from konduit.errors import NothingToRepair as NothingToRepair

REPAIRABLE = frozenset({Outcome.DEGRADED}) | FAILURE_OUTCOMES
"""The step outcomes a repair re-runs."""
REDRIVABLE = FAILURE_OUTCOMES
"""The step outcomes a redrive re-runs: failed, timed out, cancelled (degraded ones are kept)."""


@dataclass(frozen=True)
class RepairPlan:
    rerun: tuple[str, ...]  # in topological order
    states: dict[str, StepState]  # the rebuilt join state of every re-run step
    start: tuple[str, ...]  # re-run steps whose upstreams all stand: they fire at once


def plan_repair(
    spec: WorkflowSpec,
    statuses: Mapping[str, str],
    routes: Mapping[str, frozenset[str] | None],
    rerun_outcomes: frozenset[str] = REPAIRABLE,
) -> RepairPlan:
    """Which steps to re-run and the join state they restart from: every step whose status is
    one of ``rerun_outcomes`` (:data:`REPAIRABLE` or :data:`REDRIVABLE`) and every step
    downstream of one. Upstreams outside the re-run set keep their outcome (and routing
    choice); upstreams inside it count as pending."""
    bad = {s for s in spec.order if statuses.get(s) in rerun_outcomes}
    if not bad:
        if rerun_outcomes == REDRIVABLE:
            raise NothingToRepair("nothing to redrive: no step ended failed, timed out or "
                                  "cancelled")
        raise NothingToRepair("nothing to repair: no step ended degraded, failed, timed out or cancelled")
    rerun: set[str] = set()
    for name in spec.order:  # topological: upstreams are decided before their downstream
        if name in bad or any(u in rerun for u in spec[name].after):
            rerun.add(name)
    order = tuple(n for n in spec.order if n in rerun)
    states: dict[str, StepState] = {}
    start: list[str] = []
    for name in order:
        step = spec[name]
        state = StepState(up_pending=0)
        for up in step.after:
            if up in rerun:
                state = replace(state, up_pending=state.up_pending + 1)
                continue
            outcome = statuses.get(up, Outcome.SKIPPED)
            chosen = routes.get(up)
            if chosen is not None and outcome in OK_OUTCOMES and name not in chosen:
                outcome = Outcome.SKIPPED
            state = state.counted(outcome, spec[up].required)
        if state.up_pending == 0:
            verdict = "fire" if not step.after else join_verdict(spec, name, state)
            if verdict != "fire":
                raise KonduitError(
                    f"cannot repair step {name!r}: its join policy ({step.join.kind}) says "
                    f"{verdict} with the upstream outcomes that stand"
                )
            if step.is_map:
                state = replace(state, status=StepStatus.ACTIVE)
            else:
                state = replace(state, status=StepStatus.ACTIVE, tasks_total=1, tasks_pending=1)
            start.append(name)
        states[name] = state
    return RepairPlan(order, states, tuple(start))
