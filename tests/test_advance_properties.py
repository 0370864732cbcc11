"""Property tests of the pure fan-in decision (:func:`konduit.core.advance.advance`).

A simulator drives random executions of random DAGs through ``advance`` exactly as the database
layer would (load state, call, apply the decision, create the fired tasks, expand map steps) and
checks every decision against an oracle that works from the *outcomes* of the upstream steps, not
from the counters that ``advance`` keeps.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from konduit.core.advance import (
    Decision,
    ExecutionState,
    MapExpanded,
    NeedStates,
    StepState,
    TaskEnded,
    advance,
    initial_states,
    join_verdict,
)
from konduit.core.policies import Join
from konduit.core.workflow import Workflow, WorkflowSpec

OK = frozenset({"succeeded", "degraded"})
FAILURES = frozenset({"failed", "timed_out", "cancelled"})
ENDED = OK | FAILURES | {"skipped"}

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- random workflows -------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDef:
    name: str
    after: tuple[str, ...]
    join: Join | None
    required: bool
    is_map: bool


def _handler(name: str) -> Any:
    """A distinct dummy handler per step."""

    def handler(ctx: Any) -> None:
        return None

    handler.__name__ = handler.__qualname__ = name
    return handler


def _over(out: Any) -> list[Any]:
    return list(out or [])


@st.composite
def dags(draw: st.DrawFn) -> list[StepDef]:
    n = draw(st.integers(min_value=2, max_value=12))
    defs: list[StepDef] = []
    for i in range(n):
        name = f"s{i}"
        if i == 0 or draw(st.integers(0, 4)) == 0:  # a few extra roots
            ups: list[int] = []
        else:
            ups = draw(st.lists(st.integers(0, i - 1), unique=True, min_size=1, max_size=min(i, 5)))
        after = tuple(f"s{u}" for u in sorted(ups))
        is_map = bool(after) and draw(st.integers(0, 3)) == 0
        join: Join | None = None
        if len(after) >= 2 and not is_map:
            kind = draw(st.sampled_from(["default", "all_succeeded", "all_done", "required", "quorum"]))
            if kind == "all_succeeded":
                join = Join.all_succeeded()
            elif kind == "all_done":
                join = Join.all_done()
            elif kind == "required":
                join = Join.required()
            elif kind == "quorum":
                join = Join.quorum(draw(st.integers(1, len(after))))
        required = draw(st.integers(0, 3)) > 0  # mostly required
        defs.append(StepDef(name, after, join, required, is_map))
    return defs


def build(defs: list[StepDef]) -> WorkflowSpec:
    wf = Workflow("prop", version=1)
    for d in defs:
        h = _handler(d.name)
        if d.is_map:
            wf.map(after=list(d.after), over=_over, name=d.name, required=d.required)(h)
        else:
            wf.step(after=list(d.after), join=d.join, name=d.name, required=d.required)(h)
    return wf.compile()


# -- the oracle: join policies from upstream outcomes -----------------------------------------


def policy_met(spec: WorkflowSpec, step: str, outs: dict[str, str]) -> bool:
    """May ``step`` fire, given the outcomes of the upstream steps that ended so far?"""
    s = spec[step]
    ended = [outs[u] for u in s.after if u in outs]
    all_ended = len(ended) == len(s.after)
    all_skipped = all_ended and all(o == "skipped" for o in ended)
    kind = s.join.kind
    if kind == "quorum":
        assert s.join.k is not None
        return sum(o in OK for o in ended) >= s.join.k
    if kind == "all_succeeded":
        return all_ended and all(o in OK or o == "skipped" for o in ended) and not all_skipped
    if kind == "all_done":
        return all_ended and not all_skipped
    if kind == "required":
        return (
            all_ended
            and not any(outs[u] in FAILURES and spec[u].required for u in s.after)
            and not all_skipped
        )
    raise AssertionError(kind)


def policy_broken(spec: WorkflowSpec, step: str, outs: dict[str, str]) -> bool:
    """Can ``step`` never fire any more (the execution fails)?"""
    s = spec[step]
    ended = [outs[u] for u in s.after if u in outs]
    kind = s.join.kind
    if kind == "quorum":
        assert s.join.k is not None
        pending = len(s.after) - len(ended)
        if ended and len(ended) == len(s.after) and all(o == "skipped" for o in ended):
            return False  # every branch routed away: the join is skipped, like other policies
        unreachable = sum(o in OK for o in ended) + pending < s.join.k
        return unreachable and (any(o in FAILURES for o in ended) or pending == 0)
    if kind == "all_succeeded":
        return any(o in FAILURES for o in ended)
    if kind == "required":
        return any(outs.get(u) in FAILURES and spec[u].required for u in s.after)
    return False


def should_skip(spec: WorkflowSpec, step: str, outs: dict[str, str]) -> bool:
    s = spec[step]
    return all(outs.get(u) == "skipped" for u in s.after)


def map_outcome(task_outcomes: list[str]) -> str:
    if any(o in FAILURES for o in task_outcomes):
        return "failed"
    if "degraded" in task_outcomes:
        return "degraded"
    return "succeeded"


# -- the simulator ----------------------------------------------------------------------------


@dataclass
class Expect:
    """What the oracle expects one event to do."""

    fire: set[str] = field(default_factory=set)
    ended: list[tuple[str, str]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)  # steps at fault, if the execution fails


class Sim:
    def __init__(self, spec: WorkflowSpec, data: st.DataObject, outcomes: list[str], partial: bool) -> None:
        self.spec = spec
        self.data = data
        self.outcomes = outcomes
        self.map_outcomes = [o for o in outcomes if o != "skipped"]
        self.partial = partial
        self.need_states_seen = 0

        states, ex, roots = initial_states(spec)
        assert tuple(roots) == spec.roots
        assert set(states) == set(spec.steps)
        assert ex == ExecutionState("running", len(spec.steps))
        self.states: dict[str, StepState] = dict(states)
        self.ex = ex

        self.live: list[tuple[str, int]] = []
        self.tasks_created: set[tuple[str, int]] = set()
        self.task_count: dict[str, int] = {}
        self.task_outcomes: dict[str, list[str]] = defaultdict(list)
        self.fired: dict[str, int] = {}  # step -> clock when it fired
        self.clock = 0
        self.reason: str | None = None
        self.failed_at: int | None = None

        # oracle's own view
        self.m_status = {n: "waiting" for n in spec.steps}
        self.m_out: dict[str, str] = {}
        self.end_time: dict[str, int] = {}

        for name in spec.order:
            if spec[name].after:
                assert self.states[name] == StepState(up_pending=len(spec[name].after))
            else:
                assert name in roots
                assert self.states[name].status == "active"
        for r in roots:
            assert not spec[r].is_map
            self._fire(r)

    # -- calling advance --

    def call(self, event: TaskEnded | MapExpanded) -> Decision:
        frozen = MappingProxyType(dict(self.states))
        full = advance(self.spec, self.ex, frozen, event)
        assert not isinstance(full, NeedStates), f"NeedStates with the full state mapping: {full}"
        assert dict(frozen) == self.states  # the input is not mutated
        if self.partial:
            got = self._call_partial(event)
            assert got == full, f"partial-state run differs for {event}: {got} != {full}"
        return full

    def _call_partial(self, event: TaskEnded | MapExpanded) -> Decision:
        keys = {event.step, *self.spec.downstream[event.step]}
        for _ in range(len(self.spec.steps) + 1):
            r = advance(self.spec, self.ex, {k: self.states[k] for k in keys}, event)
            if not isinstance(r, NeedStates):
                return r
            self.need_states_seen += 1
            assert r.steps, "NeedStates without steps"
            assert r.steps <= set(self.spec.steps)
            assert r.steps.isdisjoint(keys), f"NeedStates asks for steps it already has: {r}"
            keys |= r.steps
        raise AssertionError("NeedStates loop did not converge")

    # -- oracle --

    def _model_end(self, name: str, outcome: str, expect: Expect) -> None:
        assert self.m_status[name] != "ended"
        self.m_status[name] = "ended"
        self.m_out[name] = outcome
        self.end_time[name] = self.clock
        expect.ended.append((name, outcome))
        if outcome in FAILURES and not self.spec.downstream[name] and self.spec[name].required:
            expect.fail.add(name)
        for d in self.spec.downstream[name]:
            if self.m_status[d] != "waiting":
                continue  # already fired (quorum) or ended: a late branch changes nothing
            if policy_met(self.spec, d, self.m_out):
                self.m_status[d] = "active"
                expect.fire.add(d)
            elif should_skip(self.spec, d, self.m_out):
                self._model_end(d, "skipped", expect)
            elif policy_broken(self.spec, d, self.m_out):
                expect.fail.add(d)

    def _check(self, decision: Decision, expect: Expect) -> None:
        assert len(decision.fire) == len(set(decision.fire)), decision
        assert len(decision.ended) == len(set(decision.ended)), decision
        for name in decision.fire:
            assert name not in self.fired, f"{name} fired twice"
            assert self.states[name].status == "waiting", (name, self.states[name])
        if expect.fail:
            assert decision.execution is not None
            assert decision.execution.status == "failed", (decision, expect)
            assert isinstance(decision.reason, str)
            named = re.findall(r"step '([^']+)'", decision.reason)
            assert named and named[0] in expect.fail, (decision.reason, expect.fail)
            # the walk stops at the first failure, so it may have done less than the oracle
            assert set(decision.fire) <= expect.fire, (decision, expect)
            assert set(decision.ended) <= set(expect.ended), (decision, expect)
        else:
            assert decision.reason is None, decision
            assert set(decision.fire) == expect.fire, (decision, expect)
            assert sorted(decision.ended) == sorted(expect.ended), (decision, expect)

    def _apply(self, decision: Decision) -> None:
        for k, v in decision.states.items():
            assert k in self.spec.steps
            assert v.status in {"waiting", "active"} | ENDED
            self.states[k] = v
        if decision.execution is not None:
            self.ex = decision.execution
        if self.ex.status == "failed" and self.reason is None:
            self.reason = decision.reason
            self.failed_at = self.clock
        if self.ex.status == "running" or self.ex.status == "succeeded":
            pending = sum(s != "ended" for s in self.m_status.values())
            assert self.ex.steps_pending == pending, (self.ex, self.m_status)
            assert (self.ex.status == "succeeded") == (pending == 0), (self.ex, self.m_status)
            for name, status in self.m_status.items():
                if status == "ended":
                    assert self.states[name].status == self.m_out[name], name
                else:
                    assert self.states[name].status == status, (name, self.states[name])

    def _fire(self, name: str) -> None:
        assert name not in self.fired, f"{name} fired twice"
        self.fired[name] = self.clock
        self.m_status[name] = "active"
        if self.spec[name].is_map:
            return  # tasks are created by _expand
        self._create(name, 1)

    def _create(self, name: str, count: int) -> None:
        self.task_count[name] = count
        for i in range(count):
            task = (name, i)
            assert task not in self.tasks_created, f"task {task} created twice"
            self.tasks_created.add(task)
            self.live.append(task)

    def _run_decision(self, decision: Decision, expect: Expect | None) -> None:
        """Check and apply a decision, then create the fired tasks (expanding map steps)."""
        running_before = self.ex.status == "running"
        if not running_before:
            assert decision == Decision(), f"a decision after the execution ended: {decision}"
            return
        assert expect is not None
        self._check(decision, expect)
        self._apply(decision)
        for name in decision.fire:
            self._fire(name)
        queue = deque(n for n in decision.fire if self.spec[n].is_map)
        while queue:
            name = queue.popleft()
            count = self.data.draw(st.integers(0, 5), label=f"items of {name}")
            self._create(name, count)
            self.clock += 1
            expand_running = self.ex.status == "running"
            d2 = self.call(MapExpanded(name, count))
            if not expand_running:
                assert d2 == Decision()
                continue
            exp2 = Expect()
            if count == 0:
                self._model_end(name, "succeeded", exp2)
            self._check(d2, exp2)
            self._apply(d2)
            for fired in d2.fire:
                self._fire(fired)
            queue.extend(n for n in d2.fire if self.spec[n].is_map)
            # a map step that already expanded ignores a second expansion
            assert self.call(MapExpanded(name, count + 1)) == Decision()

    def _maybe_duplicate(self) -> None:
        if self.ex.status != "running" or self.data.draw(st.integers(0, 4)) != 0:
            return
        candidates = sorted(n for n, s in self.m_status.items() if s in ("ended", "waiting"))
        if not candidates:
            return
        name = self.data.draw(st.sampled_from(candidates), label="duplicate")
        outcome = self.data.draw(st.sampled_from(sorted(ENDED)), label="duplicate outcome")
        assert self.call(TaskEnded(name, outcome)) == Decision(), (name, self.m_status[name])

    def run(self) -> None:
        while self.live:
            i = self.data.draw(st.integers(0, len(self.live) - 1), label="next task")
            name, index = self.live.pop(i)
            is_map = self.spec[name].is_map
            outcome = self.data.draw(
                st.sampled_from(self.map_outcomes if is_map else self.outcomes),
                label=f"outcome of {name}[{index}]",
            )
            self.clock += 1
            running = self.ex.status == "running"
            decision = self.call(TaskEnded(name, outcome))
            if not running:
                assert decision == Decision(), f"a decision after the execution ended: {decision}"
                continue
            expect = Expect()
            self.task_outcomes[name].append(outcome)
            if len(self.task_outcomes[name]) == self.task_count[name]:
                step_outcome = map_outcome(self.task_outcomes[name]) if is_map else outcome
                self._model_end(name, step_outcome, expect)
            self._run_decision(decision, expect)
            self._maybe_duplicate()
        self._final_checks()

    # -- end of run --

    def _first_met(self, step: str) -> int | None:
        """The clock at which the join policy of ``step`` was first met, from the end times."""
        ups = sorted((self.end_time[u], u) for u in self.spec[step].after if u in self.end_time)
        outs: dict[str, str] = {}
        for t, u in ups:
            outs[u] = self.m_out[u]
            if policy_met(self.spec, step, outs):
                return t
        return None

    def _final_checks(self) -> None:
        assert self.ex.status in ("succeeded", "failed"), f"execution never finished: {self.ex}"
        if self.ex.status == "succeeded":
            assert self.ex.steps_pending == 0
            for name, st_ in self.states.items():
                assert st_.status in ENDED, (name, st_)
                assert self.m_status[name] == "ended"
            assert set(self.fired) | {n for n, o in self.m_out.items() if o == "skipped"} == set(
                self.spec.steps
            )
            # a required final step never ends failed in a succeeded execution
            for sink in self.spec.sinks:
                if self.spec[sink].required:
                    assert self.m_out[sink] not in FAILURES
        else:
            assert isinstance(self.reason, str) and self.reason
            named = re.findall(r"step '([^']+)'", self.reason)
            assert named and all(n in self.spec.steps for n in named), self.reason
        # every join fired exactly when its policy was first met, and never after a failure
        for name in self.spec.steps:
            if not self.spec[name].after:
                assert name in self.fired
                continue
            first = self._first_met(name)
            if name in self.fired:
                assert first == self.fired[name], (name, first, self.fired[name])
                if self.failed_at is not None:
                    assert self.fired[name] <= self.failed_at
            elif first is not None:
                # only a failure at that very moment (which stops the walk) may prevent it
                assert self.failed_at is not None and self.failed_at <= first, (name, first)
        assert all(self.m_status[n] != "waiting" or n not in self.fired for n in self.spec.steps)


# -- the properties ---------------------------------------------------------------------------

BASIC = ["succeeded", "degraded", "failed", "timed_out"]
MIXES = {
    "no-failures": ["succeeded", "succeeded", "degraded"],
    "few-failures": ["succeeded"] * 6 + ["degraded", "failed", "timed_out"],
    "uniform": BASIC,
}


def _outcomes(data: st.DataObject, extra: list[str]) -> tuple[str, list[str]]:
    mix = data.draw(st.sampled_from(sorted(MIXES)), label="outcome mix")
    outcomes = list(MIXES[mix])
    if mix != "no-failures":
        outcomes += extra
    return mix, outcomes


@PROPERTY_SETTINGS
@given(defs=dags(), data=st.data())
def test_random_executions_with_full_states(defs: list[StepDef], data: st.DataObject) -> None:
    spec = build(defs)
    mix, outcomes = _outcomes(data, [])
    sim = Sim(spec, data, outcomes, partial=False)
    sim.run()
    event(f"execution {sim.ex.status}")
    if mix == "no-failures":
        assert sim.ex.status == "succeeded"
        assert set(sim.fired) == set(spec.steps)


@PROPERTY_SETTINGS
@given(defs=dags(), data=st.data())
def test_skipped_and_cancelled_outcomes(defs: list[StepDef], data: st.DataObject) -> None:
    """Skipped branches (conditional routing) cascade; cancelled counts as a failure."""
    spec = build(defs)
    _, outcomes = _outcomes(data, ["skipped", "skipped", "cancelled"])
    sim = Sim(spec, data, outcomes, partial=False)
    sim.run()
    event(f"execution {sim.ex.status}")


@PROPERTY_SETTINGS
@given(defs=dags(), data=st.data())
def test_partial_states_reach_the_same_decisions(defs: list[StepDef], data: st.DataObject) -> None:
    """Passing only the event step and its direct downstream, and loading what a NeedStates asks
    for, gives exactly the decision of the full-state call."""
    spec = build(defs)
    if data.draw(st.booleans(), label="skip-heavy"):
        outcomes = ["skipped", "skipped", "skipped", "succeeded", "succeeded", "failed"]
    else:
        _, outcomes = _outcomes(data, ["skipped", "skipped", "skipped"])
    sim = Sim(spec, data, outcomes, partial=True)
    sim.run()
    event(f"execution {sim.ex.status}")
    event(f"NeedStates answered: {sim.need_states_seen > 0}")


# -- examples ---------------------------------------------------------------------------------


def _wf(*defs: StepDef) -> WorkflowSpec:
    return build(list(defs))


def _sd(
    name: str, *after: str, join: Join | None = None, required: bool = True, is_map: bool = False
) -> StepDef:
    return StepDef(name, tuple(after), join, required, is_map)


def _step(
    spec: WorkflowSpec, ex: ExecutionState, states: dict[str, StepState], event: TaskEnded | MapExpanded
) -> tuple[Decision, ExecutionState]:
    d = advance(spec, ex, states, event)
    assert isinstance(d, Decision)
    states.update(d.states)
    return d, d.execution or ex


def test_partial_states_need_the_cascade() -> None:
    spec = _wf(_sd("a"), _sd("b", "a"), _sd("c", "b"))
    states, ex, _ = initial_states(spec)
    need = advance(spec, ex, {k: states[k] for k in ("a", "b")}, TaskEnded("a", "skipped"))
    assert need == NeedStates(frozenset({"c"}))
    d = advance(spec, ex, states, TaskEnded("a", "skipped"))
    assert isinstance(d, Decision)
    assert d.ended == [("a", "skipped"), ("b", "skipped"), ("c", "skipped")]
    assert d.execution == ExecutionState("succeeded", 0)


def test_duplicate_task_ended_is_a_no_op() -> None:
    spec = _wf(_sd("a"), _sd("b", "a"), _sd("c", "a"))
    states, ex, _ = initial_states(spec)
    d, ex = _step(spec, ex, states, TaskEnded("a", "succeeded"))
    assert sorted(d.fire) == ["b", "c"]
    for outcome in ("succeeded", "failed", "degraded"):
        assert advance(spec, ex, states, TaskEnded("a", outcome)) == Decision()
    # a waiting step, and an outcome that is not one, are ignored too
    assert advance(spec, ex, states, TaskEnded("b", "bogus")) == Decision()
    spec2 = _wf(_sd("a"), _sd("b", "a"))
    states2, ex2, _ = initial_states(spec2)
    assert advance(spec2, ex2, states2, TaskEnded("b", "succeeded")) == Decision()


def test_quorum_fires_on_the_kth_success_and_never_again() -> None:
    spec = _wf(_sd("a"), _sd("b"), _sd("c"), _sd("j", "a", "b", "c", join=Join.quorum(2)))
    states, ex, roots = initial_states(spec)
    assert sorted(roots) == ["a", "b", "c"]
    d, ex = _step(spec, ex, states, TaskEnded("a", "failed"))
    assert d.fire == [] and ex.status == "running"
    assert join_verdict(spec, "j", states["j"]) == "wait"
    d, ex = _step(spec, ex, states, TaskEnded("b", "degraded"))
    assert d.fire == []
    d, ex = _step(spec, ex, states, TaskEnded("c", "succeeded"))
    assert d.fire == ["j"]
    d, ex = _step(spec, ex, states, TaskEnded("j", "succeeded"))
    assert ex == ExecutionState("succeeded", 0)


def test_quorum_fires_before_the_stragglers() -> None:
    spec = _wf(_sd("a"), _sd("b"), _sd("c"), _sd("j", "a", "b", "c", join=Join.quorum(1)))
    states, ex, _ = initial_states(spec)
    d, ex = _step(spec, ex, states, TaskEnded("b", "succeeded"))
    assert d.fire == ["j"]
    d, ex = _step(spec, ex, states, TaskEnded("j", "succeeded"))
    assert ex.status == "running"  # a and c still run; late results are recorded
    d, ex = _step(spec, ex, states, TaskEnded("a", "failed"))
    assert d.fire == [] and ex.status == "running"
    d, ex = _step(spec, ex, states, TaskEnded("c", "succeeded"))
    assert d.fire == [] and ex == ExecutionState("succeeded", 0)


@pytest.mark.parametrize(
    ("join", "outcomes", "expected"),
    [
        (Join.all_succeeded(), ["succeeded", "failed"], "failed"),
        (Join.all_done(), ["succeeded", "failed"], "succeeded"),
        (Join.required(), ["succeeded", "failed"], "succeeded"),  # b is optional
        (Join.required(), ["failed", "succeeded"], "failed"),  # a is required
        (Join.quorum(1), ["failed", "succeeded"], "succeeded"),
        (Join.quorum(2), ["failed", "succeeded"], "failed"),
    ],
)
def test_join_policies(join: Join, outcomes: list[str], expected: str) -> None:
    spec = _wf(_sd("a"), _sd("b", required=False), _sd("j", "a", "b", join=join))
    states, ex, _ = initial_states(spec)
    for name, outcome in zip(["a", "b"], outcomes, strict=True):
        d, ex = _step(spec, ex, states, TaskEnded(name, outcome))
        for f in d.fire:
            d, ex = _step(spec, ex, states, TaskEnded(f, "succeeded"))
    assert ex.status == expected


def test_map_step_expansion() -> None:
    spec = _wf(_sd("a"), _sd("m", "a", is_map=True), _sd("z", "m"))
    states, ex, _ = initial_states(spec)
    d, ex = _step(spec, ex, states, TaskEnded("a", "succeeded"))
    assert d.fire == ["m"]
    d, ex = _step(spec, ex, states, MapExpanded("m", 3))
    assert d.fire == [] and states["m"].tasks_pending == 3
    for outcome in ("succeeded", "degraded"):
        d, ex = _step(spec, ex, states, TaskEnded("m", outcome))
        assert d.ended == []
    d, ex = _step(spec, ex, states, TaskEnded("m", "succeeded"))
    assert d.ended == [("m", "degraded")] and d.fire == ["z"]
    # an empty map ends at once
    states, ex, _ = initial_states(spec)
    _step(spec, ex, states, TaskEnded("a", "succeeded"))
    d, ex = _step(spec, ex, states, MapExpanded("m", 0))
    assert d.ended == [("m", "succeeded")] and d.fire == ["z"]


def test_failed_final_step_fails_the_execution_with_a_reason() -> None:
    spec = _wf(_sd("a"), _sd("b", "a"))
    states, ex, _ = initial_states(spec)
    _, ex = _step(spec, ex, states, TaskEnded("a", "succeeded"))
    d, ex = _step(spec, ex, states, TaskEnded("b", "timed_out"))
    assert ex.status == "failed" and d.finished
    assert d.reason is not None and "'b'" in d.reason
    # nothing happens in a finished execution
    assert advance(spec, ex, states, TaskEnded("b", "succeeded")) == Decision()
