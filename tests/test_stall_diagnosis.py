"""The stall diagnosis, pure (:func:`konduit.core.stall.diagnose`).

Property: run random workflows through the pure fan-in decision, losing the decision of random
task ends (seed 000's bug: the task ended, nobody counted it). Whenever nothing can run, the
diagnosis replays exactly the lost ends; every execution then finishes, every step fires once,
and the diagnosis never invents an end (nothing to replay while nothing was lost).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from konduit.core.advance import (
    Decision,
    Event,
    ExecutionState,
    MapExpanded,
    StepState,
    TaskEnded,
    advance,
    initial_states,
)
from konduit.core.stall import EndedTasks, diagnose
from konduit.core.workflow import Workflow, WorkflowSpec
from tests.test_advance_properties import PROPERTY_SETTINGS, build, dags

MAP_ITEMS = 2
# The random workflows need not follow the definition advice (deadlines on optional branches).
pytestmark = [pytest.mark.filterwarnings("ignore::konduit.DefinitionWarning")]


def apply(spec: WorkflowSpec, states: dict[str, StepState], execution: ExecutionState,
          event: Event) -> tuple[Decision, ExecutionState]:
    decision = advance(spec, execution, states, event)
    assert isinstance(decision, Decision)  # every state is given: no NeedStates
    states.update(decision.states)
    return decision, decision.execution or execution


def tally(tasks: dict[str, list[str]]) -> list[EndedTasks]:
    at = datetime.now(UTC)
    return [EndedTasks(step, status, n, None, at) for step, statuses in sorted(tasks.items())
            for status, n in sorted(Counter(s for s in statuses if s != "ready").items())]


@given(dags(), st.data())
@settings(PROPERTY_SETTINGS, max_examples=120)
def test_replaying_the_lost_ends_finishes_every_execution_and_fires_each_step_once(
        defs: list, data: st.DataObject) -> None:
    spec = build(defs)
    states, execution, roots = initial_states(spec)
    tasks: dict[str, list[str]] = {r: ["ready"] for r in roots}
    fires = Counter(roots)
    lost = 0
    while execution.status == "running":
        ready = [(step, i) for step, ts in sorted(tasks.items())
                 for i, s in enumerate(ts) if s == "ready"]
        if not ready:
            found = diagnose(spec, states, tally(tasks))
            assert found.reasons == [] and len(found.replay) == lost, (found, lost)
            events: list[Event] = [e for e, _ in found.replay]
            lost = 0
        else:
            step, i = data.draw(st.sampled_from(ready))
            tasks[step][i] = "succeeded"
            if data.draw(st.integers(0, 3)) == 0:
                lost += 1  # the task ended; its fan-in decision never ran
                continue
            events = [TaskEnded(step, "succeeded")]
        while events:
            decision, execution = apply(spec, states, execution, events.pop(0))
            for fired in decision.fire:
                fires[fired] += 1
                tasks[fired] = ["ready"] * (MAP_ITEMS if spec[fired].is_map else 1)
                if spec[fired].is_map:
                    events.append(MapExpanded(fired, MAP_ITEMS))
    assert execution.status == "succeeded"
    assert set(fires.values()) == {1}
    assert set(fires) == set(spec.order)


def fan_in() -> WorkflowSpec:
    wf = Workflow("diag", version=1)
    wf.step(name="a")(lambda ctx: None)
    wf.step(name="b")(lambda ctx: None)
    wf.step(name="j", after=["a", "b"])(lambda ctx: None)
    return wf.compile()


def test_an_uncounted_end_is_replayed_with_its_outcome_and_routes() -> None:
    spec = fan_in()
    states, _, _ = initial_states(spec)
    found = diagnose(spec, states, [EndedTasks("a", "degraded", 1, ("j",)),
                                    EndedTasks("b", "timed_out", 1)])
    assert [e for e, _ in found.replay] == [TaskEnded("a", "degraded", frozenset({"j"})),
                                            TaskEnded("b", "timed_out")]
    assert found.decidable and found.reasons == []
    assert found.replayed == ["1 task of step 'a' ended degraded without its fan-in decision",
                              "1 task of step 'b' ended timed_out without its fan-in decision"]


def test_what_the_data_cannot_decide_is_named() -> None:
    spec = fan_in()
    states, _, _ = initial_states(spec)
    # `a` has no task at all; `b` ended and was counted, so `j` still waits for `a`.
    states["b"] = StepState(status="succeeded", tasks_total=1, tasks_pending=0, tasks_ok=1)
    states["j"] = StepState(up_pending=1, up_ok=1)
    found = diagnose(spec, states, [EndedTasks("b", "succeeded", 1)])
    assert found.replay == [] and not found.decidable
    assert found.reasons == ["step 'a' waits for 1 task that neither exist nor can run (none is "
                             "ready, running or waiting, none ended uncounted)"]
    # A join whose counters say every upstream ended, yet it waits.
    states["a"] = StepState(status="succeeded", tasks_total=1, tasks_pending=0, tasks_ok=1)
    states["j"] = StepState(up_pending=0, up_ok=2)
    assert diagnose(spec, states, []).reasons == [
        "join 'j': every upstream step ended and its policy says 'fire', but the step still waits"]
    states["j"] = StepState(up_pending=1, up_ok=1)
    assert diagnose(spec, states, []).reasons == [
        "join 'j' still counts 1 upstream step pending, but all of 'a', 'b' ended"]


def test_a_map_step_replays_only_the_items_its_counters_miss() -> None:
    wf = Workflow("diag-map", version=1)
    wf.step(name="src")(lambda ctx: [1, 2, 3, 4])
    wf.map(name="m", after=["src"], over=lambda xs: xs)(lambda ctx: None)
    spec = wf.compile()
    states, _, _ = initial_states(spec)
    states["src"] = StepState(status="succeeded", tasks_total=1, tasks_pending=0, tasks_ok=1)
    # Four items: one counted succeeded, one counted failed; one more of each ended uncounted.
    states["m"] = StepState(status="active", up_pending=0, up_ok=1, tasks_total=4,
                            tasks_pending=2, tasks_ok=1, tasks_failed=1)
    found = diagnose(spec, states, [EndedTasks("m", "failed", 2), EndedTasks("m", "succeeded", 2)])
    assert sorted(e.outcome for e, _ in found.replay) == ["failed", "succeeded"]
    assert found.decidable
    # Fired, but its items were never counted: nothing to replay.
    states["m"] = StepState(status="active", up_pending=0, up_ok=1)
    assert diagnose(spec, states, []).reasons == [
        "map step 'm' fired, but its items were never counted"]
