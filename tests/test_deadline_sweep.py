"""A worker killed while its task runs past the deadline: the database sweep still ends the task
on time (deadline + grace), long before the dead worker's lease would expire."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

import konduit
from tests import sweep_app
from tests.conftest import running_worker

pytestmark = [pytest.mark.storage, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_sweep_ends_a_dead_workers_task_at_its_deadline(db_url):
    victim = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "worker", "tests.sweep_app:app",
         "--database-url", db_url, "--lease-seconds", "60", "--heartbeat-interval", "1",
         "--poll-interval", "0.2", "--log-level", "WARNING"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    app = konduit.App([sweep_app.wf], database_url=db_url)
    try:
        handle = app.start("sweep")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(t["step"] == "slow" and t["status"] == "running" for t in app.tasks(handle.id)):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the victim never started the slow task")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        with running_worker(app, concurrency=2):
            result = handle.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
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
