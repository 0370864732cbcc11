"""Window-aware budgets and seed 004's adaptive defaults: the pure rules (no database).

konduit.core.budgets decides a branch's budget from its own deadline, the time left in its
execution's window and the p95 of the critical path downstream of it; konduit.engine.deadlines
turns a step's history into its own adaptive budget. The storage and end-to-end halves are in
tests/test_adaptive_defaults.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.budgets import (
    MIN_WINDOW_BUDGET,
    Budget,
    downstream_reserves,
    minimum_budget,
    window_budget,
)
from konduit.engine.deadlines import MIN_SAMPLES, adaptive_budget
from konduit.observe.budgets import plan_budgets
from konduit.observe.plan import StepQuantiles, build_plan


def test_adaptive_defaults_are_seed_004s_rule() -> None:
    d = konduit.Deadline.adaptive()
    assert (d.factor, d.quantile, d.window) == (1.5, 0.99, 7 * 86400.0)
    assert (d.floor, d.ceiling, d.default) == (10.0, 45.0, None)
    assert adaptive_budget(d, None, 0) == 45.0  # no history at all
    assert adaptive_budget(d, 0.2, MIN_SAMPLES - 1) == 45.0  # thin history
    assert adaptive_budget(d, 0.2, MIN_SAMPLES) == 10.0  # fast history: the floor
    assert adaptive_budget(d, 20.0, MIN_SAMPLES) == 30.0  # 1.5 x p99
    assert adaptive_budget(d, 100.0, 500) == 45.0  # slow history: the ceiling
    # A zero quantile (instant runs) still gives the floor, never "no deadline".
    assert adaptive_budget(d, 0.0, 500) == 10.0


def test_explicit_adaptive_arguments_still_rule() -> None:
    d = konduit.Deadline.adaptive(factor=2.0, quantile=0.5, window="1d", floor="100ms",
                                  ceiling="60s", default="5s")
    assert adaptive_budget(d, None, 0) == 5.0  # default= wins over the ceiling while thin
    assert adaptive_budget(d, 0.01, MIN_SAMPLES) == 0.1  # its own floor
    assert adaptive_budget(d, 40.0, MIN_SAMPLES) == 60.0  # its own ceiling
    no_ceiling = konduit.Deadline.adaptive(ceiling=None, default="20s")
    assert adaptive_budget(no_ceiling, None, 0) == 20.0
    assert adaptive_budget(no_ceiling, 1000.0, MIN_SAMPLES) == 1500.0
    # Static deadlines are untouched by the adaptive defaults.
    assert adaptive_budget(konduit.Deadline.static("2s"), None, 0) == 2.0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"floor": "0s"}, "floor must be > 0"),
    ({"ceiling": None}, "needs a default"),
    ({"floor": "30s", "ceiling": "20s"}, "below its floor"),
    ({"default": "0s"}, "default must be > 0"),
])
def test_an_adaptive_deadline_can_never_mean_no_deadline(kwargs: dict[str, object],
                                                         match: str) -> None:
    with pytest.raises(konduit.WorkflowDefinitionError, match=match):
        konduit.Deadline.adaptive(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(konduit.WorkflowDefinitionError, match="floor must be > 0"):
        konduit.Deadline(adaptive_=True, floor=0.0)  # built by hand: checked too


def test_the_default_adaptive_policy_is_part_of_the_spec() -> None:
    assert konduit.Deadline.adaptive().to_spec() == {
        "adaptive": True, "factor": 1.5, "quantile": 0.99, "window": 604800.0, "floor": 10.0,
        "ceiling": 45.0, "default": None}


def test_window_budget_takes_the_smaller_of_own_and_window_minus_reserve() -> None:
    assert window_budget(45.0, window_left=None, reserve=5.0, minimum=10.0) == Budget(45.0, 45.0)
    roomy = window_budget(45.0, window_left=3600.0, reserve=60.0, minimum=10.0)
    assert (roomy.seconds, roomy.cut, roomy.reserve) == (45.0, False, 60.0)
    tight = window_budget(45.0, window_left=30.0, reserve=8.0, minimum=10.0)
    assert (tight.seconds, tight.own, tight.cut, tight.reserve, tight.window_left) == \
        (22.0, 45.0, True, 8.0, 30.0)
    # Never below the step's minimum, even with the window spent or already past ...
    assert window_budget(45.0, window_left=12.0, reserve=8.0, minimum=10.0).seconds == 10.0
    past = window_budget(45.0, window_left=-30.0, reserve=8.0, minimum=10.0)
    assert (past.seconds, past.cut) == (10.0, True)
    # ... and a cut never lengthens a budget shorter than that minimum.
    short = window_budget(2.0, window_left=1.0, reserve=5.0, minimum=2.0)
    assert (short.seconds, short.cut) == (2.0, False)
    # Exactly enough room: not a cut.
    assert not window_budget(20.0, window_left=25.0, reserve=5.0, minimum=1.0).cut


def test_the_minimum_is_the_adaptive_floor_or_one_second() -> None:
    assert minimum_budget(konduit.Deadline.adaptive(), 45.0) == 10.0
    assert minimum_budget(konduit.Deadline.adaptive(floor="2s"), 45.0) == 2.0
    assert minimum_budget(konduit.Deadline.static("30s"), 30.0) == MIN_WINDOW_BUDGET == 1.0
    assert minimum_budget(konduit.Deadline.static("300ms"), 0.3) == 0.3  # never above its own


@given(own=st.floats(0.01, 1e5), left=st.floats(-1e5, 1e5), reserve=st.floats(0, 1e5),
       minimum=st.floats(0, 1e3))
def test_window_budget_bounds(own: float, left: float, reserve: float, minimum: float) -> None:
    b = window_budget(own, window_left=left, reserve=reserve, minimum=minimum)
    assert min(minimum, own) <= b.seconds <= own
    assert b.seconds > 0
    assert b.cut == (b.seconds < own)
    if b.cut and b.seconds > max(minimum, 0.001):
        assert b.seconds == pytest.approx(left - reserve)


def _pipeline() -> konduit.Workflow:
    """transcribe -> (cover, captions) -> publish -> notify; cover has the deadline."""
    wf = konduit.Workflow("budget-plan", version=1)

    @wf.step()
    def transcribe(ctx): ...

    @wf.step(after=[transcribe], deadline=konduit.Deadline.static("30s"))
    def cover(ctx): ...

    @wf.step(after=[transcribe])
    def captions(ctx): ...

    @wf.step(after=[cover, captions])
    def publish(ctx): ...

    @wf.step(after=[publish])
    def notify(ctx): ...

    return wf


def test_downstream_reserve_is_the_longest_path_after_the_step() -> None:
    spec = _pipeline().spec
    weights = {"transcribe": 1.0, "cover": 4.0, "captions": 9.0, "publish": 2.0, "notify": 0.5}
    reserves = downstream_reserves(spec, weights)
    assert reserves["notify"] == 0.0
    assert reserves["publish"] == 0.5
    assert reserves["cover"] == reserves["captions"] == 2.5
    assert reserves["transcribe"] == 9.0 + 2.5  # through its slower branch
    # Steps without history weigh nothing.
    assert downstream_reserves(spec, {})["transcribe"] == 0.0


def test_a_plan_predicts_the_budget_the_window_would_cut() -> None:
    spec = _pipeline().spec
    q = {name: StepQuantiles(p50=s, p95=s, p99=s, samples=5) for name, s in
         {"transcribe": 1.0, "cover": 4.0, "captions": 2.0, "publish": 2.0, "notify": 0.5}.items()}
    start = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
    plenty = plan_budgets(spec, build_plan(spec, q, start=start,
                                           window=start + timedelta(hours=1)), {"cover": 30.0})
    assert plenty["cover"].seconds == 30.0 and not plenty["cover"].cut
    tight = plan_budgets(spec, build_plan(spec, q, start=start,
                                          window=start + timedelta(seconds=20)), {"cover": 30.0})
    # cover starts after transcribe's p95 (1 s): 19 s left, minus publish + notify (2.5 s).
    assert tight["cover"].cut and tight["cover"].seconds == pytest.approx(16.5)
    assert tight["cover"].reserve == pytest.approx(2.5)
    no_window = plan_budgets(spec, build_plan(spec, q, start=start), {"cover": 30.0})
    assert not no_window["cover"].cut and no_window["cover"].reserve is None
