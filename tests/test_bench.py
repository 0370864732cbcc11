"""``konduit bench --quick`` runs end to end and reports sane numbers.

The bounds are generous on purpose (machines are noisy): they catch a fan-in that became O(width)
or a batch path that stopped batching, not a slow afternoon. Speed itself is judged from the
report (``summary.targets``), never asserted here; correctness figures (stalls, duplicate joins)
are.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from konduit.bench import BENCHMARKS
from konduit.bench_fleet import Observer, commits_between

pytestmark = [pytest.mark.storage]

QUICK = set(BENCHMARKS) - {"history", "map_1m"}


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    return {f"{name}.{key}": value
            for name, bench in report["benchmarks"].items()
            for key, value in bench["ratios"].items()}


def test_commit_count_is_exactly_what_others_committed(db_url):
    """The transactions-per-task figure rests on this: others' commits, none of the bench's."""
    obs = Observer(db_url)
    try:
        before = obs.commits()
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute("CREATE TABLE t (n int)")
            for i in range(25):
                other.execute("INSERT INTO t VALUES (%s)", (i,))
        obs.one("SELECT 1")  # the observer's own statements in between are not counted
        after = obs.commits()
    finally:
        obs.close()
    # The 26 statements, and the other session's own start-up (PostgreSQL counts a transaction
    # or two for a new backend) — not the observer's dozen polls and reads.
    assert 26 <= commits_between(before, after) <= 28


@pytest.mark.slow
def test_quick_bench_reports_sane_numbers_and_cleans_up(admin_url, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "bench", "--quick", "--output", str(out),
         "--database-url", admin_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    printed = json.loads(stdout)
    report = json.loads(out.read_text())
    assert printed == report

    machine = report["machine"]
    assert machine["cpu_count"] >= 1 and machine["python"] and machine["postgres"]
    assert machine["embedded"] is False  # a URL was given
    assert report["quick"] is True
    assert set(report["benchmarks"]) == QUICK
    for bench in report["benchmarks"].values():
        assert {"parameters", "results", "ratios", "seconds"} <= set(bench)

    found = ratios(report)
    assert len(found) >= 5
    for name, value in found.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)

    b = report["benchmarks"]
    probe = b["commit_probe"]["results"]
    assert probe["commits_per_second"] > 0 and probe["commits_per_second_at_end"] > 0
    assert b["commit_probe"]["parameters"]["server"]["fsync"] == "on"

    tput = b["throughput"]["results"]
    assert (tput["executions"], tput["width"], tput["processes"], tput["concurrency"]) == (50, 20, 1, 8)
    assert tput["branch_tasks_per_second"] > 0
    assert tput["tasks_per_second"] == pytest.approx(tput["branch_tasks_per_second"] * 21 / 20,
                                                     rel=0.01)
    assert tput["committed_transactions"] > 0 and tput["commits_per_task"] > 0
    assert tput["join_dispatch_latency"]["n"] == 50
    assert tput["pickup_latency"]["n"] == 50 * 21
    assert 0 < tput["worker_peak_rss_mb"] < 1000
    assert b["throughput"]["ratios"]["branch_tasks_per_second_over_commit_probe"] > 0

    assert [c["processes"] for c in b["workers"]["results"]["curve"]] == [1, 2]
    assert b["latency"]["results"]["join_dispatch_latency"]["n"] == 10
    assert b["start"]["results"]["start_500_roots"]["n"] == 3
    assert [w["width"] for w in b["wide"]["results"]["widths"]] == [10, 200]

    # Correctness, not speed: every simultaneous finish fired its join exactly once.
    collide = b["collide"]["results"]
    assert (collide["stalls"], collide["duplicate_joins"]) == (0, 0)
    assert len(collide["completer"]) == 3 and len(collide["worker"]) == 2

    backlog = b["backlog"]["results"]
    assert backlog["executions_finished"] >= 1 and backlog["first_finish_after_first_claim_s"] >= 0

    fan_in = b["fan_in_cost_by_width"]
    assert [w["width"] for w in fan_in["results"]] == [10, 100]
    assert all(w["per_completion"]["n"] >= 150 for w in fan_in["results"])
    # O(1) per completion: a 10x wider join must not cost ~10x per completion.
    assert fan_in["ratios"]["median_100_over_10"] < 5
    # ... nor do the last completions of a join cost more than its first ones.
    assert fan_in["ratios"]["last_over_first_tenth_100"] < 5

    simultaneous = b["simultaneous_finish"]
    assert (simultaneous["parameters"]["width"], simultaneous["parameters"]["trials"]) == (50, 2)
    assert simultaneous["results"]["concurrent_slowest_completion_ms"] <= \
        simultaneous["results"]["concurrent_wall_ms"]
    assert b["batching"]["ratios"]["speedup"] > 1
    assert b["map_10k"]["parameters"]["items"] == 1_000
    fair = b["fair_share"]["results"]
    assert fair["beside_map"]["lone_start_to_finish"]["n"] == 20
    assert fair["after_batch"]["lone_start_to_finish"]["n"] == 20
    assert fair["beside_map"]["map_items_still_ready"] > 0  # the map was still running
    wide_map = b["wide_map"]["results"]
    assert (wide_map["items"], wide_map["item_attempts"], wide_map["join_attempts"]) == \
        (5_000, 5_000, 1)
    assert b["wide_map"]["ratios"]["map_items_over_static_branches"] > 0

    summary = report["summary"]
    assert summary["commit_probe_commits_per_second"] == probe["commits_per_second"]
    targets = summary["targets"]
    assert {"throughput_branch_tasks_per_second", "commits_per_task", "start_500_roots_ms",
            "idle_join_dispatch_p99_ms", "collide_stalls", "worker_peak_rss_mb",
            "backlog_first_finish_s"} <= set(targets)
    assert all(isinstance(t["met"], bool) for t in targets.values())
    assert summary["ratios_to_commit_probe"]["throughput_branch_tasks"] > 0

    # Every scratch database of that run was dropped.
    with psycopg.connect(admin_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                            (f"konduit_bench_{proc.pid}_%",)).fetchall()
    assert left == []
