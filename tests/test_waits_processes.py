"""Durable waits with real worker processes: timers across restarts, child workflows across a
SIGKILL, many waiting executions that hold no worker slot."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from uuid import UUID

import pytest

import konduit
from tests.apps import waits_app
from tests.support.db import rows
from tests.support.waiting import until
from tests.support.workers import kill_workers, running_worker, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
POLL = 1.0


def spawn(db_url: str, *extra: str) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.waits_app:app", db_url, *extra, poll_interval=POLL)


def test_a_two_second_sleep_ends_within_its_time_plus_the_poll_interval(db_url):
    app = konduit.App([waits_app.timer, waits_app.child, waits_app.parent], database_url=db_url)
    workers = [spawn(db_url)]
    try:
        handle = app.start("timer-flow")
        result = handle.wait(timeout=60)
    finally:
        stop_workers(workers)
        app.close()
    assert result.status == "succeeded"
    [(waited,)] = rows(
        db_url,
        "SELECT extract(epoch FROM t.finished_at - a.finished_at)::float8 "
        "FROM konduit_tasks t JOIN konduit_attempts a ON a.task_id = t.id "
        "WHERE t.execution_id = %s AND t.step = 'pause' AND a.outcome = 'waiting'", handle.id)
    assert 2.0 <= waited <= 2.0 + POLL, waited
    # No worker slot was held while it waited: the arming attempt was short.
    [(armed,)] = rows(
        db_url, "SELECT extract(epoch FROM a.finished_at - a.started_at)::float8 "
        "FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id "
        "WHERE t.execution_id = %s AND t.step = 'pause'", handle.id)
    assert armed < 1.0


def test_timers_survive_a_restart_of_every_worker(db_url):
    app = konduit.App([waits_app.timer, waits_app.child, waits_app.parent], database_url=db_url)
    workers = [spawn(db_url), spawn(db_url)]
    try:
        handles = [app.start("timer-flow") for _ in range(6)]
        ids = [h.id for h in handles]

        def all_waiting() -> bool:
            return rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE step = 'pause' "
                         "AND status = 'waiting' AND execution_id = ANY(%s)", ids)[0][0] == 6

        until(all_waiting, 30, "every timer to wait")
        kill_workers(workers)  # every worker gone, the timers still to fire
        time.sleep(2.5)
        assert all_waiting()  # due now, but nobody to wake them
        # The restarted workers sweep every 0.5 s (the CLI flag, through a real process).
        workers = [spawn(db_url, "--maintenance-interval", "0.5") for _ in range(2)]
        began = time.monotonic()
        results = [h.wait(timeout=60) for h in handles]
        took = time.monotonic() - began
    finally:
        stop_workers(workers)
        app.close()
    assert all(r.status == "succeeded" for r in results)
    # A restarted worker's maintenance finds the due timers within its interval (0.5 s) of
    # starting (plus the process start).
    assert took < 10, took
    assert rows(db_url, "SELECT count(*), count(DISTINCT execution_id) FROM konduit_tasks "
                 "WHERE step = 'pause' AND status = 'succeeded'") == [(6, 6)]


def test_a_child_killed_mid_run_finishes_once_and_completes_its_parent_once(db_url):
    app = konduit.App([waits_app.timer, waits_app.child, waits_app.parent], database_url=db_url)
    workers = [spawn(db_url, "--lease-seconds", "2", "--heartbeat-interval", "0.5")]
    try:
        handle = app.start("gallery", input={"sleep": 3})

        def child_running() -> bool:
            return bool(rows(db_url, "SELECT 1 FROM konduit_tasks WHERE step = 'resize' "
                              "AND status = 'running'"))

        until(child_running, 30, "the child's step to run")
        kill_workers(workers)
        workers = [spawn(db_url, "--lease-seconds", "2", "--heartbeat-interval", "0.5")]
        result = handle.wait(timeout=90)
    finally:
        stop_workers(workers)
        app.close()
    assert result.status == "succeeded"
    assert result.output == {"thumbs": ["cover.png@64", "cover.png@128"]}
    children = rows(db_url, "SELECT id, status, idempotency_key FROM konduit_executions "
                     "WHERE workflow_name = 'resize'")
    assert len(children) == 1
    [(child_id, status, key)] = children
    assert status == "succeeded"
    [(task_id, wait_child, task_status)] = rows(
        db_url, "SELECT id, wait_child, status FROM konduit_tasks WHERE step = 'thumbs'")
    assert (wait_child, task_status) == (child_id, "succeeded")
    assert key == f"konduit-child:{task_id}"
    # The child's step ran twice (the first worker was killed), its parent step ended once.
    assert rows(db_url, "SELECT count(*) FROM konduit_attempts a JOIN konduit_tasks t "
                 "ON t.id = a.task_id WHERE t.step = 'resize'")[0][0] >= 2
    assert rows(db_url, "SELECT count(*) FROM konduit_outputs WHERE step = 'thumbs'") == [(1,)]


def test_a_child_that_ends_wakes_its_parent_at_once_not_at_the_next_pass(db_url):
    """Real worker processes whose maintenance runs once a minute: the child's end wakes the
    parent's step in the process that recorded it, long before the next pass."""
    app = konduit.App([waits_app.timer, waits_app.child, waits_app.parent], database_url=db_url)
    workers = [spawn(db_url, "--maintenance-interval", "60") for _ in range(2)]
    try:
        handles = [app.start("gallery", input={}) for _ in range(4)]
        results = [h.wait(timeout=30) for h in handles]
    finally:
        stop_workers(workers)
        app.close()
    assert all(r.output == {"thumbs": ["cover.png@64", "cover.png@128"]} for r in results)
    lags = rows(db_url, "SELECT extract(epoch FROM t.finished_at - c.finished_at)::float8 "
                 "FROM konduit_tasks t JOIN konduit_executions c ON c.id = t.wait_child "
                 "WHERE t.step = 'thumbs'")
    assert len(lags) == 4
    # At once, not at the next pass: a minute away. Under a CPU hog "at once" took 0.74 s, so
    # the bound is far from both (a wake left to the next pass would take 60 s).
    assert all(0 <= lag < 15 for (lag,) in lags), lags  # type: ignore[operator]


def test_cancelling_the_parent_cancels_the_child(make_app, db_url):
    app = make_app(waits_app.timer, waits_app.child, waits_app.parent)
    with running_worker(app, poll_interval=0.1, maintenance_interval=0.3, shutdown_grace=0.5):
        handle = app.start("gallery", input={"sleep": 30})

        def child_started() -> bool:
            return bool(rows(db_url, "SELECT 1 FROM konduit_tasks WHERE step = 'thumbs' "
                              "AND status = 'waiting'"))

        until(child_started, 30, "the child workflow to start")
        [(child_id,)] = rows(db_url, "SELECT wait_child FROM konduit_tasks WHERE step = 'thumbs'")
        assert isinstance(child_id, UUID)
        assert app.cancel(handle.id) is True
        assert app.status(child_id).status == "cancelled"
        assert app.status(handle.id).status == "cancelled"
        assert rows(db_url, "SELECT status FROM konduit_tasks WHERE step = 'thumbs'") \
            == [("cancelled",)]


def test_a_thousand_waiting_executions_hold_no_worker_slot(make_app, db_url):
    waiting = konduit.Workflow("approve-many", version=1)
    waiting.wait_for_event("approved", name="approval", key=lambda ctx: str(ctx.input["n"]))
    other = konduit.Workflow("other-work", version=1)

    @other.step()
    def work(ctx):
        return ctx.input

    app = make_app(waiting, other)
    count = 1000
    with running_worker(app, concurrency=4, poll_interval=0.1, maintenance_interval=0.5):
        handles = app.start_many([konduit.StartRequest("approve-many", input={"n": n})
                                  for n in range(count)])

        def all_waiting() -> bool:
            return rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE status = 'waiting'"
                         )[0][0] == count

        until(all_waiting, 180, "every execution to wait")
        # Four slots, a thousand waits: other work still runs at once.
        began = time.monotonic()
        assert app.start("other-work", input=1).wait(timeout=10).output == 1
        assert time.monotonic() - began < 5
        answers: list[str] = []
        lock = threading.Lock()

        def send(part: int) -> None:
            for n in range(part, count, 8):
                answer = app.send_event("approved", key=str(n), payload={"n": n})
                with lock:
                    answers.append(answer)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [h.wait(timeout=120) for h in handles]
    assert answers.count("woke") == count
    assert [r.output for r in results] == [{"n": n} for n in range(count)]
