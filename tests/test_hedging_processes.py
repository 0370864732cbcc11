"""Hedged attempts across real worker processes (`konduit worker`): the straggler's first
attempt runs in one process, its hedge on any free slot of either; the hedge wins, the join
fires once per execution, and the outrun attempt is cancelled where it runs."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

import konduit
from tests.apps import hedge_app
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

def test_stragglers_are_hedged_across_worker_processes(db_url: str, tmp_path: Path) -> None:
    executions = 3
    log = tmp_path / "attempts.log"
    app = konduit.App([hedge_app.wf], database_url=db_url)
    workers = [spawn_worker("tests.apps.hedge_app:app", db_url, concurrency=4)
               for _ in range(2)]
    try:
        began = time.monotonic()
        handles = [app.start("proc-hedge", input={"log": str(log)}) for _ in range(executions)]
        results = [h.wait(timeout=60) for h in handles]
        took = time.monotonic() - began
        # The outrun attempts are cancelled where they run (NOTIFY, else the next heartbeat).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and \
                log.read_text().count("\tcancelled\t") < executions:
            time.sleep(0.1)
    finally:
        stop_workers(workers)
        app.close()
    assert [r.status for r in results] == ["succeeded"] * executions
    assert [r.output for r in results] == ["hedge"] * executions
    assert took < 25, f"the stragglers were not hedged ({took:.1f} s; a first attempt takes 30 s)"
    events: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, hedged, what, _pid = line.split("\t")
        events[key].append((hedged, what))
    assert len(events) == executions  # one idempotency key per task, shared by its two attempts
    for key, seen in events.items():
        assert sorted(seen) == [("0", "cancelled"), ("0", "started"), ("1", "started")], (key, seen)
    with psycopg.connect(db_url) as conn:
        joins = conn.execute(
            "SELECT execution_id, count(*) FROM konduit_tasks WHERE step = 'join'"
            " GROUP BY execution_id").fetchall()
        attempts = conn.execute(
            "SELECT a.task_id, array_agg(a.hedge::int || ':' || a.outcome ORDER BY a.hedge)"
            " FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
            " WHERE t.step = 'slow' GROUP BY a.task_id").fetchall()
    assert len(joins) == executions and all(n == 1 for _, n in joins)
    assert sorted(a for _, a in attempts) == [["0:outrun", "1:succeeded"]] * executions
    assert all(w.returncode == 0 for w in workers)
