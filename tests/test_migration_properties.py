"""The migration plan (konduit.core.migration) against the pure fan-in decision it must agree
with: random DAGs are run part way with :func:`konduit.core.advance.advance`, migrated to a
random other version, and run on to the end under the new DAG."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.advance import (
    OUTCOMES,
    Decision,
    ExecutionState,
    StepState,
    TaskEnded,
    advance,
    initial_states,
)
from konduit.core.migration import Shape, incompatibility, plan_migration
from konduit.core.model import ExecutionStatus, Outcome, StepStatus
from konduit.core.workflow import WorkflowSpec
from konduit.errors import MigrationRefused

JOINS = [konduit.Join.all_succeeded(), konduit.Join.all_done(), konduit.Join.required(),
         konduit.Join.quorum(1), konduit.Join.quorum(2)]
# Graph: step name -> (upstreams, join index, required)
Graph = dict[str, tuple[tuple[str, ...], int, bool]]


def build(graph: Graph, version: int) -> WorkflowSpec:
    wf = konduit.Workflow("prop", version=version)
    for name, (after, join, required) in graph.items():
        def handler(ctx: konduit.Context) -> None:
            return None
        kind = JOINS[join]
        if kind.kind == "quorum" and (kind.k or 1) > max(len(after), 1):
            kind = konduit.Join.quorum(1)
        wf.step(name=name, after=list(after), join=kind if len(after) > 1 else None,
                required=required)(handler)
    return wf.compile()


@st.composite
def graphs(draw: st.DrawFn, prefix: str = "s", base: Graph | None = None) -> Graph:
    graph: Graph = dict(base or {})
    for i in range(draw(st.integers(1 if base is None else 0, 6))):
        names = list(graph)
        after = tuple(draw(st.lists(st.sampled_from(names), max_size=3, unique=True))) \
            if names else ()
        graph[f"{prefix}{i}"] = (after, draw(st.integers(0, len(JOINS) - 1)),
                                 draw(st.booleans()))
    return graph


@st.composite
def changed(draw: st.DrawFn, graph: Graph) -> Graph:
    """Another version: some steps dropped (with what depends on them), some re-wired, some
    added anywhere."""
    new: Graph = {}
    for name, (after, join, required) in graph.items():
        if draw(st.integers(0, 5)) == 0:
            continue  # dropped
        kept = tuple(u for u in after if u in new)
        if draw(st.integers(0, 5)) == 0 and new:
            kept = tuple(draw(st.lists(st.sampled_from(list(new)), max_size=3, unique=True)))
        new[name] = (kept, join, required)
    if not new:  # a name graphs() below never gives a step it adds (it would replace this one)
        new = {"root": ((), 0, True)}
    return draw(graphs("n", new))


def run(spec: WorkflowSpec, execution: ExecutionState, states: dict[str, StepState],
        rng: random.Random, events: int, fired: dict[str, int]) -> ExecutionState:
    """End up to ``events`` tasks of active steps with random outcomes, through advance()."""
    for _ in range(events):
        if execution.status != ExecutionStatus.RUNNING:
            break
        active = [n for n in spec.order
                  if states[n].status == StepStatus.ACTIVE and states[n].tasks_pending > 0]
        assert active, f"stalled: nothing can run in {states}"
        step = rng.choice(active)
        outcome = rng.choice([Outcome.SUCCEEDED, Outcome.SUCCEEDED, Outcome.DEGRADED,
                              Outcome.FAILED])
        decision = advance(spec, execution, states, TaskEnded(step, outcome))
        assert isinstance(decision, Decision)
        states.update(decision.states)
        for f in decision.fire:
            fired[f] = fired.get(f, 0) + 1
        if decision.execution is not None:
            execution = decision.execution
    return execution


def started(graph: Graph, seed: int, events: int
            ) -> tuple[WorkflowSpec, ExecutionState, dict[str, StepState], dict[str, int]]:
    spec = build(graph, 1)
    states, execution, roots = initial_states(spec)
    fired = dict.fromkeys(roots, 1)
    execution = run(spec, execution, states, random.Random(seed), events, fired)
    return spec, execution, states, fired


def past_of(states: dict[str, StepState]) -> frozenset[str]:
    return frozenset(n for n, s in states.items() if s.status != StepStatus.WAITING)


pytestmark = pytest.mark.filterwarnings("ignore::konduit.DefinitionWarning")

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), events=st.integers(0, 8))
def test_the_same_dag_rebuilds_exactly_the_state_advance_counted(data, seed, events):
    """Migrating to an identical DAG changes nothing: the join state rebuilt from the
    upstream outcomes is the state advance() counted one completion at a time."""
    graph = data.draw(graphs())
    spec, execution, states, _ = started(graph, seed, events)
    if execution.status != ExecutionStatus.RUNNING:
        return
    old = Shape.of(spec)
    new = Shape.of(build(graph, 2))
    plan = plan_migration(old, new, {n: s.status for n, s in states.items()}, past_of(states), {})
    assert plan.start == () and plan.skipped == () and plan.added == () and plan.dropped == ()
    assert plan.steps_pending == execution.steps_pending
    for name, state in plan.states.items():
        assert state == states[name], name


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), events=st.integers(0, 8))
def test_a_migration_is_refused_exactly_when_the_past_changed_and_joins_fire_once(
        data, seed, events):
    graph = data.draw(graphs())
    spec, execution, states, fired = started(graph, seed, events)
    if execution.status != ExecutionStatus.RUNNING:
        return
    graph2 = data.draw(changed(graph))
    spec2 = build(graph2, 2)
    old, new = Shape.of(spec), Shape.of(spec2)
    past = past_of(states)
    broken = sorted(n for n in past if n not in graph2 or set(graph2[n][0]) != set(graph[n][0]))
    try:
        plan = plan_migration(old, new, {n: s.status for n, s in states.items()}, past, {})
    except MigrationRefused as refused:
        if broken:
            assert refused.step in broken and refused.step is not None
            assert repr(refused.step) in str(refused)
        else:  # the new DAG itself would fail the execution on what stands
            assert refused.step in new and "would fail" in str(refused)
        return
    event("allowed")
    assert not broken, f"past steps {broken} changed, yet the migration was allowed"
    assert incompatibility(old, new, past) is None
    assert set(plan.dropped) == set(graph) - set(graph2)
    assert set(plan.added) == set(graph2) - set(graph)
    # The migrated execution: the past as it was, the rest as planned.
    moved = {n: states[n] for n in past} | plan.states
    assert set(moved) == set(graph2)
    for n in plan.start:
        fired[n] = fired.get(n, 0) + 1
    for n in plan.skipped:
        assert moved[n].status == StepStatus.SKIPPED
    running = ExecutionState(ExecutionStatus.RUNNING, plan.steps_pending)
    if plan.steps_pending == 0:
        assert all(s.status in OUTCOMES for s in moved.values())
        return
    end = run(spec2, running, moved, random.Random(seed + 1), 1000, fired)
    assert end.status != ExecutionStatus.RUNNING, "the migrated execution never finished"
    # Every join fired at most once, old version and new together.
    assert all(count == 1 for count in fired.values()), fired
    if end.status == ExecutionStatus.SUCCEEDED:
        assert all(s.status in OUTCOMES for s in moved.values())


def test_refusals_name_the_step():
    v1 = Shape.of(build({"a": ((), 0, True), "b": (("a",), 0, True), "c": (("b",), 0, True)}, 1))
    missing = Shape.of(build({"a": ((), 0, True), "c": (("a",), 0, True)}, 2))
    with pytest.raises(MigrationRefused, match="step 'b' has started or ended but does not exist"
                       ) as info:
        plan_migration(v1, missing, {"a": "succeeded", "b": "active"},
                       frozenset({"a", "b"}), {})
    assert info.value.step == "b"
    rewired = Shape.of(build({"a": ((), 0, True), "x": ((), 0, True),
                              "b": (("a", "x"), 0, True), "c": (("b",), 0, True)}, 2))
    with pytest.raises(MigrationRefused, match=r"upstreams differ.*\['a'\] in version 1, "
                       r"\['a', 'x'\] in version 2") as info:
        plan_migration(v1, rewired, {"a": "succeeded", "b": "active"},
                       frozenset({"a", "b"}), {})
    assert info.value.step == "b"
    # The same change before b started is allowed: b waits for x, which starts now.
    plan = plan_migration(v1, rewired, {"a": "active"}, frozenset({"a"}), {})
    assert plan.start == ("x",) and plan.added == ("x",)
    assert plan.states["b"] == StepState(up_pending=2)


def test_routes_and_skips_carry_over_to_new_edges():
    """A step that routed away from an edge of the old DAG skips a new downstream it did not
    choose; a new step all of whose upstreams skipped it ends skipped at once."""
    v1 = Shape.of(build({"a": ((), 0, True), "b": (("a",), 0, True)}, 1))
    v2 = Shape.of(build({"a": ((), 0, True), "b": (("a",), 0, True), "c": (("a",), 0, True),
                         "d": (("c",), 0, True)}, 2))
    plan = plan_migration(v1, v2, {"a": "succeeded", "b": "active"}, frozenset({"a", "b"}),
                          {"a": frozenset({"b"})})
    assert plan.skipped == ("c", "d") and plan.start == ()
    assert plan.steps_pending == 1  # b
