"""Window-aware budgets and seed 004's adaptive defaults: the pure rules (no database).

konduit.core.budgets decides a branch's budget from its own deadline, the time left in its
execution's window and the reserve (fallback, dispatch, p99 downstream, finish, margin);
konduit.engine.deadlines turns a step's history into its own adaptive budget. The storage and
end-to-end halves are in tests/test_adaptive_defaults.py and tests/test_window_margins.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.budgets import (
    IMMEDIATE,
    MARGIN_FRACTION,
    MIN_MARGIN,
    Budget,
    Overheads,
    Reserve,
    downstream_reserves,
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
    assert window_budget(45.0, window_left=None, reserve=5.0) == Budget(45.0, 45.0)
    roomy = window_budget(45.0, window_left=3600.0, reserve=60.0)
    assert (roomy.seconds, roomy.cut, roomy.reserve) == (45.0, False, 60.0)
    tight = window_budget(45.0, window_left=30.0, reserve=8.0)
    assert (tight.seconds, tight.own, tight.cut, tight.reserve, tight.window_left) == \
        (22.0, 45.0, True, 8.0, 30.0)
    # Exactly enough room: not a cut.
    assert not window_budget(20.0, window_left=25.0, reserve=5.0).cut


def test_the_window_wins_over_the_adaptive_floor() -> None:
    """An 8 s window under Deadline.adaptive() (floor 10 s): before, the cut stopped at the
    floor and the execution missed its window by 3.5-3.8 s. The floor bounds what history may
    shorten a budget to, not what a window needs."""
    own = adaptive_budget(konduit.Deadline.adaptive(), 0.2, MIN_SAMPLES)
    assert own == 10.0  # the floor
    b = window_budget(own, window_left=8.0, reserve=1.5)
    assert b.cut and b.seconds == pytest.approx(6.5) and not b.unkeepable


def test_a_window_that_leaves_nothing_runs_the_fallback_at_once_and_says_so() -> None:
    spent = window_budget(45.0, window_left=1.0, reserve=1.5)
    assert (spent.seconds, spent.cut, spent.unkeepable) == (IMMEDIATE, True, True)
    past = window_budget(45.0, window_left=-30.0, reserve=8.0)
    assert (past.seconds, past.cut, past.unkeepable) == (IMMEDIATE, True, True)
    # With room, however little, the branch gets it and the window is keepable.
    assert not window_budget(45.0, window_left=1.6, reserve=1.5).unkeepable
    assert not window_budget(45.0, window_left=None, reserve=1.5).unkeepable


def test_the_reserve_covers_everything_after_the_deadline() -> None:
    """The parts of docs/deadlines.md's worked example: fallback 0.4 s, dispatch 0.05 s,
    publish + notify 2.5 s (p99), finish 0.05 s; the margin is a tenth of those 3 s."""
    r = Reserve.of(2.5, Overheads(fallback=0.4, dispatch=0.05, finish=0.05))
    assert (r.fallback, r.dispatch, r.downstream, r.finish) == (0.4, 0.05, 2.5, 0.05)
    assert r.margin == pytest.approx(0.3) and r.seconds == pytest.approx(3.3)
    # A final step has no join to dispatch; a small reserve still keeps the least margin.
    last = Reserve.of(0.0, Overheads(fallback=0.1, dispatch=0.05, finish=0.01), final=True)
    assert last.dispatch == 0.0 and last.margin == MIN_MARGIN
    b = window_budget(45.0, window_left=20.0, reserve=r)
    assert b.reserve == pytest.approx(3.3) and b.parts == r
    assert b.seconds == pytest.approx(20.0 - 3.3)


@given(own=st.floats(0.01, 1e5), left=st.floats(-1e5, 1e5), reserve=st.floats(0, 1e5))
def test_window_budget_bounds(own: float, left: float, reserve: float) -> None:
    b = window_budget(own, window_left=left, reserve=reserve)
    assert 0 < b.seconds <= own
    assert b.cut == (b.seconds < own)
    # A budget never reaches past the window's edge minus its reserve, unless that is gone
    # (then it is the token budget: the fallback at once).
    assert b.seconds <= max(left - reserve, IMMEDIATE) + 1e-9
    assert b.unkeepable == (left - reserve <= IMMEDIATE)
    if b.cut and not b.unkeepable:
        assert b.seconds == pytest.approx(left - reserve)


@given(downstream=st.floats(0, 1e4), fallback=st.floats(0, 1e3), dispatch=st.floats(0, 1e3),
       finish=st.floats(0, 1e3), final=st.booleans())
def test_a_reserve_is_its_parts_and_a_margin(downstream: float, fallback: float,
                                            dispatch: float, finish: float,
                                            final: bool) -> None:
    r = Reserve.of(downstream, Overheads(fallback, dispatch, finish), final=final)
    measured = fallback + (0.0 if final else dispatch) + downstream + finish
    assert r.seconds == pytest.approx(measured + r.margin)
    assert r.margin >= MIN_MARGIN and r.margin >= MARGIN_FRACTION * measured - 1e-9


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
    # cover starts after transcribe's p95 (1 s): 19 s left, minus the reserve: publish + notify
    # (2.5 s, p99) and the default overheads (0.5 s fallback, 0.1 s dispatch, 0.1 s finish),
    # and a margin of a tenth of those 3.2 s.
    reserve = (2.5 + 0.5 + 0.1 + 0.1) * 1.1
    assert tight["cover"].cut and tight["cover"].seconds == pytest.approx(19.0 - reserve)
    assert tight["cover"].reserve == pytest.approx(reserve)
    # Given the engine's reserves, the plan keeps exactly those.
    given_reserves = {s: Reserve(downstream=1.0) for s in spec.order}
    same = plan_budgets(spec, build_plan(spec, q, start=start,
                                         window=start + timedelta(seconds=20)),
                        {"cover": 30.0}, given_reserves)
    assert same["cover"].seconds == pytest.approx(18.0)
    no_window = plan_budgets(spec, build_plan(spec, q, start=start), {"cover": 30.0})
    assert not no_window["cover"].cut and no_window["cover"].reserve is None
