"""The pure tick arithmetic of schedules (konduit.core.schedules): when a schedule ticks, DST in
Europe/Berlin (computed, no sleeping), which due ticks a round starts under each missed policy,
and the definition-time checks of ``wf.schedule``."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.schedules import (
    LATE_AFTER,
    MISSED_POLICIES,
    Timing,
    plan_ticks,
    tick_key,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


BERLIN = "Europe/Berlin"


# -- DST -----------------------------------------------------------------------------------------


def test_a_fixed_time_in_berlin_fires_once_a_day_across_the_spring_change() -> None:
    # 2026-03-29: at 02:00 CET the clocks jump to 03:00 CEST, so 02:30 does not exist that day.
    timing = Timing.of(cron="30 2 * * *", timezone=BERLIN)
    ticks = list(timing.ticks(utc(2026, 3, 26, 12), utc(2026, 3, 31, 12)))
    assert ticks == [
        utc(2026, 3, 27, 1, 30),  # 02:30 CET
        utc(2026, 3, 28, 1, 30),  # 02:30 CET
        utc(2026, 3, 29, 1, 0),   # 03:00 CEST: the skipped time fires right after the gap, once
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
        utc(2026, 3, 31, 0, 30),
    ]


def test_a_fixed_time_in_berlin_fires_once_a_day_across_the_autumn_change() -> None:
    # 2026-10-25: at 03:00 CEST the clocks go back to 02:00 CET, so 02:30 happens twice.
    timing = Timing.of(cron="30 2 * * *", timezone=BERLIN)
    ticks = list(timing.ticks(utc(2026, 10, 23, 12), utc(2026, 10, 27, 12)))
    assert ticks == [
        utc(2026, 10, 24, 0, 30),  # 02:30 CEST
        utc(2026, 10, 25, 0, 30),  # 02:30 CEST, the first of the two: once, not twice
        utc(2026, 10, 26, 1, 30),  # 02:30 CET
        utc(2026, 10, 27, 1, 30),
    ]


def test_the_nightly_schedule_stays_at_five_in_the_morning_local_time() -> None:
    timing = Timing.of(cron="0 5 * * *", timezone=BERLIN)
    spring = list(timing.ticks(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12)))
    autumn = list(timing.ticks(utc(2026, 10, 23, 12), utc(2026, 10, 26, 12)))
    assert spring == [utc(2026, 3, 28, 4), utc(2026, 3, 29, 3), utc(2026, 3, 30, 3)]
    assert autumn == [utc(2026, 10, 24, 3), utc(2026, 10, 25, 4), utc(2026, 10, 26, 4)]
    from zoneinfo import ZoneInfo

    assert {t.astimezone(ZoneInfo(BERLIN)).hour for t in spring + autumn} == {5}
    assert [tick_key("nightly", t) for t in spring[1:2]] == ["schedule:nightly:2026-03-29T03:00:00Z"]


def test_a_wildcard_expression_follows_real_time_through_the_repeated_hour() -> None:
    # Every 30 minutes of real time: local 02:00 and 02:30 come twice that night, so do the ticks.
    timing = Timing.of(cron="*/30 * * * *", timezone=BERLIN)
    ticks = list(timing.ticks(utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 1, 45)))
    assert ticks == [utc(2026, 10, 25, 0, 0), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 0),
                     utc(2026, 10, 25, 1, 30)]
    spring = list(timing.ticks(utc(2026, 3, 29, 0, 15), utc(2026, 3, 29, 1, 45)))
    assert spring == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 30)]


def test_a_start_inside_the_repeated_hour_never_yields_an_earlier_tick() -> None:
    # 01:15 UTC is 02:15 CET, the second 02:15 of the night; 02:30 CEST (00:30 UTC) is past.
    timing = Timing.of(cron="30 2 * * *", timezone=BERLIN)
    assert timing.next_after(utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 26, 1, 30)


def test_missed_ticks_across_the_dst_weekend_are_computed_not_slept() -> None:
    # No worker ran from Friday evening to Monday morning over the spring change.
    timing = Timing.of(cron="0 5 * * *", timezone=BERLIN)
    last, now = utc(2026, 3, 27, 18), utc(2026, 3, 30, 8)
    everything = plan_ticks(timing, "all", last, now)
    assert everything.start == (utc(2026, 3, 28, 4), utc(2026, 3, 29, 3), utc(2026, 3, 30, 3))
    latest = plan_ticks(timing, "latest", last, now)
    assert latest.start == (utc(2026, 3, 30, 3),) and latest.passed_over
    skipped = plan_ticks(timing, "skip", last, now)
    assert skipped.start == () and skipped.advance_to == utc(2026, 3, 30, 3)


def test_every_counts_from_the_epoch_so_every_worker_agrees_on_the_ticks() -> None:
    timing = Timing.of(every="15m")
    ticks = list(timing.ticks(utc(2026, 11, 30, 4, 7, 12), utc(2026, 11, 30, 5, 0)))
    assert ticks == [utc(2026, 11, 30, 4, 15), utc(2026, 11, 30, 4, 30), utc(2026, 11, 30, 4, 45),
                     utc(2026, 11, 30, 5, 0)]


def test_recent_does_not_walk_a_long_gap_and_finds_sparse_ticks() -> None:
    yearly = Timing.of(cron="0 0 1 1 *")
    assert yearly.recent(utc(2019, 6, 1), utc(2026, 11, 30), 2) == [utc(2025, 1, 1), utc(2026, 1, 1)]
    minutely = Timing.of(cron="* * * * *", timezone=BERLIN)  # a year of minutes: not walked
    assert minutely.recent(utc(2025, 11, 30), utc(2026, 11, 30, 4, 0, 30), 3) == [
        utc(2026, 11, 30, 3, 58), utc(2026, 11, 30, 3, 59), utc(2026, 11, 30, 4, 0)]


@settings(max_examples=100, deadline=None)
@given(cron=st.sampled_from(["0 0 1 * *", "0 5 * * 1", "0 0 29 2 *", "30 2 * * *"]),
       zone=st.sampled_from(["UTC", BERLIN, "Australia/Lord_Howe"]),
       after_days=st.integers(0, 3 * 365), gap_days=st.integers(0, 3 * 365),
       count=st.integers(1, 12))
def test_recent_is_the_tail_of_the_full_walk(cron: str, zone: str, after_days: int,
                                             gap_days: int, count: int) -> None:
    timing = Timing.of(cron=cron, timezone=zone)
    after = utc(2024, 1, 1) + timedelta(days=after_days, seconds=after_days * 37)
    until = after + timedelta(days=gap_days, seconds=gap_days * 53)
    assert timing.recent(after, until, count) == list(timing.ticks(after, until))[-count:]


# -- missed policies -----------------------------------------------------------------------------

EVERY_MINUTE = Timing.of(every="1m")


@pytest.mark.parametrize(("missed", "expected"), [
    ("skip", [utc(2026, 11, 30, 4, 10)]),
    ("latest", [utc(2026, 11, 30, 4, 10)]),
    ("all", [utc(2026, 11, 30, 4, m) for m in range(2, 11)]),
])
def test_an_on_time_tick_always_starts_and_the_policy_decides_the_missed_ones(
    missed: str, expected: list[datetime]
) -> None:
    # Handled up to 04:01; a round at 04:10:05 finds 04:02..04:09 missed and 04:10 on time.
    plan = plan_ticks(EVERY_MINUTE, missed, utc(2026, 11, 30, 4, 1), utc(2026, 11, 30, 4, 10, 5))
    assert list(plan.start) == expected
    assert plan.advance_to == utc(2026, 11, 30, 4, 10)
    assert plan.passed_over == (missed != "all")


@pytest.mark.parametrize(("missed", "expected"), [
    ("skip", []),
    ("latest", [utc(2026, 11, 30, 4, 10)]),
    ("all", [utc(2026, 11, 30, 4, m) for m in range(2, 11)]),
])
def test_only_missed_ticks(missed: str, expected: list[datetime]) -> None:
    plan = plan_ticks(EVERY_MINUTE, missed, utc(2026, 11, 30, 4, 1), utc(2026, 11, 30, 4, 10, 30))
    assert list(plan.start) == expected
    assert plan.advance_to == utc(2026, 11, 30, 4, 10)


def test_all_is_bounded_to_the_most_recent_missed_ticks() -> None:
    plan = plan_ticks(EVERY_MINUTE, "all", utc(2026, 1, 1), utc(2026, 11, 30, 4, 0, 30),
                      max_catch_up=5)
    assert list(plan.start) == [utc(2026, 11, 30, 3, 56) + timedelta(minutes=i) for i in range(5)]
    assert plan.passed_over and plan.advance_to == utc(2026, 11, 30, 4, 0)


def test_nothing_due_changes_nothing() -> None:
    plan = plan_ticks(EVERY_MINUTE, "all", utc(2026, 11, 30, 4, 1), utc(2026, 11, 30, 4, 1, 59))
    assert plan.start == () and plan.advance_to is None and not plan.passed_over
    assert plan_ticks(EVERY_MINUTE, "all", utc(2026, 11, 30, 4, 1), utc(2026, 11, 30, 4)).start == ()


TIMINGS = st.one_of(
    st.integers(min_value=1, max_value=90).map(lambda s: Timing.of(every=s)),
    st.tuples(
        st.sampled_from(["* * * * *", "*/7 * * * *", "30 2 * * *", "0 5 * * *", "15 */3 * * *",
                         "0 0 1 * *", "*/20 * * * * *"]),
        st.sampled_from(["UTC", BERLIN, "America/New_York", "Australia/Lord_Howe"]),
    ).map(lambda ct: Timing.of(cron=ct[0], timezone=ct[1])),
)
# Around both of Berlin's changes in 2026, and an ordinary week.
BASES = st.sampled_from([utc(2026, 3, 28, 22), utc(2026, 10, 24, 22), utc(2026, 11, 29)])


def _gap(timing: Timing) -> st.SearchStrategy[float]:
    # Keep the oracle's full enumeration of due ticks small.
    longest = 3 * 3600.0 if timing.every is not None or timing.cron == "*/20 * * * * *" else 2 * 86400.0
    return st.one_of(st.floats(0, 30), st.floats(0, longest))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timing=TIMINGS, base=BASES, data=st.data(),
       missed=st.sampled_from(MISSED_POLICIES), catch_up=st.sampled_from([1, 3, 100]))
def test_plan_matches_the_policy_over_every_due_tick(
    timing: Timing, base: datetime, data: st.DataObject, missed: str, catch_up: int
) -> None:
    last = base + timedelta(seconds=data.draw(st.integers(0, 4 * 3600)))
    now = last + timedelta(seconds=data.draw(_gap(timing)))
    due = list(timing.ticks(last, now))  # the oracle: every due tick, walked one by one
    assert due == sorted(set(due)) and all(last < t <= now for t in due)
    on_time = [t for t in due if (now - t).total_seconds() < LATE_AFTER]
    missed_ticks = [t for t in due if t not in on_time]
    expected = {
        "skip": on_time,
        "latest": on_time or missed_ticks[-1:],
        "all": missed_ticks[-catch_up:] + on_time,
    }[missed]
    plan = plan_ticks(timing, missed, last, now, max_catch_up=catch_up)
    assert list(plan.start) == expected
    assert plan.advance_to == (due[-1] if due else None)
    assert plan.passed_over == any(t not in plan.start for t in due)


@settings(max_examples=150, deadline=None)
@given(timing=TIMINGS, base=BASES, missed=st.sampled_from(MISSED_POLICIES),
       steps=st.lists(st.floats(0, LATE_AFTER - 0.5), min_size=1, max_size=60))
def test_rounds_at_most_late_after_apart_start_every_tick_exactly_once(
    timing: Timing, base: datetime, missed: str, steps: list[float]
) -> None:
    # While workers run, some worker looks at least every few seconds: whatever the policy, no
    # tick is missed and none starts twice.
    last = now = base
    started: list[datetime] = []
    for step in steps:
        now += timedelta(seconds=step)
        plan = plan_ticks(timing, missed, last, now)
        started += plan.start
        assert not plan.passed_over
        if plan.advance_to is not None:
            last = plan.advance_to
    assert started == list(timing.ticks(base, now))


@settings(max_examples=100, deadline=None)
@given(timing=TIMINGS, base=BASES, a=st.integers(0, 86400), b=st.integers(0, 86400))
def test_ticks_split_anywhere_are_the_same_ticks(
    timing: Timing, base: datetime, a: int, b: int
) -> None:
    if (timing.every is not None and timing.every < 30) or timing.cron == "*/20 * * * * *":
        b = min(b, 3600)
    start, middle = base, base + timedelta(seconds=min(a, b))
    end = base + timedelta(seconds=max(a, b))
    whole = list(timing.ticks(start, end))
    assert whole == list(timing.ticks(start, middle)) + list(timing.ticks(middle, end))
    assert all(x < y for x, y in itertools.pairwise(whole))


# -- definition-time checks -----------------------------------------------------------------------


def _wf(name: str = "nightly-publish") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name="publish")(lambda ctx: None)
    return wf


@pytest.mark.parametrize(("options", "message"), [
    ({}, "exactly one of cron= or every="),
    ({"cron": "0 5 * * *", "every": "1h"}, "exactly one of cron= or every="),
    ({"cron": "0 25 * * *"}, "bad cron expression '0 25 \\* \\* \\*'"),
    ({"cron": "0 5 * *"}, "bad cron expression"),
    ({"cron": "0 0 31 2 *"}, "bad cron expression"),
    ({"cron": "0 5 * * *", "timezone": "Europe/Berlln"}, "unknown timezone 'Europe/Berlln'"),
    ({"every": "soon"}, "cannot read 'soon' as a duration"),
    ({"every": "500ms"}, "whole number of seconds, at least 1"),
    ({"every": 0}, "whole number of seconds, at least 1"),
    ({"every": "1h", "timezone": BERLIN}, "timezone= applies to cron= schedules only"),
    ({"every": "1h", "window": "soon"}, "window: cannot read 'soon'"),
    ({"every": "1h", "window": 0}, "window= must be longer than zero"),
    ({"every": "1h", "missed": "never"}, "missed= must be one of 'skip', 'latest', 'all'"),
    ({"every": "1h", "input": {"at": datetime(2026, 1, 1)}}, "input is not JSON"),
    ({"every": "1h", "name": "no spaces please"}, "a schedule name is"),
])
def test_bad_schedules_fail_at_definition_naming_the_schedule(
    options: dict[str, object], message: str
) -> None:
    wf = _wf()
    name = options.get("name", "nightly")
    options = {"name": "nightly", **options}
    with pytest.raises(konduit.WorkflowDefinitionError, match=message) as caught:
        wf.schedule(**options)  # type: ignore[arg-type]
    assert f"schedule {name!r}" in str(caught.value)
    assert "workflow 'nightly-publish'" in str(caught.value)


def test_a_schedule_name_is_unique_across_the_app() -> None:
    wf = _wf()
    wf.schedule(every="1h")
    with pytest.raises(konduit.WorkflowDefinitionError,
                       match="schedule 'nightly-publish' is defined twice: give each"):
        wf.schedule(cron="0 5 * * *")
    other = _wf("reindex")
    other.schedule(cron="0 3 * * *", name="nightly-publish")
    with pytest.raises(konduit.WorkflowDefinitionError,
                       match="schedule 'nightly-publish' is defined twice: on workflow "
                             "'nightly-publish' version 1 and on workflow 'reindex'"):
        konduit.App([wf, other])


def test_a_schedule_after_the_app_was_made_is_refused() -> None:
    wf = _wf()
    konduit.App([wf])
    with pytest.raises(konduit.WorkflowDefinitionError, match="define schedules before"):
        wf.schedule(every="1h")


def test_a_good_schedule_is_described_and_keyed() -> None:
    wf = _wf()
    made = wf.schedule(cron="0  5 * * *", timezone=BERLIN, input={"channel": "web"},
                       window="1h", name="nightly", missed="latest")
    assert wf.schedules == (made,)
    assert made.timing.describe() == "0 5 * * * (Europe/Berlin)"
    assert [Timing.of(every=e).describe() for e in ("1s", "90s", "1h", "1d1h1m1s")] == [
        "every 1s", "every 1m30s", "every 1h", "every 1d1h1m1s"]
    assert made.window == 3600.0 and made.version == 1 and made.workflow == "nightly-publish"
    assert made.key(utc(2026, 11, 30, 4)) == "schedule:nightly:2026-11-30T04:00:00Z"
    assert wf.schedule(every="10s", name="often").missed == "latest"
    assert wf.spec.spec_hash == _wf().spec.spec_hash  # schedules are not part of the version
