"""The pure part of alerting: the forecast of a running execution and the three alert rules.

The forecast is checked against the plan (an execution that has not started yet is forecast
exactly as ``konduit plan`` plans it) and for properties that must hold whatever the DAG and
history (never before now, never before an ended step, later with a higher quantile or a later
now); then the rules on hand-made facts.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.alerts import fan_in_findings, no_success, window_at_risk, window_resolution
from konduit.core.fan_in import Alert, Wait
from konduit.core.forecast import QUANTILES, StepProgress, StepQuantiles, forecast
from konduit.core.workflow import WorkflowSpec
from konduit.errors import WorkflowDefinitionError
from konduit.observe.plan import critical_path
from tests.test_plan import PROPERTIES, dag, flat, weighted_dags

T0 = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


DIAMOND = {"fetch": [], "fast": ["fetch"], "slow": ["fetch"], "join": ["fast", "slow"],
           "publish": ["join"]}
HISTORY = flat(fetch=1, fast=2, slow=5, join=1, publish=3)


# -- the forecast: examples ---------------------------------------------------------------------


def test_a_fresh_execution_is_forecast_like_its_plan() -> None:
    f = forecast(dag(DIAMOND), {}, HISTORY, now=T0)
    assert f.finish_at == at(1 + 5 + 1 + 3)
    assert f.path == ("fetch", "slow", "join", "publish")
    assert f.no_history == ()


def test_ended_steps_count_as_they_ended_and_running_ones_from_their_start() -> None:
    progress = {
        "fetch": StepProgress("succeeded", at(0), at(4)),  # took 4 s instead of 1
        "fast": StepProgress("succeeded", at(4), at(5)),
        "slow": StepProgress("active", at(4)),  # usually 5 s: done at 9
    }
    f = forecast(dag(DIAMOND), progress, HISTORY, now=at(6))
    assert f.finish_at == at(9 + 1 + 3)
    assert f.path == ("slow", "join", "publish")


def test_a_step_running_past_its_usual_span_is_at_least_still_running() -> None:
    progress = {"fetch": StepProgress("succeeded", at(0), at(1)),
                "fast": StepProgress("succeeded", at(1), at(3)),
                "slow": StepProgress("active", at(1))}
    # At 30 s the slow branch (usually 5 s) still runs: it ends no sooner than now.
    f = forecast(dag(DIAMOND), progress, HISTORY, now=at(30))
    assert f.finish_at == at(30 + 1 + 3)
    # The forecast slides with the clock while the straggler keeps running.
    assert forecast(dag(DIAMOND), progress, HISTORY, now=at(40)).finish_at == at(44)


def test_a_finished_dag_is_done_now_and_unknown_steps_are_flagged() -> None:
    spec = dag(DIAMOND)
    done = {s: StepProgress("succeeded", at(0), at(2)) for s in DIAMOND}
    f = forecast(spec, done, HISTORY, now=at(3))
    assert f.finish_at == at(3) and f.path == ()
    f = forecast(spec, {"fetch": StepProgress("succeeded", at(0), at(1))}, flat(fetch=1, join=1),
                 now=at(1))
    assert f.no_history == ("fast", "slow", "publish")
    assert f.finish_at == at(2)  # steps without history weigh nothing


def test_skipped_steps_end_with_their_upstream() -> None:
    spec = dag({"a": [], "b": ["a"], "c": ["b"]})
    progress = {"a": StepProgress("succeeded", at(0), at(1)), "b": StepProgress("skipped")}
    f = forecast(spec, progress, flat(a=1, b=10, c=2), now=at(1))
    assert f.finish_at == at(3) and f.path == ("c",)


# -- the forecast: properties -------------------------------------------------------------------


@st.composite
def running(draw: st.DrawFn) -> tuple[WorkflowSpec, dict[str, StepQuantiles],
                                      dict[str, StepProgress], datetime]:
    """A DAG, its history, and a consistent progress: a prefix of the topological order has
    ended, some of the next steps have fired, the rest wait."""
    spec, durations = draw(weighted_dags())
    ended = draw(st.integers(0, len(spec.order)))
    clock = 0.0
    progress: dict[str, StepProgress] = {}
    for step in spec.order[:ended]:
        start = clock
        clock += draw(st.floats(0, 100))
        status = draw(st.sampled_from(["succeeded", "degraded", "failed", "skipped"]))
        progress[step] = StepProgress(status, None if status == "skipped" else at(start),
                                      None if status == "skipped" else at(clock))
    for step in spec.order[ended:]:
        if all(progress.get(up, StepProgress("waiting")).ended for up in spec[step].after) \
                and draw(st.booleans()):
            progress[step] = StepProgress("active", at(clock))
    now = at(clock + draw(st.floats(0, 100)))
    return spec, durations, progress, now


@PROPERTIES
@given(weighted_dags(), st.sampled_from(QUANTILES))
def test_not_started_means_the_plan(case: tuple[WorkflowSpec, dict[str, StepQuantiles]],
                                    q: str) -> None:
    spec, durations = case
    _, total = critical_path(spec, durations, q)  # type: ignore[arg-type]
    f = forecast(spec, {}, durations, now=T0, quantile=q)  # type: ignore[arg-type]
    assert math.isclose((f.finish_at - T0).total_seconds(), total, abs_tol=1e-3)


@PROPERTIES
@given(running(), st.floats(0, 1000))
def test_forecast_properties(case: tuple[WorkflowSpec, dict[str, StepQuantiles],
                                         dict[str, StepProgress], datetime],
                             later: float) -> None:
    spec, durations, progress, now = case
    by_q = [forecast(spec, progress, durations, now=now, quantile=q) for q in QUANTILES]
    for f in by_q:
        assert f.finish_at >= now
        assert all(f.finish_at >= p.ended_at for p in progress.values() if p.ended_at)
        assert all(not progress.get(s, StepProgress("waiting")).ended for s in f.path)
    # A higher quantile never finishes sooner, and neither does a later clock.
    assert by_q[0].finish_at <= by_q[1].finish_at <= by_q[2].finish_at
    for q, f in zip(QUANTILES, by_q, strict=True):
        moved = forecast(spec, progress, durations, now=now + timedelta(seconds=later), quantile=q)
        assert moved.finish_at >= f.finish_at


# -- the rules -------------------------------------------------------------------------------------


def _forecasts(p50: float, p95: float) -> dict[str, object]:
    spec = dag({"a": []})
    return {"p50": forecast(spec, {}, flat(a=p50), now=T0),
            "p95": forecast(spec, {}, flat(a=p95), now=T0)}


def test_window_at_risk_warns_when_the_p95_crosses_and_is_critical_when_the_p50_does() -> None:
    window = at(10)
    assert window_at_risk("e1", "wf", window=window, now=T0, **_forecasts(5, 9)) is None  # type: ignore[arg-type]
    assert window_at_risk("e1", "wf", window=window, now=T0, **_forecasts(5, 10)) is None  # type: ignore[arg-type]
    warn = window_at_risk("e1", "wf", window=window, now=T0, **_forecasts(5, 12))  # type: ignore[arg-type]
    assert warn is not None and warn.severity == "warning"
    assert warn.key == ("window_at_risk", "e1") and warn.execution_id == "e1"
    assert "after its window" in warn.message and warn.details["p95_slack_seconds"] == -2
    crit = window_at_risk("e1", "wf", window=window, now=T0, **_forecasts(11, 12))  # type: ignore[arg-type]
    assert crit is not None and crit.severity == "critical"
    # Past the window and still running: critical whatever the forecast says.
    f = forecast(dag({"a": []}), {}, {}, now=at(11))
    late = window_at_risk("e1", "wf", window=window, now=at(11), p50=f, p95=f)
    assert late is not None and late.severity == "critical" and late.details["missed"]
    assert "past its window" in late.message


def test_window_resolutions_say_how_the_execution_ended() -> None:
    assert window_resolution("running", None, None)["resolution"] == \
        "forecast back inside the window"
    assert window_resolution("succeeded", at(10), at(9))["resolution"] == \
        "execution succeeded inside its window"
    missed = window_resolution("succeeded", at(10), at(12.5))
    assert missed["missed_by_seconds"] == 2.5 and "after its window" in missed["resolution"]
    assert window_resolution(None, None, None)["resolution"] == "execution no longer exists"


def test_fan_in_findings_follow_the_stats_rule() -> None:
    waits = (Wait(25.0, "slow", False, "x1"), Wait(30.0, None, True, "x2"))
    [found] = fan_in_findings([Alert("wf", "join", waits, 20.0)])
    assert found.key == ("fan_in_wait", "wf/join") and found.workflow == "wf"
    assert found.severity == "critical"  # the last join is still waiting
    assert found.details["straggler"] == "slow" and "fan-in wait above 20s" in found.message
    [found] = fan_in_findings([Alert("wf", "join", waits[:1], 20.0)])
    assert found.severity == "warning"


def test_no_success_counts_from_the_last_success_or_the_registration() -> None:
    day = 86400.0
    assert no_success("wf", threshold=day, now=at(day), last_success_at=at(1),
                      registered_at=at(0)) is None
    found = no_success("wf", threshold=day, now=at(2 * day), last_success_at=at(1),
                       registered_at=at(0))
    assert found is not None and found.key == ("no_success", "wf")
    assert "no successful execution for more than 24h" in found.message
    never = no_success("wf", threshold=60, now=at(120), last_success_at=None, registered_at=at(0))
    assert never is not None and "never succeeded" in never.message
    assert no_success("wf", threshold=60, now=at(30), last_success_at=None,
                      registered_at=at(0)) is None


def test_alert_after_no_success_is_checked_at_definition() -> None:
    wf = konduit.Workflow("nightly", version=1, alert_after_no_success="26h")
    assert wf.alert_after_no_success == 26 * 3600

    @wf.step()
    def only(ctx: konduit.Context) -> None: ...

    assert wf.compile().alert_after_no_success == 26 * 3600
    # An operating setting, not part of the DAG: the same definition without it is the same.
    bare = konduit.Workflow("nightly", version=1)
    bare.step(name="only")(only)
    assert bare.compile().spec_hash == wf.compile().spec_hash
    with pytest.raises(WorkflowDefinitionError, match="alert_after_no_success"):
        konduit.Workflow("x", alert_after_no_success="soon")
    with pytest.raises(WorkflowDefinitionError, match="positive"):
        konduit.Workflow("x", alert_after_no_success=0)
