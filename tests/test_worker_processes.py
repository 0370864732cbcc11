"""Several real worker processes (`konduit worker`) finishing branches of one join together."""

from __future__ import annotations

import time

import psycopg
import pytest

import konduit
from tests.apps import proc_app
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

def test_join_fires_once_with_branches_finishing_together_across_processes(db_url):
    executions = 30
    app = konduit.App([proc_app.wf], database_url=db_url)
    workers = [spawn_worker("tests.apps.proc_app:app", db_url, concurrency=8)
               for _ in range(3)]
    try:
        handles = []
        # Groups of executions whose branches all release at the same instant.
        for group in range(executions // 5):
            release_at = time.time() + 1.5 + group * 0.5
            for _ in range(5):
                handles.append(app.start("proc-fan-in", input={"release_at": release_at}))
        results = [h.wait(timeout=120) for h in handles]
    finally:
        stop_workers(workers)
        app.close()
    assert all(r.status == "succeeded" for r in results)
    assert all(r.output == sum(range(1, proc_app.WIDTH + 1)) for r in results)
    with psycopg.connect(db_url) as conn:
        joins = conn.execute(
            "SELECT execution_id, count(*) FROM konduit_tasks WHERE step = 'join'"
            " GROUP BY execution_id"
        ).fetchall()
        workers_used = conn.execute(
            "SELECT count(DISTINCT worker_id) FROM konduit_attempts"
        ).fetchone()
    assert len(joins) == executions and all(n == 1 for _, n in joins)
    assert workers_used is not None and workers_used[0] >= 2  # branches really were spread
    assert all(w.returncode == 0 for w in workers)
