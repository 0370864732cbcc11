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
from konduit.errors import KonduitError, NotForkable
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
    return plan_rerun(spec, statuses, routes, bad)


def plan_rerun(
    spec: WorkflowSpec,
    statuses: Mapping[str, str],
    routes: Mapping[str, frozenset[str] | None],
    bad: set[str],
    what: str = "repair",
) -> RepairPlan:
    """The plan that runs ``bad`` and every step downstream of them again, the other steps
    keeping their outcome (``statuses``) and routing choice (``routes``): the decision a repair,
    a redrive and a fork (:func:`plan_fork`) share. ``what`` names the operation in a refusal."""
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
                    f"cannot {what} step {name!r}: its join policy ({step.join.kind}) says "
                    f"{verdict} with the upstream outcomes that stand"
                )
            if step.is_map:
                state = replace(state, status=StepStatus.ACTIVE)
            else:
                state = replace(state, status=StepStatus.ACTIVE, tasks_total=1, tasks_pending=1)
            start.append(name)
        states[name] = state
    return RepairPlan(order, states, tuple(start))


FORK_KEEPS = OK_OUTCOMES
"""The outcomes of an origin's steps a fork copies: succeeded, and degraded (its fallback
payload is copied as it stands, as a redrive keeps it)."""


@dataclass(frozen=True)
class ForkPlan:
    copied: tuple[str, ...]  # the ancestors of from_step, in topological order
    plan: RepairPlan  # every other step, with the join state it starts from


def ancestors(spec: WorkflowSpec, step: str) -> set[str]:
    """Every step ``step`` depends on, directly or through others (not ``step`` itself)."""
    seen: set[str] = set()
    todo = list(spec[step].after)
    while todo:
        up = todo.pop()
        if up not in seen:
            seen.add(up)
            todo.extend(spec[up].after)
    return seen


def plan_fork(
    spec: WorkflowSpec,
    statuses: Mapping[str, str],
    routes: Mapping[str, frozenset[str] | None],
    from_step: str,
) -> ForkPlan:
    """A fork from ``from_step``: its ancestors (the steps it depends on, directly or not; not
    merely the steps before it in some order) are copied with the outcome they had in the
    origin (``statuses``), which must be succeeded or degraded for each; ``from_step`` and every
    other step run as in a new execution, their join state built by :func:`plan_rerun` exactly
    as a repair builds it (copied upstreams count with their outcome, the others as pending).
    Raises :class:`KonduitError` naming ``from_step`` when the workflow has no such step, and
    :class:`~konduit.NotForkable` naming the ancestor that did not succeed."""
    if from_step not in spec.steps:
        raise KonduitError(
            f"workflow {spec.name!r} version {spec.version} has no step {from_step!r} to fork "
            f"from (its steps: {', '.join(spec.order)})")
    copied = ancestors(spec, from_step)
    for name in spec.order:
        if name in copied and statuses.get(name) not in FORK_KEEPS:
            raise NotForkable(
                f"cannot fork from step {from_step!r}: its upstream step {name!r} is "
                f"{statuses.get(name) or 'not started'} in the origin (every step it depends "
                f"on must have succeeded or degraded; fork from an earlier step)")
    rest = {n for n in spec.order if n not in copied}
    return ForkPlan(tuple(n for n in spec.order if n in copied),
                    plan_rerun(spec, statuses, routes, rest, what="fork"))
