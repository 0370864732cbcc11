"""``konduit bench --quick`` runs end to end and reports sane numbers.

The bounds are generous on purpose (machines are noisy): they catch a fan-in that became O(width)
or a batch path that stopped batching, not a slow afternoon.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import psycopg
import pytest

pytestmark = [pytest.mark.storage, pytest.mark.slow]

BENCHMARKS = {"fan_in_cost_by_width", "simultaneous_finish", "batching", "throughput", "map_10k"}


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    return {f"{name}.{key}": value
            for name, bench in report["benchmarks"].items()
            for key, value in bench["ratios"].items()}


def test_quick_bench_reports_sane_numbers_and_cleans_up(admin_url, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "bench", "--quick", "--output", str(out),
         "--database-url", admin_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=120)
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
    assert set(report["benchmarks"]) == BENCHMARKS
    for bench in report["benchmarks"].values():
        assert {"parameters", "results", "ratios", "seconds"} <= set(bench)

    found = ratios(report)
    assert len(found) >= 5
    for name, value in found.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)

    fan_in = report["benchmarks"]["fan_in_cost_by_width"]
    assert [w["width"] for w in fan_in["results"]] == [10, 100]
    assert all(w["per_completion"]["n"] >= 150 for w in fan_in["results"])
    # O(1) per completion: a 10x wider join must not cost ~10x per completion.
    assert fan_in["ratios"]["median_100_over_10"] < 5
    # ... nor do the last completions of a join cost more than its first ones.
    assert fan_in["ratios"]["last_over_first_tenth_100"] < 5

    simultaneous = report["benchmarks"]["simultaneous_finish"]
    assert (simultaneous["parameters"]["width"], simultaneous["parameters"]["trials"]) == (50, 3)
    assert len(simultaneous["results"]["raw"]["concurrent_wall_ms"]) == 3
    assert len(simultaneous["results"]["raw"]["independent_concurrent_wall_ms"]) == 3
    assert simultaneous["results"]["concurrent_slowest_completion_ms"] <= \
        simultaneous["results"]["concurrent_wall_ms"]

    assert report["benchmarks"]["batching"]["ratios"]["speedup"] > 1

    throughput = report["benchmarks"]["throughput"]["results"]
    assert throughput["executions_per_second"] > 0
    assert throughput["tasks_per_second"] == pytest.approx(throughput["executions_per_second"] * 11,
                                                           rel=0.01)
    for key in ("join_fan_in_wait", "join_dispatch_latency"):
        assert throughput[key]["n"] == 20
        assert 0 <= throughput[key]["median_ms"] <= throughput[key]["p95_ms"]

    assert report["benchmarks"]["map_10k"]["parameters"]["items"] == 1_000
    assert report["benchmarks"]["map_10k"]["results"]["tasks_per_second"] > 0
    assert report["summary"]["batching_speedup"] == report["benchmarks"]["batching"]["ratios"]["speedup"]

    # Every scratch database of that run was dropped.
    with psycopg.connect(admin_url, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                            (f"konduit_bench_{proc.pid}_%",)).fetchall()
    assert left == []
