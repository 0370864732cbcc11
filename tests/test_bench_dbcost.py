"""``konduit bench --only db_cost`` (issue 30): WAL bytes and the server's CPU per task, beside
the bare fan-in protocol on the same server. Only the instrument here (small runs, real
PostgreSQL); the figures themselves are docs/benchmarks.md's."""

from __future__ import annotations

import math
import os

import psycopg
import pytest

from konduit.bench.dbcost import ServerMeter, bare_protocol, db_cost, server_cpu_seconds
from konduit.bench.suite import Server

pytestmark = [pytest.mark.storage]


@pytest.mark.parametrize("protocol", ["bare", "leased", "lean"])
def test_the_bare_protocol_fires_every_join_exactly_once(db_url: str, protocol: str) -> None:
    """A baseline must be a correct fan-in, or its figures flatter nothing: 8 threads
    collide on 30 executions of 10 branches (10 of them the warm-up, outside the meter); every
    execution gets one join, run once. The leased and lean protocols leave no lease behind, and
    the lean one records each task's attempt on its row."""
    meter = ServerMeter(db_url)
    found = bare_protocol(db_url, executions=20, width=10, concurrency=8, meter=meter, warm=10,
                          protocol=protocol)
    assert found["wal_bytes"] > 0
    schema = "lean" if protocol == "lean" else "bare"
    if protocol == "lean":
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT (SELECT count(*) FROM lean.leases),"
                                " (SELECT count(*) FROM lean.ready)").fetchone() == (0, 0)
            assert conn.execute("SELECT count(*) FILTER (WHERE attempt = 1 AND output = '1'"
                                " AND finished_at >= started_at AND worker_id IS NOT NULL),"
                                " count(*) FROM lean.tasks").fetchone() == (330, 330)
    elif protocol == "leased":
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FILTER (WHERE lease_token IS NULL"
                                " AND finished_at IS NOT NULL AND worker_id IS NOT NULL),"
                                " count(*) FROM bare.tasks").fetchone() == (330, 330)
    with psycopg.connect(db_url) as conn:
        joins = conn.execute("SELECT execution_id, count(*), bool_and(status = 'succeeded')"
                             f" FROM {schema}.tasks WHERE step = 'join' GROUP BY 1").fetchall()
        executions = conn.execute("SELECT count(*) FILTER (WHERE status = 'succeeded'"
                                  f" AND remaining = 0), count(*) FROM {schema}.executions"
                                  ).fetchone()
    assert len(joins) == 30 and all(n == 1 and ok for _, n, ok in joins)
    assert executions == (30, 30)


def test_a_local_servers_cpu_is_read_from_proc(db_url: str) -> None:
    meter = ServerMeter(db_url)
    if meter.postmaster is None or not os.path.exists(f"/proc/{meter.postmaster}"):
        pytest.skip("the test server is not on this machine")
    first = server_cpu_seconds(meter.postmaster)
    with psycopg.connect(db_url) as conn:  # some work for the server, read while its backend
        conn.execute("SELECT count(*) FROM generate_series(1, 2000000)").fetchone()
        second = server_cpu_seconds(meter.postmaster)  # lives (not yet reaped into cutime)
    assert first is not None and second is not None and second > first


def test_db_cost_reports_wal_and_cpu_per_task_with_ratios_and_a_breakdown(
        admin_url: str) -> None:
    report = db_cost(Server(admin_url).fresh_database, executions=5, width=10, repeats=1,
                     warm=2)
    assert report["parameters"]["warm_executions"] == 2
    ours, bare = report["results"]["konduit"], report["results"]["bare_protocol"]
    leased = report["results"]["leased_protocol"]
    lean = report["results"]["lean_protocol"]
    for figures in (ours, bare, leased, lean):
        assert figures["wal_bytes_per_branch_task"] > 0
        assert figures["branch_tasks_per_second"] > 0
    # The work alone is metered; the whole run (the worker's start and stop, the bench's own
    # reads) is said beside it. Its span holds the work's, and WAL positions only grow (read
    # server-wide, so tests beside it add to both spans alike: no stricter comparison holds).
    [run] = report["results"]["konduit_runs"]
    assert run["whole_run"]["wal_bytes_per_branch_task"] >= run["wal_bytes_per_branch_task"]
    for name in ("wal_per_task_over_bare", "leased_wal_per_task_over_bare",
                 "wal_per_task_over_leased", "lean_wal_per_task_over_bare",
                 "wal_per_task_over_lean"):
        ratio = report["ratios"][name]
        assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0, name
    breakdown = report["results"]["konduit_wal_breakdown"]
    assert breakdown is not None, "pg_walinspect is part of PostgreSQL 15+'s contrib"
    if "unavailable" in breakdown:
        # A busy shared server recycled the run's WAL before it was read: said, not hidden.
        assert "has already been removed" in breakdown["unavailable"], breakdown
        return
    kinds = {r["resource_manager"] for r in breakdown["by_resource_manager"]}
    assert {"Heap", "Btree"} <= kinds
    if "by_relation" in breakdown:  # PostgreSQL 16+
        assert "konduit_tasks" in {r["relation"] for r in breakdown["by_relation"]}
