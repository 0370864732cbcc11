"""The join fires exactly once when its branches finish at the same instant.

Seed 000: the obvious fan-in check passes every sequential test and stalls the moment two
workers finish together. These tests force that collision (a barrier releases every branch's
completion at once, each on its own connection) and count, per trial, how many times the join
fired. The naive check runs through the same harness, held between its write and its check so
that it stalls every time, to prove the harness catches the bug.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import konduit
from tests.support.fanin import (
    CompleteFn,
    Harness,
    TrialResult,
    engine_complete,
    fan_in_workflow,
    locked_complete_paused,
    naive_complete_paused,
)

pytestmark = pytest.mark.storage

# widths and trials: 200 + 80 + 20 = 300 trials of simultaneous completion in all.
TRIALS = [(2, 200), (8, 80), (50, 20)]


@pytest.mark.parametrize(("width", "trials"), TRIALS)
def test_join_fires_exactly_once_under_simultaneous_finish(make_app, width, trials):
    wf = fan_in_workflow(width)
    app = make_app(wf)
    harness = Harness(app, width, wf.name)
    fired = []
    try:
        for _ in range(trials):
            result = harness.trial(engine_complete)
            fired.append(result.join_tasks)
            harness.finish_join()
    finally:
        harness.close()
    assert fired == [1] * trials, f"join fired {fired.count(0)} times never, others twice+"
    executions = app.list(limit=trials + 5)
    assert len(executions) == trials
    assert {e.status for e in executions} == {"succeeded"}


@pytest.mark.parametrize(("width", "k", "trials"), [(8, 3, 40), (50, 10, 10)])
def test_quorum_fires_once_on_simultaneous_successes(make_app, width, k, trials):
    """Quorum(k) with every branch succeeding at the same instant: exactly one fire, and the
    late successes after the k-th are recorded without firing it again."""
    wf = fan_in_workflow(width, f"quorum-{width}", konduit.Join.quorum(k))
    app = make_app(wf)
    harness = Harness(app, width, wf.name)
    try:
        fired = []
        for _ in range(trials):
            fired.append(harness.trial(engine_complete).join_tasks)
            harness.finish_join()
    finally:
        harness.close()
    assert fired == [1] * trials
    steps = app.steps(harness.last_execution)
    join = next(s for s in steps if s.step == "join")
    assert join.up_ok == width and join.up_pending == 0  # every late success recorded


def run_trials(harness: Harness, trials: int, make: Callable[[threading.Barrier], CompleteFn]
               ) -> list[TrialResult]:
    results = []
    for _ in range(trials):
        results.append(harness.trial(make(threading.Barrier(harness.width))))
        harness.discard()
    return results


@pytest.mark.parametrize(("width", "trials"), [(2, 30), (8, 30)])
def test_naive_unlocked_check_stalls_in_the_same_harness(make_app, width, trials):
    """The seed-000 check without the execution lock, every finisher held between its status
    write and its sibling check, and all checking before any commits (each in its own
    still-open transaction): under READ COMMITTED none sees the others' writes, so every trial
    stalls and none double-fires. This shows the
    harness really produces the collision the engine is tested against, not by luck."""
    wf = fan_in_workflow(width)
    app = make_app(wf)
    harness = Harness(app, width, wf.name)
    try:
        results = run_trials(harness, trials, naive_complete_paused)
    finally:
        harness.close()
    stalled = sum(1 for r in results if not r.join_fired)
    print(f"naive check, width {width}: {stalled} of {trials} trials stalled (join never fired)")
    assert stalled == trials, "a naive check saw the group complete: the pause did not hold"
    assert all(r.decisions == 0 for r in results)  # it stalls, it never double-fires (seed 000)


@pytest.mark.parametrize(("width", "trials"), [(2, 30), (8, 30)])
def test_execution_lock_fixes_the_check_under_the_same_pause(make_app, width, trials):
    """The interleaving that stalls every naive trial, with the execution row locked after the
    pause and before the check: the checks run one after another and exactly one fires. (The
    engine takes that lock before its write, so it cannot pause there with the lock held; its
    tests above use the simultaneous-finish barrier.)"""
    wf = fan_in_workflow(width)
    app = make_app(wf)
    harness = Harness(app, width, wf.name)
    try:
        results = run_trials(harness, trials, locked_complete_paused)
    finally:
        harness.close()
    assert [r.decisions for r in results] == [1] * trials
    assert [r.join_tasks for r in results] == [1] * trials
