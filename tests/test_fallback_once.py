"""A fallback runs at most once per task, and a dead worker's tasks are rescued by a worker that
came up after it died, without that worker having to live a lease — with real ``konduit
worker`` processes (``--isolation thread``), since the point is what a process's death leaves.

Before: a fallback that killed its worker was called again by each new worker's deadline sweep
(nothing recorded that it had been tried), so every worker died in turn, forever; and since a
rescuer had to be connected for a full lease, no worker ever lived long enough to rescue."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

import konduit
from tests.apps import fallback_app
from tests.support.db import rows
from tests.support.payloads import opened
from tests.support.waiting import until
from tests.support.workers import reaped, spawn_worker

pytestmark = [pytest.mark.storage]

def spawn(db_url: str, log: Path, *args: str, env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """A real ``konduit worker tests.apps.fallback_app:app`` process; its output goes to
    ``log``."""
    return spawn_worker(
        "tests.apps.fallback_app:app", db_url, "--isolation", "thread",
        "--maintenance-interval", "0.2", "--alert-interval", "0", *args,
        concurrency=None, log_level="INFO", log=log, env=env,
    )


def test_a_fallback_that_kills_its_worker_ends_its_task_once_with_no_crash_loop(db_url, tmp_path):
    """Two tasks whose fallback calls ``os._exit(1)``; a worker is restarted whenever one exits
    (at most 6). Each fallback is called once and kills one worker; the next workers end both
    tasks timed_out without calling it again, each join fires once, both executions finish."""
    marks = tmp_path / "marks"
    marks.mkdir()
    log = tmp_path / "workers.log"
    app = konduit.App([fallback_app.crash_wf], database_url=db_url)
    handles = [app.start("fallback-crash") for _ in range(2)]
    deadline = time.monotonic() + 60
    try:
        with reaped([]) as procs:

            def story() -> str:
                return (f"exit codes {[p.poll() for p in procs]}, marks "
                        f"{sorted(m.name for m in marks.iterdir())}\n{log.read_text()[-6000:]}")

            while not all(app.status(h.id).finished for h in handles):
                assert time.monotonic() < deadline, f"not finished after 60 s: {story()}"
                assert len(procs) <= 6, f"{len(procs)} worker processes (a crash loop): {story()}"
                if not procs or procs[-1].poll() is not None:
                    procs.append(spawn(
                        db_url, log, "--concurrency", "1", "--lease-seconds", "3",
                        "--heartbeat-interval", "0.5", "--fallback-timeout", "1",
                        env={"KONDUIT_FALLBACK_CRASH": "1", "KONDUIT_FALLBACK_MARKS": str(marks)},
                    ))
                time.sleep(0.1)
            survivor = procs[-1]
            survivor.send_signal(signal.SIGTERM)
            survivor.wait(timeout=15)
            codes = [p.returncode for p in procs]
            # One worker killed per task (its fallback), then one that ended both and stopped.
            assert codes == [1, 1, 0], story()
        called = sorted(m.name.split(".")[0] for m in marks.iterdir())
        assert called == sorted(str(h.id) for h in handles), story()  # once per task
        for h in handles:
            result = h.wait(timeout=1)
            assert result.output == {"hang": "timed_out", "quick": "succeeded"}
            tasks = rows(db_url, "SELECT step, status, error, fallback_started_at IS NOT NULL"
                         " FROM konduit_tasks WHERE execution_id = %s ORDER BY step", h.id)
            assert [(s, st, f) for s, st, _, f in tasks] == [
                ("after", "succeeded", False), ("hang", "timed_out", True),
                ("quick", "succeeded", False)], tasks
            hung = opened(tasks[1][2])
            assert "fallback" in hung and "never returned" in hung, hung
            tried = rows(db_url, "SELECT t.step, a.outcome FROM konduit_attempts a JOIN"
                         " konduit_tasks t ON t.id = a.task_id WHERE t.execution_id = %s"
                         " ORDER BY t.step", h.id)
            # The join fired once: one task of `after`, run once.
            assert [s for s, _ in tried] == ["after", "hang", "quick"], tried
    finally:
        app.close()


LEASE = 4.0


def test_a_dead_workers_task_is_rescued_by_a_worker_started_after_it_died_without_a_lease(
    db_url, tmp_path
):
    """The holder is killed; once its heartbeat is older than its lease (by the server's clock)
    a worker is started, and it rescues the task within about a heartbeat, not after living a
    lease first (which, when every worker keeps dying young, is never)."""
    log = tmp_path / "workers.log"
    app = konduit.App([fallback_app.rescue_wf], database_url=db_url)
    handle = app.start("rescue-fresh")
    args = ("--lease-seconds", str(LEASE), "--heartbeat-interval", "0.5")
    try:
        with reaped([spawn(db_url, log, *args)]) as procs:
            holder = procs[0]
            (worker_id,) = until(
                lambda: [w for (w,) in rows(db_url, "SELECT worker_id FROM konduit_tasks"
                                            " WHERE status = 'running' AND execution_id = %s",
                                            handle.id)],
                30, "the first worker to run the task")
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            until(lambda: rows(
                db_url, "SELECT 1 FROM konduit_workers WHERE id = %s AND last_heartbeat_at"
                " < clock_timestamp() - make_interval(secs => lease_seconds)", worker_id),
                3 * LEASE, "the killed worker's heartbeat to be older than its lease")
            procs.append(spawn(db_url, log, *args))
            result = handle.wait(timeout=30)
            procs[1].send_signal(signal.SIGTERM)
            procs[1].wait(timeout=15)
        assert result.output == "done on attempt 2"
        ((rescuer, rescued_after_start, outcome, error),) = rows(
            db_url,
            "SELECT w.id, extract(epoch FROM a.finished_at - w.started_at)::float8, a.outcome,"
            " a.error FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
            " JOIN konduit_attempts a2 ON a2.task_id = t.id AND a2.attempt = 2"
            " JOIN konduit_workers w ON w.id = a2.worker_id"
            " WHERE t.execution_id = %s AND a.attempt = 1", handle.id)
        assert rescuer != worker_id and outcome == "lost", (rescuer, outcome, error)
        assert worker_id in opened(error)
        print(f"rescued {rescued_after_start:.2f} s after the rescuer registered (lease {LEASE} s)")
        # Before, the rescuer first had to be connected for a whole lease.
        assert rescued_after_start < LEASE * 0.75, log.read_text()[-4000:]
    finally:
        app.close()
