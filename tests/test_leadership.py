"""Maintenance on an elected worker (issue 30, point 3): one worker of a deployment holds the
lease row and runs the passes needed once per cluster; the others run none of them; a stopping
leader hands over at once, a killed one within seconds (its session gone), and one failing pass
does not stop the others. The idle fleet's cost is measured from the database."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from contextlib import ExitStack

import psycopg
import pytest

import konduit
import konduit.testing
from konduit.db.database import Database
from konduit.worker.leadership import Leadership, deployment
from konduit.worker.maintenance import Maintenance
from tests.apps import deadline_wake_app
from tests.support.waiting import until, wait_for_passes
from tests.support.workers import running_worker, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage]

wf = konduit.Workflow("leader-noop", version=1)


@wf.step()
def only(ctx: konduit.Context) -> str:
    return "ok"


def test_a_deployment_is_named_by_its_workflows_and_settings_in_any_order() -> None:
    assert deployment(["a@1", "b@2"]) == deployment(["b@2", "a@1", "a@1"])
    assert deployment(["a@1"]) != deployment(["a@1", "b@1"])
    assert deployment(["a@1"], settings=[("alerts", True)]) != \
        deployment(["a@1"], settings=[("alerts", False)])


def test_one_lease_holder_at_a_time_renewed_taken_when_expired(db_url: str) -> None:
    async def scenario() -> None:
        db = Database(db_url)
        await db.open()
        try:
            one = Leadership(db, name="maintenance:t", worker_id="one", lease_seconds=0.5)
            two = Leadership(db, name="maintenance:t", worker_id="two", lease_seconds=0.5)
            assert await one.attempt() and not await two.attempt()
            assert await one.attempt()  # a renewal
            assert not await two.attempt()
            await asyncio.sleep(0.7)  # one's lease expires unrenewed
            assert not one.leading  # by its own clock it knows it too
            assert await two.attempt()
            assert not await one.attempt()  # taken over: one does not get it back
            await two.resign()
            assert await one.attempt()  # resigned: free at once
        finally:
            await db.close()

    asyncio.run(scenario())


def leaders(db_url: str) -> list[tuple[str, str]]:
    with psycopg.connect(db_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT name, worker_id FROM konduit_leaders WHERE expires_at > clock_timestamp()")]


def test_one_worker_leads_the_others_run_no_maintenance_and_a_stopping_leader_hands_over(
        make_app, db_url: str) -> None:
    app = make_app(wf)
    with ExitStack() as stack:
        first = stack.enter_context(running_worker(app, maintenance_interval=0.2))
        until(lambda: first.worker().leading, 30, "the first worker to lead")
        second = running_worker(app, maintenance_interval=0.2)
        follower = stack.enter_context(second)
        wait_for_passes(follower, "leader", n=1)  # it tried, and did not get the lease
        wait_for_passes(first, "maintenance", n=3)
        assert not follower.worker().leading
        for service in ("maintenance", "rescue", "deadlines", "waits", "starts", "timeouts",
                        "stalls", "alerts"):
            assert follower.worker().passes.count(service) == 0, service
        assert [w for _, w in leaders(db_url)] == [first.worker().config.worker_id]
        # The leader stops: it gives the lease up and notifies; the other takes it now (not
        # when it would have expired) and runs the passes.
        began = time.monotonic()
        first.worker().stop()
        until(lambda: follower.worker().leading, 30, "the other worker to take over")
        took = time.monotonic() - began
        wait_for_passes(follower, "maintenance", n=2)
        print(f"a stopping leader handed over in {took:.2f} s")


def test_a_failing_pass_is_logged_and_the_others_go_on(make_app, monkeypatch, caplog) -> None:
    async def broken(self: Maintenance) -> int:
        raise RuntimeError("a bug in the scheduled starts")

    monkeypatch.setattr(Maintenance, "start_due", broken)
    app = make_app(wf)
    with running_worker(app, maintenance_interval=0.2) as worker:
        # The passes after the broken one in a full pass still run, pass after pass.
        wait_for_passes(worker, "timeouts", n=3)
        wait_for_passes(worker, "stalls", n=2)
        wait_for_passes(worker, "maintenance", n=2)
        assert worker.worker().passes.count("starts") == 0
    assert "a bug in the scheduled starts" in caplog.text
    assert "'starts' failed" in caplog.text


# -- real processes ------------------------------------------------------------------------------


def held_by_pid(db_url: str, pid: int) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT 1 FROM konduit_leaders l JOIN konduit_workers w ON w.id = l.worker_id"
            " WHERE w.pid = %s AND l.expires_at > clock_timestamp()", (pid,)).fetchone()
    return row is not None


def session_recorded(db_url: str, pid: int) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT session_pid FROM konduit_workers WHERE pid = %s AND"
                           " stopped_at IS NULL", (pid,)).fetchone()
    return row is not None and row[0] is not None


def spawn(db_url: str, queue: str) -> subprocess.Popen[bytes]:
    # A long leader lease: a takeover well within it is the dead session's doing, not expiry.
    return spawn_worker(
        "tests.apps.deadline_wake_app:app", db_url, "--queue", queue, "--lease-seconds", "60",
        "--heartbeat-interval", "1", "--maintenance-interval", "10", "--leader-lease", "30",
        concurrency=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow  # real worker processes
def test_a_killed_leader_is_replaced_within_seconds_and_no_deadline_is_later_than_that(
        db_url: str) -> None:
    """The leader serves the branch's queue alone and is SIGKILLed while the branch runs there:
    another worker takes the lease (the leader's session is gone, long before its 30 s lease
    would expire) and sweeps the branch at its deadline, or at the takeover if that came later."""
    procs: list[subprocess.Popen[bytes]] = []
    app = konduit.App([deadline_wake_app.wf], database_url=db_url)
    try:
        leader = spawn(db_url, "victim")
        procs.append(leader)
        until(lambda: held_by_pid(db_url, leader.pid), 60, "the first worker to lead")
        procs += [spawn(db_url, "default"), spawn(db_url, "default")]
        for p in procs:
            until(lambda p=p: session_recorded(db_url, p.pid), 60, "the workers to start")
        handle = app.start("deadline-wake")
        until(lambda: any(t.step == "slow" and t.status == "running"
                          for t in app.tasks(handle.id)), 30, "the leader to run the branch")
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=10)
        with psycopg.connect(db_url) as conn:
            killed_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        result = handle.wait(timeout=60)  # bounds a hang; the promptness is measured below
        until(lambda: leaders(db_url) != [], 60, "a new leader")
        with psycopg.connect(db_url) as conn:  # before the new leader stops and resigns
            gap = conn.execute("SELECT extract(epoch FROM elected_at - %s)::float8"
                               " FROM konduit_leaders", (killed_at,)).fetchone()[0]  # type: ignore[index]
            late_by, after_takeover = conn.execute(
                "SELECT extract(epoch FROM t.finished_at - t.deadline_at)::float8,"
                "       extract(epoch FROM t.finished_at - l.elected_at)::float8"
                " FROM konduit_tasks t, konduit_leaders l"
                " WHERE t.step = 'slow'").fetchone()  # type: ignore[misc]
    finally:
        stop_workers(p for p in procs if p.poll() is None)
        app.close()
    assert result.output == "fallback+quick"
    print(f"new leader {gap:.2f} s after the kill; the branch ended {late_by:.2f} s after its "
          f"deadline ({after_takeover:.2f} s after the takeover)")
    assert 0 < gap < 10, f"the lease was taken over {gap:.2f} s after its holder died"
    # Late by no more than the leaderless gap (plus a pass's time): the sweep ran at the
    # deadline when there was a leader then, at the takeover otherwise.
    assert late_by < max(0.0, gap - 2.5) + 1.5 or after_takeover < 1.5, (late_by, gap)


@pytest.mark.slow  # eleven worker processes
def test_ten_idle_workers_cost_the_database_at_most_a_few_times_one() -> None:
    """Before issue 30 every worker ran every pass: ten cost eleven times one in transactions/s.
    Now the followers only beat, claim and listen."""
    from konduit.bench.idle import idle_cost
    from tests.support.workers import worker_environment

    env = {"PYTHONPATH": worker_environment()["PYTHONPATH"]}
    measured = idle_cost(konduit.testing.fresh_database, fleet=10, window=12.0, env=env)
    print(measured["results"], measured["ratios"])
    ratio = measured["ratios"]["fleet_commits_over_one"]
    assert ratio is not None and ratio <= 4.0, measured
