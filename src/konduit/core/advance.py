"""The fan-in decision as a pure function.

Given a workflow's spec, the join state of the steps an event touches and the event itself (a task
ended, or a map step learned how many items it has), decide which steps fire now, which end, and
whether the execution is finished. Nothing here does I/O: the database layer loads the state under
the execution lock, calls :func:`advance`, and applies the :class:`Decision` in the same
transaction. Property tests drive it directly.

Join state is kept as counters per step (``up_pending``, ``up_ok``...), updated once per upstream
step that ends, so a completion costs O(1) however wide the join is; the siblings themselves are
never re-read to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from konduit.core.model import ExecutionStatus, Outcome, StepStatus
from konduit.core.workflow import WorkflowSpec

# Sets of str, not of Outcome: task, step and execution statuses (each its own enum, or a row's
# plain string) are all tested against them.
OK_OUTCOMES: frozenset[str] = frozenset({Outcome.SUCCEEDED, Outcome.DEGRADED})
FAILURE_OUTCOMES: frozenset[str] = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.CANCELLED})
OUTCOMES: frozenset[str] = frozenset(Outcome)
STEP_STATUSES: frozenset[str] = frozenset(StepStatus)


@dataclass(frozen=True)
class StepState:
    """Join and progress counters of one step of one execution (a row of ``konduit_steps``)."""

    status: StepStatus = StepStatus.WAITING  # waiting -> active -> an outcome
    up_pending: int = 0  # upstream steps not ended yet; starts at the number of upstreams
    up_ok: int = 0
    up_failed: int = 0
    up_required_failed: int = 0
    up_skipped: int = 0
    tasks_total: int | None = None  # known once the step fires (a map step: its item count)
    tasks_pending: int = 0
    tasks_ok: int = 0
    tasks_degraded: int = 0
    tasks_failed: int = 0

    def but(self, **changes: Any) -> StepState:
        """These counters with ``changes`` (field names only): ``dataclasses.replace`` without
        its cost. That one runs the generated ``__init__`` (a frozen field set at a time); this
        copies the instance's dict, a handful of times per completion on the worker's hot
        path. The class has no ``__post_init__`` and no derived field to recompute."""
        copy = object.__new__(StepState)
        values = copy.__dict__
        values.update(self.__dict__)
        values.update(changes)
        return copy

    def counted(self, edge: str, required: bool, **changes: Any) -> StepState:
        """These counters with one more upstream edge that ended ``edge`` (already the edge's
        outcome: skipped where the upstream routed elsewhere); ``required`` is the upstream's.
        ``up_pending`` is the caller's: the decision lowers it, a rebuild never raised it.
        ``changes`` are applied with the counts (the caller's ``up_pending``)."""
        failed = edge in FAILURE_OUTCOMES
        return self.but(
            up_ok=self.up_ok + (edge in OK_OUTCOMES),
            up_failed=self.up_failed + failed,
            up_required_failed=self.up_required_failed + (failed and required),
            up_skipped=self.up_skipped + (edge == Outcome.SKIPPED),
            **changes,
        )


@dataclass(frozen=True)
class ExecutionState:
    status: ExecutionStatus = ExecutionStatus.RUNNING
    steps_pending: int = 0


@dataclass(frozen=True)
class TaskEnded:
    """A task of ``step`` reached a terminal outcome. ``routes``, when set, names the downstream
    steps the handler chose: the edges to the others count as skipped."""

    step: str
    outcome: Outcome
    routes: frozenset[str] | None = None


@dataclass(frozen=True)
class MapExpanded:
    """A map step that just fired has ``count`` items (tasks created by the caller)."""

    step: str
    count: int


Event = TaskEnded | MapExpanded


@dataclass(frozen=True)
class NeedStates:
    """The decision needs the state of more steps (a cascade); load them and call again."""

    steps: frozenset[str]


@dataclass
class Decision:
    states: dict[str, StepState] = field(default_factory=dict)  # changed step states only
    fire: list[str] = field(default_factory=list)  # steps whose join fired: create their tasks
    ended: list[tuple[str, Outcome]] = field(default_factory=list)  # steps that ended, and how
    execution: ExecutionState | None = None  # new execution state, when it changed
    reason: str | None = None  # why the execution failed

    @property
    def finished(self) -> bool:
        return self.execution is not None and self.execution.status != ExecutionStatus.RUNNING


Verdict = Literal["fire", "wait", "skip", "fail"]


def initial_states(spec: WorkflowSpec) -> tuple[dict[str, StepState], ExecutionState, list[str]]:
    """State of a new execution: root steps fire at once, the rest wait for their upstreams."""
    states: dict[str, StepState] = {}
    for name in spec.order:
        step = spec[name]
        if step.after:
            states[name] = StepState(up_pending=len(step.after))
        else:
            states[name] = StepState(status=StepStatus.ACTIVE, tasks_total=1, tasks_pending=1)
    return states, ExecutionState(ExecutionStatus.RUNNING, len(spec.steps)), list(spec.roots)


def join_verdict(spec: WorkflowSpec, step: str, state: StepState) -> Verdict:
    """What the join policy of ``step`` says, from its counters alone."""
    s = spec[step]
    n = len(s.after)
    kind = s.join.kind
    if state.up_skipped == n:
        return "skip"  # every branch was routed away: nothing to join, whatever the policy
    if kind == "quorum":
        k = s.join.k or n
        if state.up_ok >= k:
            return "fire"
        # Unreachable: fail once a failure made it so, or once every branch ended. Skips alone
        # wait, so that a join whose branches are all routed away is skipped whatever the order
        # its skips arrive in.
        if state.up_ok + state.up_pending < k and (state.up_failed > 0 or state.up_pending == 0):
            return "fail"
        return "wait"
    if kind == "all_succeeded" and state.up_failed > 0:
        return "fail"
    if kind == "required" and state.up_required_failed > 0:
        return "fail"
    if state.up_pending > 0:
        return "wait"
    # The empty group is not complete: with up_pending starting at the number of upstreams, a
    # join only gets here after every one of them ended.
    if state.up_skipped == n:
        return "skip"
    return "fire"


def _map_outcome(state: StepState) -> Outcome:
    if state.tasks_failed:
        return Outcome.FAILED
    if state.tasks_degraded:
        return Outcome.DEGRADED
    return Outcome.SUCCEEDED


def advance(
    spec: WorkflowSpec,
    execution: ExecutionState,
    states: Mapping[str, StepState],
    event: Event,
) -> Decision | NeedStates:
    """Apply one event. ``states`` must hold the event's step and its downstream steps; when a
    cascade needs more, a :class:`NeedStates` says which (the call is deterministic, so the
    caller loads them and calls again with the larger mapping)."""
    decision = Decision()
    if execution.status != ExecutionStatus.RUNNING:
        return decision
    pending = execution.steps_pending
    missing: set[str] = set()
    # The states as this decision left them: the ones it changed (decision.states) over the
    # ones it was given, never copied (a copy of every loaded step per event grew with the
    # workflow's width).
    changed = decision.states

    def get(name: str) -> StepState | None:
        st = changed.get(name)
        if st is None:
            st = states.get(name)
            if st is None:
                missing.add(name)
        return st

    def put(name: str, st: StepState) -> None:
        changed[name] = st

    def fail(reason: str) -> None:
        decision.fire.clear()  # nothing starts in an execution that just failed
        decision.reason = reason
        decision.execution = ExecutionState(ExecutionStatus.FAILED, pending)

    def end_step(name: str, outcome: Outcome, routes: frozenset[str] | None = None) -> bool:
        """Record that a step ended and propagate to its downstream; False stops the walk."""
        nonlocal pending
        st = get(name)
        if st is None:
            return False
        put(name, st.but(status=StepStatus(outcome)))
        decision.ended.append((name, outcome))
        pending -= 1
        step = spec[name]
        downstream = spec.downstream[name]
        if outcome in FAILURE_OUTCOMES and not downstream and step.required:
            fail(f"final step {name!r} ended {outcome}")
            return False
        for d in downstream:
            ds = get(d)
            if ds is None:
                continue
            # The edge's outcome: a step that routed elsewhere skipped this downstream.
            edge = Outcome.SKIPPED \
                if routes is not None and outcome in OK_OUTCOMES and d not in routes else outcome
            ds = ds.counted(edge, step.required, up_pending=ds.up_pending - 1)
            put(d, ds)
            if ds.status != StepStatus.WAITING:
                continue  # already fired (quorum) or ended: a late branch never fires it again
            verdict = join_verdict(spec, d, ds)
            if verdict == "fire":
                if spec[d].is_map:
                    put(d, ds.but(status=StepStatus.ACTIVE))
                else:
                    put(d, ds.but(status=StepStatus.ACTIVE, tasks_total=1, tasks_pending=1))
                decision.fire.append(d)
            elif verdict == "skip":
                if not end_step(d, Outcome.SKIPPED):
                    return False
            elif verdict == "fail":
                fail(
                    f"step {d!r} cannot run: upstream {name!r} ended {outcome} "
                    f"(join policy {spec[d].join.kind})"
                )
                return False
        return True

    st = get(event.step)
    if st is None:
        return NeedStates(frozenset(missing))
    for d in spec.downstream[event.step]:
        get(d)
    if missing:
        return NeedStates(frozenset(missing))

    if isinstance(event, MapExpanded):
        if st.status != StepStatus.ACTIVE or st.tasks_total is not None:
            return Decision()
        st = st.but(tasks_total=event.count, tasks_pending=event.count)
        put(event.step, st)
        if event.count == 0:
            end_step(event.step, Outcome.SUCCEEDED)
    else:
        if st.status != StepStatus.ACTIVE or st.tasks_pending <= 0 or event.outcome not in OUTCOMES:
            return Decision()  # late or duplicate: the step already ended
        st = st.but(
            tasks_pending=st.tasks_pending - 1,
            tasks_ok=st.tasks_ok + (event.outcome in OK_OUTCOMES),
            tasks_degraded=st.tasks_degraded + (event.outcome == Outcome.DEGRADED),
            tasks_failed=st.tasks_failed + (event.outcome in FAILURE_OUTCOMES),
        )
        put(event.step, st)
        if st.tasks_pending == 0:
            if spec[event.step].is_map:
                end_step(event.step, _map_outcome(st))
            else:
                end_step(event.step, event.outcome, event.routes)

    if missing:
        return NeedStates(frozenset(missing))
    if decision.execution is None:
        if pending == 0:
            decision.execution = ExecutionState(ExecutionStatus.SUCCEEDED, 0)
        elif pending != execution.steps_pending:
            decision.execution = ExecutionState(ExecutionStatus.RUNNING, pending)
    return decision
