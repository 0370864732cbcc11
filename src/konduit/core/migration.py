"""Migrating a running execution to another version of its workflow, as a pure plan.

The rule: a migration is allowed when every step of the execution's past (a step
that started or ended: any task row exists for it, or its step row left ``waiting``) exists in
the target version with the same upstreams and of the same kind. The past then stays valid
under the new DAG: the counters of those steps were counted from the same upstreams. The rest of
the execution follows the target version: the join state of every step that has not started is
rebuilt from its upstreams in the target (outcomes that stand count, the others are pending),
steps that exist only in the old version and never started are dropped, and steps whose join is
already satisfied fire at once.

Both versions are read as :class:`Shape` (steps, edges, joins, kinds) from the spec JSON stored
at registration, so the check needs no workflow code. Nothing here does I/O; the engine
(:mod:`konduit.engine.migration`) loads the state under the execution lock, calls
:func:`plan_migration` and applies the plan in the same transaction. Property-tested in
tests/test_migration_properties.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, cast

from konduit.core.advance import FAILURE_OUTCOMES, OK_OUTCOMES, OUTCOMES, StepState, join_verdict
from konduit.core.model import Outcome, StepStatus
from konduit.core.policies import Join
from konduit.core.workflow import WorkflowSpec
from konduit.errors import MigrationRefused


@dataclass(frozen=True)
class StepShape:
    """What of a step the plan of an execution is made of."""

    name: str
    after: tuple[str, ...]
    join: Join
    required: bool
    kind: str  # "plain", "map", or "wait:<event|timer|child>"

    @property
    def is_map(self) -> bool:
        return self.kind == "map"


@dataclass(frozen=True)
class Shape:
    """A workflow version's DAG, in topological order."""

    name: str
    version: int
    steps: Mapping[str, StepShape]
    order: tuple[str, ...]

    def __getitem__(self, step: str) -> StepShape:
        return self.steps[step]

    def __contains__(self, step: object) -> bool:
        return step in self.steps

    def downstream(self, step: str) -> tuple[str, ...]:
        return self._below.get(step, ())

    @cached_property
    def _below(self) -> dict[str, tuple[str, ...]]:
        # Once per shape, not per call: a join of 10,000 branches would make it quadratic.
        below: dict[str, list[str]] = {}
        for n in self.order:
            for up in dict.fromkeys(self.steps[n].after):
                below.setdefault(up, []).append(n)
        return {n: tuple(d) for n, d in below.items()}

    @classmethod
    def of(cls, spec: WorkflowSpec) -> Shape:
        """The shape of a compiled definition (through its spec JSON: one reading for both)."""
        return cls.from_spec_json(spec.spec_json)

    @classmethod
    def from_spec_json(cls, spec: Mapping[str, Any]) -> Shape:
        """The shape of a definition as stored in ``konduit_workflows.spec``."""
        steps: dict[str, StepShape] = {}
        for raw in spec["steps"]:
            join = raw.get("join") or {}
            wait = raw.get("wait")
            kind = "map" if raw.get("map") else f"wait:{wait['kind']}" if wait else "plain"
            steps[raw["name"]] = StepShape(
                name=raw["name"],
                after=tuple(raw.get("after") or ()),
                join=Join(join.get("kind", "all_succeeded"), join.get("k")),
                required=bool(raw.get("required", True)),
                kind=kind,
            )
        return cls(str(spec["name"]), int(spec["version"]), steps, _topological(steps))


def _topological(steps: Mapping[str, StepShape]) -> tuple[str, ...]:
    """Kahn's order, ties in definition order (the stored spec is in that order already)."""
    below: dict[str, list[str]] = {n: [] for n in steps}
    indegree = {n: 0 for n in steps}
    for s in steps.values():
        for up in dict.fromkeys(s.after):
            below[up].append(s.name)
            indegree[s.name] += 1
    order: list[str] = []
    ready = deque(n for n, d in indegree.items() if d == 0)
    while ready:
        n = ready.popleft()
        order.append(n)
        for d in below[n]:
            indegree[d] -= 1
            if indegree[d] == 0:
                ready.append(d)
    return tuple(order)


@dataclass(frozen=True)
class MigrationPlan:
    """What a migration changes. ``states`` holds the rebuilt join state of every step of the
    target that is not in the past (in topological order); the past keeps its rows as they are."""

    past: frozenset[str]
    added: tuple[str, ...]  # steps only in the target
    dropped: tuple[str, ...]  # steps only in the old version (never started)
    states: dict[str, StepState]
    start: tuple[str, ...]  # steps whose join is satisfied now: their tasks are created
    skipped: tuple[str, ...]  # steps every upstream routed away from: they end skipped now
    steps_pending: int  # steps of the target not ended


def _sorted(names: list[str]) -> str:
    return "[" + ", ".join(repr(n) for n in sorted(names)) + "]"


def incompatibility(old: Shape, new: Shape, past: frozenset[str]) -> MigrationRefused | None:
    """Why the past of an execution of ``old`` is not valid in ``new`` (the first step at
    fault, in ``old``'s order), or None when it is."""
    for name in old.order:
        if name not in past:
            continue
        target = f"version {new.version} of {new.name!r}"
        if name not in new:
            return MigrationRefused(
                f"step {name!r} has started or ended but does not exist in {target}",
                step=name)
        was, now = old[name], new[name]
        if set(was.after) != set(now.after):
            return MigrationRefused(
                f"step {name!r} has started or ended but its upstreams differ in {target}: "
                f"{_sorted(list(was.after))} in version {old.version}, "
                f"{_sorted(list(now.after))} in version {new.version}", step=name)
        if was.kind != now.kind:
            return MigrationRefused(
                f"step {name!r} has started or ended as a {was.kind} step but is a {now.kind} "
                f"step in {target}", step=name)
    return None


def _edge(outcome: str, chosen: frozenset[str] | None, downstream: str) -> str:
    """The outcome an upstream's end counts as on its edge to ``downstream``: a step that
    routed elsewhere skipped it (as :func:`konduit.core.advance.advance` counts it)."""
    if chosen is not None and outcome in OK_OUTCOMES and downstream not in chosen:
        return Outcome.SKIPPED
    return outcome


def plan_migration(
    old: Shape,
    new: Shape,
    statuses: Mapping[str, str],
    past: frozenset[str],
    routes: Mapping[str, frozenset[str] | None],
) -> MigrationPlan:
    """Plan moving a running execution of ``old`` to ``new``. ``statuses`` holds the step
    status of every step of ``old`` (``konduit_steps``), ``past`` the steps that started or
    ended, ``routes`` the routing choice of each step's latest task (None: every edge).

    Raises :class:`MigrationRefused` naming the step at fault: a past step missing or changed
    in ``new``, or a step of ``new`` whose join would fail on the outcomes that stand (the
    migration would fail the execution)."""
    refused = incompatibility(old, new, past)
    if refused is not None:
        raise refused
    status: dict[str, str] = {n: statuses.get(n, StepStatus.WAITING) for n in past}
    for name in new.order:  # the final-step rule of advance(), for steps that end no more
        st = status.get(name)
        if st in FAILURE_OUTCOMES and new[name].required and not new.downstream(name) \
                and old.downstream(name):
            raise MigrationRefused(
                f"step {name!r} ended {st} and is a final step in version {new.version}: "
                "the execution would fail", step=name)
    states: dict[str, StepState] = {}
    start: list[str] = []
    skipped: list[str] = []
    spec = cast(WorkflowSpec, new)  # join_verdict reads .after and .join of new[step]
    for name in new.order:  # topological: every upstream is decided before its downstream
        if name in past:
            continue
        step = new[name]
        state = StepState(up_pending=0)
        for up in step.after:
            outcome = status.get(up, StepStatus.WAITING)
            if outcome not in OUTCOMES:
                state = replace(state, up_pending=state.up_pending + 1)
                continue
            state = state.counted(_edge(outcome, routes.get(up), name), new[up].required)
        verdict = "fire" if not step.after else join_verdict(spec, name, state)
        if verdict == "fire":
            if step.is_map:
                state = replace(state, status=StepStatus.ACTIVE)
            else:
                state = replace(state, status=StepStatus.ACTIVE, tasks_total=1, tasks_pending=1)
            start.append(name)
        elif verdict == "skip":
            state = replace(state, status=StepStatus.SKIPPED)
            skipped.append(name)
        elif verdict == "fail":
            raise MigrationRefused(
                f"step {name!r} of version {new.version} cannot run on the upstream outcomes "
                f"that stand (join policy {step.join.kind}): the execution would fail",
                step=name)
        states[name] = state
        status[name] = state.status
    pending = sum(1 for n in new.order if status[n] not in OUTCOMES)
    return MigrationPlan(
        past=past,
        added=tuple(n for n in new.order if n not in old),
        dropped=tuple(n for n in old.order if n not in new),
        states=states,
        start=tuple(start),
        skipped=tuple(skipped),
        steps_pending=pending,
    )
