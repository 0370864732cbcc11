"""A worker killed while its task runs past the deadline: the database sweep still ends the task
on time (deadline + grace), long before the dead worker's lease would expire."""

from __future__ import annotations

import signal
import subprocess

import psycopg
import pytest

import konduit
from tests.apps import sweep_app
from tests.support.waiting import until
from tests.support.workers import kill_workers, running_worker, spawn_worker

pytestmark = [pytest.mark.storage, pytest.mark.slow]



def test_sweep_ends_a_dead_workers_task_at_its_deadline(db_url):
    victim = spawn_worker(
        "tests.apps.sweep_app:app", db_url, "--lease-seconds", "60", "--heartbeat-interval", "1",
        concurrency=None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    app = konduit.App([sweep_app.wf], database_url=db_url)
    try:
        handle = app.start("sweep")
        until(lambda: any(t.step == "slow" and t.status == "running"
                          for t in app.tasks(handle.id)), 30, "the victim to start the slow task")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        with running_worker(app, concurrency=2):
            result = handle.wait(timeout=30)
    finally:
        kill_workers([victim])
        app.close()
    assert result.output == "fallback"
    assert result.outcomes["slow"] == "degraded"
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM finished_at - deadline_at), error, lease_expires_at"
            " FROM konduit_tasks WHERE step = 'slow'"
        ).fetchone()
        attempts = conn.execute("SELECT outcome FROM konduit_attempts a JOIN konduit_tasks t"
                                " ON t.id = a.task_id WHERE t.step = 'slow'").fetchall()
    assert row is not None
    late_by, error, _ = row
    assert 0 <= float(late_by) < 5.0, f"ended {late_by} s after the deadline"
    assert "deadline exceeded" in error
    assert attempts == [("degraded",)]
