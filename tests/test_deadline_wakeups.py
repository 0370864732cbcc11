"""Deadlines to the moment (issue 16): the maintenance loop wakes at the next deadline, not at
its next interval, and a task whose worker is dead gets no grace.

Two real ``konduit worker`` processes with a 10 s maintenance interval: the victim claims the
branch (its queue is the victim's alone) and is SIGKILLed while the handler runs; the survivor,
which was asleep until its next interval when the claim happened, is told of the new deadline
by the victim's one notification, wakes at it, sees that the victim's session is gone and ends
the branch with its fallback. The join fires within half a second of the deadline (before issue
16: up to interval + grace, 11 s here, after it).
"""

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
from tests import deadline_wake_app

pytestmark = [pytest.mark.storage]

ROOT = Path(__file__).resolve().parent.parent


def spawn(db_url: str, *queues: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "worker", "tests.deadline_wake_app:app",
         "--database-url", db_url, *(a for q in queues for a in ("--queue", q)),
         "--lease-seconds", "60", "--heartbeat-interval", "1", "--poll-interval", "0.2",
         "--maintenance-interval", "10", "--log-level", "WARNING"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    began = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - began < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)


def session_recorded(db_url: str, pid: int) -> bool:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT session_pid FROM konduit_workers WHERE pid = %s AND"
                           " stopped_at IS NULL", (pid,)).fetchone()
    return row is not None and row[0] is not None


def test_a_dead_workers_branch_ends_and_its_join_fires_within_half_a_second_of_its_deadline(
        db_url: str) -> None:
    survivor = spawn(db_url, "default")
    victim = None
    app = konduit.App([deadline_wake_app.wf], database_url=db_url)
    try:
        wait_for("the survivor", lambda: session_recorded(db_url, survivor.pid))
        victim = spawn(db_url, "victim", "default")
        wait_for("the victim", lambda: session_recorded(db_url, victim.pid))
        time.sleep(0.5)  # the survivor's maintenance loop sleeps towards its next interval
        handle = app.start("deadline-wake")
        wait_for("the victim to run the branch", lambda: any(
            t["step"] == "slow" and t["status"] == "running" for t in app.tasks(handle.id)))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        result = handle.wait(timeout=20)
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (victim, survivor):
            if proc is not None:
                proc.wait(timeout=30)
        app.close()
    assert result.output == "fallback+quick"
    assert result.outcomes["slow"] == "degraded"
    with psycopg.connect(db_url) as conn:
        ended = conn.execute(
            "SELECT extract(epoch FROM t.finished_at - t.deadline_at)::float8,"
            "       extract(epoch FROM s.fired_at - t.deadline_at)::float8, t.error"
            " FROM konduit_tasks t, konduit_steps s"
            " WHERE t.step = 'slow' AND s.execution_id = t.execution_id AND s.step = 'publish'"
        ).fetchone()
        attempts = conn.execute("SELECT a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
                                " ON t.id = a.task_id WHERE t.step = 'slow'").fetchall()
    assert ended is not None
    late_by, join_late_by, error = ended
    print(f"branch ended {late_by:.3f} s after its deadline, join fired {join_late_by:.3f} s after")
    assert 0 <= late_by < 0.5, f"the branch ended {late_by:.3f} s after its deadline"
    assert 0 <= join_late_by < 0.5, f"the join fired {join_late_by:.3f} s after the deadline"
    assert "deadline exceeded" in error
    assert attempts == [("degraded",)]  # the dead worker's attempt, ended by the sweep
