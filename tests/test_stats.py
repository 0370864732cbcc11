"""Stats (``konduit stats``): per-branch latency, per-join fan-in wait, the seed-004 alert.

The alert rule (:func:`konduit.observe.stats.fan_in_alert`) is pure and tested on its own, with
properties against a brute-force reading of "the last N executions all waited too long"; then
stats are read from the real history of a fan-out/fan-in workflow with one slow branch, run by a
real worker, and the CLI prints them and exits 3 on an alert.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import konduit
from konduit.core.durations import format_duration, parse_duration
from konduit.db.database import Database
from konduit.observe.stats import (
    ALERT_EXIT_CODE,
    Alert,
    JoinStats,
    Stats,
    StatsError,
    Wait,
    build_stats,
    fan_in_alert,
    fan_in_alerts,
    load_stats,
    stats_renderables,
)
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_cli import assert_clean_error, konduit_cli


def waits(*seconds: float) -> list[Wait]:
    return [Wait(s, straggler=f"b{i}") for i, s in enumerate(seconds)]


# -- the alert rule ------------------------------------------------------------------------------


def test_seed_004_two_runs_over_20s_page() -> None:
    assert fan_in_alert(waits(3, 25, 31), threshold=20, consecutive=2) == tuple(waits(3, 25, 31)[1:])
    assert fan_in_alert(waits(25), threshold=20, consecutive=2) is None  # one run is not two
    assert fan_in_alert([], threshold=20, consecutive=2) is None


def test_the_threshold_must_be_exceeded_not_reached() -> None:
    assert fan_in_alert(waits(20, 20), threshold=20, consecutive=2) is None
    assert fan_in_alert(waits(20.001, 20.001), threshold=20, consecutive=2) is not None
    assert fan_in_alert(waits(0.001), threshold=0, consecutive=1) is not None


def test_a_fast_run_in_between_resets_the_count() -> None:
    history = waits(25, 4, 25)
    assert fan_in_alert(history, threshold=20, consecutive=2) is None
    history.append(Wait(22))
    assert fan_in_alert(history, threshold=20, consecutive=2) is not None
    history.append(Wait(1))  # recovered: the alert clears with the next fast run
    assert fan_in_alert(history, threshold=20, consecutive=2) is None


def test_the_consecutive_count_is_respected() -> None:
    assert fan_in_alert(waits(30, 30), threshold=20, consecutive=3) is None
    assert fan_in_alert(waits(30, 30, 30), threshold=20, consecutive=3) is not None
    assert fan_in_alert(waits(30), threshold=20, consecutive=1) is not None
    with pytest.raises(StatsError, match="--consecutive"):
        fan_in_alert(waits(30), threshold=20, consecutive=0)


def test_an_alert_names_the_most_recent_straggler() -> None:
    alert = Alert("nightly", "publish", (Wait(25, "cover_image"), Wait(40, "translate")), 20)
    assert alert.straggler == "translate"
    data = alert.to_json()
    assert data["waits"] == [25, 40] and data["straggler"] == "translate"
    assert data["still_waiting"] is False
    assert "nightly/publish" in alert.describe() and "20s" in alert.describe()
    # A join still waiting has no straggler yet: the last one known is named.
    open_wait = Alert("nightly", "publish", (Wait(25, "cover_image"), Wait(21, waiting=True)), 20)
    assert open_wait.straggler == "cover_image"
    assert open_wait.to_json()["still_waiting"] is True
    assert "so far" in open_wait.describe()


def test_alerts_are_per_join() -> None:
    recent = {
        ("wf", "publish"): waits(25, 30),
        ("wf", "merge"): waits(30, 2),
        ("other", "publish"): waits(21, 22),
    }
    alerts = fan_in_alerts(recent, threshold=20, consecutive=2)
    assert [(a.workflow, a.join) for a in alerts] == [("other", "publish"), ("wf", "publish")]


def trailing_slow(seconds: list[float], threshold: float) -> int:
    """How many of the last executions in a row exceeded the threshold (brute force)."""
    count = 0
    for s in reversed(seconds):
        if s <= threshold:
            break
        count += 1
    return count


SECONDS = st.lists(st.floats(min_value=0, max_value=60, allow_nan=False), max_size=12)


@settings(max_examples=300, deadline=None)
@given(SECONDS, st.floats(min_value=0, max_value=60, allow_nan=False), st.integers(1, 5))
def test_the_rule_is_the_trailing_run_of_slow_executions(seconds: list[float], threshold: float,
                                                         consecutive: int) -> None:
    found = fan_in_alert(waits(*seconds), threshold=threshold, consecutive=consecutive)
    assert (found is not None) == (trailing_slow(seconds, threshold) >= consecutive)
    if found is not None:
        assert len(found) == consecutive
        assert [w.seconds for w in found] == seconds[-consecutive:]
    # Monotone: a higher threshold or a longer run never raises an alert the lower one did not.
    if found is None:
        assert fan_in_alert(waits(*seconds), threshold=threshold + 1,
                            consecutive=consecutive) is None
        assert fan_in_alert(waits(*seconds), threshold=threshold,
                            consecutive=consecutive + 1) is None
    # One fast execution clears any alert; a slow one keeps an alert going.
    assert fan_in_alert(waits(*seconds, threshold), threshold=threshold,
                        consecutive=consecutive) is None
    if found is not None:
        assert fan_in_alert(waits(*seconds, threshold + 1), threshold=threshold,
                            consecutive=consecutive) is not None


# -- building stats from rows --------------------------------------------------------------------


def step_row(step: str, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "workflow_name": "wf", "step": step, "p50": 0.1, "p95": 0.2, "p99": 0.3, "attempts": 3,
        "retries": 1, "lost": 0, "succeeded": 2, "degraded": 0, "failed": 0, "timed_out": 0,
        "skipped": 0, "cancelled": 0, "unfinished": 0,
        "last_success_at": datetime(2026, 11, 30, 5, 0, tzinfo=UTC), "since_last_success": 12.5,
    }
    return row | values


def test_build_stats_from_rows() -> None:
    join = {"workflow_name": "wf", "step": "join", "samples": 3, "wait_p50": 0.4, "wait_p95": 0.5,
            "wait_max": 0.6, "dispatch_p50": 0.004, "dispatch_p95": 0.01,
            "stragglers": {"slow": 2, "fast": 1}}
    recent = [{"workflow_name": "wf", "step": "join", "execution_id": f"e{i}", "straggler": "slow",
               "waiting": False, "wait": w} for i, w in enumerate((0.5, 0.6))]
    stats = build_stats([step_row("slow"), step_row("never", p50=None, p95=None, p99=None,
                                                    attempts=0, retries=0, last_success_at=None,
                                                    since_last_success=None, succeeded=0,
                                                    failed=2)],
                        [join], recent, workflow=None, history_seconds=86400, threshold=0.45,
                        consecutive=2)
    assert stats.workflows == ["wf"]
    assert stats.branches[1].p50 is None and stats.branches[1].outcomes["failed"] == 2
    assert stats.joins[0].usual_straggler == "slow"
    assert [a.join for a in stats.alerts] == ["join"] and stats.exit_code == ALERT_EXIT_CODE
    data = json.loads(json.dumps(stats.to_json()))
    assert data["alerts"][0]["executions"] == ["e0", "e1"]
    assert data["branches"][0]["since_last_success"] == 12.5
    assert data["fan_in_alert_seconds"] == 0.45
    calm = build_stats([], [join], recent, workflow=None, history_seconds=60, threshold=5,
                       consecutive=2)
    assert calm.alerts == [] and calm.exit_code == 0
    assert JoinStats("wf", "j", 2, 1, 1, 1, None, None, {"b": 1, "a": 1}).usual_straggler == "a"


def test_option_values_are_shown_as_written() -> None:
    assert [format_duration(s) for s in (86400, 7 * 86400, 3600, 20, 90, 0.25, 1.5)] == \
        ["24h", "7d", "1h", "20s", "90s", "250ms", "1.5s"]


def test_a_duration_shown_as_written_reads_back_the_same() -> None:
    for seconds in (0, 0.0005, 0.25, 1.5, 12.34, 90, 3600, 86400, 3 * 86400 + 3600, 1e6):
        assert parse_duration(format_duration(seconds)) == seconds, seconds


# -- from real history ---------------------------------------------------------------------------

SLOW_SECONDS = 0.3


def fan_in_workflow(name: str = "stats-fan-in") -> konduit.Workflow:
    """start fans out to quick, brisk and slow; join waits for all three; announce retries once."""
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def start(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[start])
    def quick(ctx: konduit.Context) -> str:
        return "quick"

    @wf.step(after=[start])
    def brisk(ctx: konduit.Context) -> str:
        time.sleep(0.02)
        return "brisk"

    @wf.step(after=[start])
    async def slow(ctx: konduit.Context) -> str:
        await asyncio.sleep(ctx.input.get("slow", SLOW_SECONDS))
        return "slow"

    @wf.step(after=[quick, brisk, slow])
    def join(ctx: konduit.Context) -> list[str]:
        return sorted(ctx.upstream.values())

    @wf.step(after=[join], retry=konduit.Retry(max_attempts=3, backoff="fixed", base="10ms",
                                               jitter=False))
    def announce(ctx: konduit.Context) -> str:
        if ctx.attempt == 1:
            raise RuntimeError("transient")
        return "done"

    return wf


def stats_from(db_url: str, workflow: str | None = None, **options: Any) -> Stats:
    async def go() -> Stats:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            return await load_stats(db, workflow, **options)
        finally:
            await db.close()

    return asyncio.run(go())


def run(app: konduit.App, workflow: str, times: int, **input: float) -> list[str]:
    ids = []
    for i in range(times):  # one after the other: the waits are the workflow's own
        eid = app.start(workflow, {"n": i, **input}).id
        app.wait(eid, timeout=30)
        ids.append(str(eid))
    return ids


@pytest.mark.storage
def test_stats_from_real_history_name_the_slow_branch(make_app: Callable[..., konduit.App],
                                                      db_url: str) -> None:
    wf, other = fan_in_workflow(), fan_in_workflow("stats-other")
    app = make_app(wf, other)
    runs = 3
    with running_worker(app, concurrency=8, poll_interval=0.05):
        ids = run(app, wf.name, runs)
        run(app, other.name, 1, slow=0)

    stats = stats_from(db_url, wf.name)
    assert stats.workflows == [wf.name]
    branches = {b.step: b for b in stats.branches}
    assert set(branches) == {"start", "quick", "brisk", "slow", "join", "announce"}
    order = [b.step for b in stats.branches]  # in firing order
    assert order[0] == "start" and order[-1] == "announce" and order.index("join") == 4
    for b in branches.values():
        assert b.outcomes["succeeded"] == runs and b.unfinished == 0
        assert b.since_last_success is not None and 0 <= b.since_last_success < 60
        assert b.p50 is not None and b.p95 is not None and b.p99 is not None
        assert b.p50 <= b.p95 <= b.p99
    assert SLOW_SECONDS <= branches["slow"].p50 < SLOW_SECONDS + 5  # type: ignore[operator]
    assert branches["quick"].p99 < branches["slow"].p50  # type: ignore[operator]
    assert branches["announce"].attempts == 2 * runs and branches["announce"].retries == runs
    assert branches["slow"].attempts == runs and branches["slow"].retries == 0
    assert all(b.lost == 0 for b in branches.values())

    [join] = stats.joins
    assert join.join == "join" and join.samples == runs
    assert join.stragglers == {"slow": runs} and join.usual_straggler == "slow"
    assert join.wait_p50 >= 0.25
    assert join.wait_p50 <= join.wait_p95 <= join.wait_max
    assert join.dispatch_p50 is not None and join.dispatch_p50 < join.wait_p50

    # Seed 004's rule, scaled down: two runs over 0.2 s page; a 5 s threshold does not.
    alerted = stats_from(db_url, wf.name, fan_in_alert="0.2s", consecutive=2)
    [alert] = alerted.alerts
    assert (alert.workflow, alert.join, alert.straggler) == (wf.name, "join", "slow")
    assert [w.execution_id for w in alert.waits] == ids[-2:]
    assert all(w.seconds > 0.2 for w in alert.waits) and alerted.exit_code == ALERT_EXIT_CODE
    assert stats_from(db_url, wf.name, fan_in_alert="5s", consecutive=2).alerts == []
    assert stats_from(db_url, wf.name, fan_in_alert="0.2s", consecutive=runs + 1).alerts == []
    text = " ".join(str(r) for r in stats_renderables(alerted))
    assert "ALERT" in text and "straggler: slow" in text

    # Every workflow by default; the other one never waited long.
    everything = stats_from(db_url, fan_in_alert="0.2s")
    assert everything.workflows == sorted([wf.name, other.name])
    assert [a.workflow for a in everything.alerts] == [wf.name]

    # A fast run resets the count; a join still waiting past the threshold counts already.
    with running_worker(app, concurrency=8, poll_interval=0.05):
        [fast] = run(app, wf.name, 1, slow=0)
        # Make that run's wait fast whatever the machine's load (the rule itself is tested above
        # without a database): only the history plumbing is under test here.
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE konduit_steps SET first_upstream_at = fired_at - interval '10 ms'"
                         " WHERE execution_id = %s AND step = 'join'", (fast,))
        assert stats_from(db_url, wf.name, fan_in_alert="0.2s").alerts == []
        stuck = app.start(wf.name, {"slow": 2.5}).id
        # The join's wait counts once it is past the threshold: poll until the alert shows.
        [open_alert] = until(
            lambda: stats_from(db_url, wf.name, fan_in_alert="0.2s", consecutive=1).alerts, 30,
            "the still-waiting join to raise the fan-in alert")
        assert open_alert.waits[-1].waiting and open_alert.waits[-1].execution_id == str(stuck)
        assert open_alert.straggler is None
        app.wait(stuck, timeout=30)

    # Only executions created within the history count.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_executions SET created_at = created_at - interval '2 days' "
                     "WHERE id = %s", (ids[0],))
    assert stats_from(db_url, wf.name).joins[0].samples == runs + 1
    assert stats_from(db_url, wf.name, history="7d").joins[0].samples == runs + 2
    with pytest.raises(StatsError, match="unknown workflow 'nope'"):
        stats_from(db_url, "nope")
    with pytest.raises(StatsError, match="--fan-in-alert"):
        stats_from(db_url, fan_in_alert="soon")


@pytest.mark.storage
def test_konduit_stats_command_exits_3_on_an_alert(make_app: Callable[..., konduit.App],
                                                   db_url: str) -> None:
    proc = konduit_cli("stats", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["branches"] == []

    wf = fan_in_workflow()
    app = make_app(wf)
    with running_worker(app, concurrency=8, poll_interval=0.05):
        run(app, wf.name, 2)

    common = ("--database-url", db_url)
    proc = konduit_cli("stats", wf.name, "--json", "--fan-in-alert", "0.2s", *common)
    assert proc.returncode == ALERT_EXIT_CODE, proc.stderr
    data = json.loads(proc.stdout)
    [alert] = data["alerts"]
    assert alert["join"] == "join" and alert["straggler"] == "slow" and len(alert["waits"]) == 2
    assert data["joins"][0]["usual_straggler"] == "slow"
    assert {b["step"] for b in data["branches"]} >= {"quick", "brisk", "slow", "join"}

    proc = konduit_cli("stats", "--json", "--fan-in-alert", "5s", "--consecutive", "2", *common)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["alerts"] == []

    proc = konduit_cli("stats", "--fan-in-alert", "200ms", *common)  # the human-readable form
    assert proc.returncode == ALERT_EXIT_CODE, proc.stderr
    for needle in ("branch", "p95", "fan-in", "slow 2", "ALERT", "straggler: slow"):
        assert needle in proc.stdout, proc.stdout
    proc = konduit_cli("stats", *common)
    assert proc.returncode == 0 and "no fan-in alert" in proc.stdout, proc.stdout

    assert_clean_error(konduit_cli("stats", "--history", "lately", *common), "--history")
    assert_clean_error(konduit_cli("stats", "nope", *common), "unknown workflow 'nope'")
