"""A redrive with real worker processes: the failed execution's other branch completes late
(its task was cancelled when the execution failed) at the moment the redrive runs, and the
worker running the new generation's branch is killed. The stale completion is fenced, the
killed worker's task is reclaimed and run elsewhere, and the join fires exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

import konduit
from tests.support.db import rows
from tests.support.waiting import until
from tests.support.workers import kill_workers, reaped, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage]

APP = "tests.apps.redrive_app:app"
LEASE = ("--lease-seconds", "2", "--heartbeat-interval", "0.5")


def _calls(db_url: str) -> dict[str, int]:
    return dict(rows(db_url, "SELECT step, count(*) FROM redrive_calls GROUP BY step"))


@pytest.mark.slow
def test_a_redrive_racing_a_late_completion_and_a_killed_worker(db_url: str,
                                                                tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE redrive_calls (step text, pid int, at timestamptz "
                     "DEFAULT clock_timestamp())")
    release = tmp_path / "release"
    with reaped([]) as procs:
        first = spawn_worker(APP, db_url, *LEASE, concurrency=4)
        procs.append(first)
        with konduit.Client(db_url) as client:  # no code: the registered definition
            until(lambda: "redrive-procs" in {w.name for w in client.workflows()}, 60,
                  "the worker's registration")
            eid = client.start("redrive-procs", {"dsn": db_url, "release": str(release)}).id
            with pytest.raises(konduit.ExecutionFailed):
                client.wait(eid, timeout=60)
            until(lambda: _calls(db_url).get("b") == 1, 30, "the old b in its handler")
            assert client.status(eid).outcomes["b"] == "cancelled"

            # The old generation's b completes late at the moment of the redrive.
            go = threading.Barrier(2)

            def late() -> None:
                go.wait(timeout=30)
                release.touch()

            releaser = threading.Thread(target=late)
            releaser.start()
            go.wait(timeout=30)
            rerun = client.redrive(eid)
            releaser.join(timeout=30)
            assert rerun == ["a", "b", "join"]

            # The new generation's b starts on the first worker, which is killed in it.
            until(lambda: _calls(db_url).get("b") == 2, 60, "the new b on the first worker")
            kill_workers([first])
            second = spawn_worker(APP, db_url, *LEASE, concurrency=4)
            procs.append(second)
            result = client.wait(eid, timeout=120)
            stop_workers([second])
    assert result.status == "succeeded"
    assert result.output == {"a": "a-ok", "b": "b-ok"}
    calls = _calls(db_url)
    assert calls == {"fetch": 1, "a": 2, "b": 3, "join": 1}, calls
    tasks = rows(db_url, "SELECT step, generation, status, attempt FROM konduit_tasks "
                 "WHERE execution_id = %s ORDER BY step, generation", eid)
    by = {(s, g): (st, att) for s, g, st, att in tasks}
    assert [k for k in by if k[0] == "join"] == [("join", 2)]  # the join fired once
    assert by[("join", 2)][0] == "succeeded"
    assert by[("b", 1)][0] == "cancelled"  # the late completion changed nothing
    assert by[("b", 2)][0] == "succeeded" and by[("b", 2)][1] >= 2  # reclaimed, run again
    assert by[("fetch", 1)][0] == "succeeded" and ("fetch", 2) not in by  # kept
    assert rows(db_url, "SELECT generation FROM konduit_executions WHERE id = %s",
                eid) == [(2,)]
