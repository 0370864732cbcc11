"""``konduit bench --quick`` runs end to end and reports sane numbers.

The bounds are generous on purpose (machines are noisy): they catch a fan-in that became O(width)
or a batch path that stopped batching, not a slow afternoon. Speed itself is judged from the
report (``summary.targets``), never asserted here; correctness figures (stalls, duplicate joins)
are. The runs' own time limits bound a hang, not speed: ~1 minute each on an idle machine, they
took more than 5 on one that other processes overloaded (load 15-22 on 2 cores, issue 29).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from konduit.bench.fleet import Observer, commits_between
from konduit.bench.soak import SoakSettings, compare
from konduit.bench.suite import BENCHMARKS, FULL_ONLY, ON_REQUEST, codec_name, use_codec
from konduit.errors import BenchError

pytestmark = [pytest.mark.storage]

QUICK = set(BENCHMARKS) - {*FULL_ONLY, *ON_REQUEST}


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    return {f"{name}.{key}": value
            for name, bench in report["benchmarks"].items()
            for key, value in bench["ratios"].items()}


# A database no backend used before: a reused one may still take in the commit counts of the
# backends that emptied it (statistics are flushed as a backend exits, after its client left).
@pytest.mark.fresh_database
def test_commit_count_is_exactly_what_others_committed(db_url):
    """The transactions-per-task figure rests on this: others' commits, none of the bench's."""

    def one_count(table: str) -> int:
        obs = Observer(db_url)
        try:
            before = obs.commits()
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute(f"CREATE TABLE {table} (n int)")
                for i in range(25):
                    other.execute(f"INSERT INTO {table} VALUES (%s)", (i,))
            obs.one("SELECT 1")  # the observer's own statements in between are not counted
            after = obs.commits()
        finally:
            obs.close()
        return commits_between(before, after)

    # The 26 statements, and the other session's own start-up (PostgreSQL counts a transaction
    # or two for a new backend) — not the observer's dozen polls and reads. An autovacuum worker
    # that visits the database mid-count adds its own transactions (a CI run counted 30), so the
    # fewest of a few counts is checked: noise only ever adds, a miscount adds every time.
    counts = []
    for trial in range(4):
        counts.append(one_count(f"t{trial}"))
        if counts[-1] <= 28:
            break
    assert 26 <= min(counts) <= 28, counts


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the bench and the worker processes it started (its process group: a bench killed
    alone, at a time limit, left its workers running, connected to the server)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# A hang bound: the run's end is what the test waits for (~1 minute idle, 5 minutes and more
# beside other suites on 2 cores).
HANG_SECONDS = 1200


@pytest.mark.slow
@pytest.mark.timeout(HANG_SECONDS + 120)
def test_quick_bench_reports_sane_numbers_and_cleans_up(admin_url, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "bench", "--quick", "--output", str(out),
         "--database-url", admin_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=HANG_SECONDS)
    finally:
        kill_group(proc)
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
    # Customer b after customer a's backlog of 3,000 (separate starts, then start_many calls):
    # claimed within a round or so of a's tasks each time, a's backlog still running.
    for keyed in fair["keyed_backlog"]:
        assert keyed["b_start_to_finish"]["n"] == 10 and keyed["a_still_running"] > 0
        assert keyed["a_tasks_claimed_ahead_max"] <= 8 * 3, keyed
    wide_map = b["wide_map"]["results"]
    assert (wide_map["items"], wide_map["item_attempts"], wide_map["join_attempts"]) == \
        (2_000, 2_000, 1)
    assert b["wide_map"]["ratios"]["map_items_over_static_branches"] > 0
    # Worker CPU per task, read from /proc: a real figure, and the ratio of both runs' figures.
    assert wide_map["worker_cpu_ms_per_task"] > 0 and wide_map["static_worker_cpu_ms_per_task"] > 0
    assert b["wide_map"]["ratios"]["static_cpu_over_map_cpu_per_task"] > 0

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


# -- the soak (issue 16): only its shape and its arithmetic here; the real run is not in CI -------


def _window(index: int, tasks: int, rss: float) -> dict[str, Any]:
    return {"index": index, "seconds": 10.0, "tasks_finished": tasks,
            "worker_rss_mb_samples": [rss, rss],
            "state": {"rows": {"executions": 100}, "database_mb": 9.0}}


def test_soak_compares_the_first_windows_with_the_last():
    windows = [_window(0, 1000, 50.0), _window(1, 1000, 50.0), _window(2, 1000, 53.0),
               _window(3, 950, 56.0)]
    joins = [[0.004] * 98 + [0.010] * 2, [0.005] * 100, [0.005] * 100, [0.005] * 98 + [0.011] * 2]
    out = compare(windows, joins, 1)
    assert (out["first"]["windows"], out["last"]["windows"]) == ([0], [3])
    checks = out["checks"]
    assert checks["tasks_per_second"] == {"ratio": 0.95, "within_10_percent": True,
                                          "no_worse_than_10_percent": True}
    assert checks["join_dispatch_p99"]["ratio"] == 1.1  # p99 of 100 is the 99th value: 10 -> 11 ms
    # 50 -> 56 MB is a 12 % rise: outside the 10 %, and the run fails.
    assert checks["worker_rss"]["ratio"] == 1.12
    assert checks["worker_rss"]["within_10_percent"] is False
    assert (out["passed"], out["passed_no_worse"]) == (False, False)
    # Two windows a side: RSS 50 -> 54.5 (+9 %), throughput 1000 -> 975/10 s.
    two = compare(windows, joins, 2)["checks"]
    assert (two["worker_rss"]["ratio"], two["tasks_per_second"]["ratio"]) == (1.09, 0.975)
    # Falling latency is outside "within 10 %" but no worse.
    faster = compare(windows[::-1], joins[::-1], 1)["checks"]["join_dispatch_p99"]
    assert faster["ratio"] == 0.909 and faster["within_10_percent"] is True
    assert compare(windows, [[0.01]] * 3 + [[0.005]], 1)["checks"]["join_dispatch_p99"] == {
        "ratio": 0.5, "within_10_percent": False, "no_worse_than_10_percent": True}


def test_bench_codec_goes_into_the_environment_its_worker_processes_inherit(monkeypatch):
    """``konduit bench --codec``: the worker processes the bench starts take the environment
    the bench has, so the codec is set there (with a key made for the run when none is given);
    an unknown codec is refused naming the option."""
    for name in ("KONDUIT_CODEC", "KONDUIT_CODEC_KEYS"):  # restored after the test
        monkeypatch.setenv(name, "none")
        monkeypatch.delenv(name)
    assert use_codec("Encrypted") == "zlib+aesgcm" == codec_name()
    assert os.environ["KONDUIT_CODEC"] == "encrypted"
    ring = os.environ["KONDUIT_CODEC_KEYS"]
    assert ring.startswith("bench:") and len(ring) > 40
    assert use_codec("aesgcm") == "aesgcm" and os.environ["KONDUIT_CODEC_KEYS"] == ring
    assert use_codec("none") is None and codec_name() is None
    with pytest.raises(BenchError, match="--codec 'rot13'"):
        use_codec("rot13")
    # The keys a user gave are the ones used.
    monkeypatch.setenv("KONDUIT_CODEC_KEYS", "mine:" + "A" * 43 + "=")
    use_codec("encrypted")
    assert os.environ["KONDUIT_CODEC_KEYS"].startswith("mine:")


def test_the_in_process_benchmarks_seal_their_payloads_under_the_bench_codec(
        monkeypatch, db_url, admin_url):
    """The benchmarks that drive the completer in the bench's own process record outputs as a
    worker does, sealed by ``--codec``'s codec (they were written plain); the search bench,
    whose rows SQL writes plain and whose searches by input a codec refuses, runs without one,
    and the report says so beside its results."""
    import asyncio

    from konduit.bench import search
    from konduit.bench.suite import WITHOUT_CODEC, batching, run_bench

    for name in ("KONDUIT_CODEC", "KONDUIT_CODEC_KEYS"):  # restored after the test
        monkeypatch.setenv(name, "none")
        monkeypatch.delenv(name)
    use_codec("encrypted")
    asyncio.run(batching(db_url, 10, 1))
    with psycopg.connect(db_url) as conn:
        outputs = [t for (t,) in conn.execute("SELECT payload::text FROM konduit_outputs")]
    assert len(outputs) >= 20  # the root's, the branches' and the join's, twice
    assert all('"$konduit": "sealed"' in t for t in outputs), outputs[:3]
    search.search(db_url, executions=20_000, repeats=3)  # by input: refused under the codec before
    report = run_bench(admin_url, quick=True, only=["commit_probe", "batching"])
    assert report["payload_codec"] == "zlib+aesgcm"
    assert report["benchmarks"]["batching"]["payload_codec"] == "zlib+aesgcm"
    probe = report["benchmarks"]["commit_probe"]
    assert probe["payload_codec"] is None
    assert probe["payload_codec_note"] == WITHOUT_CODEC["commit_probe"]
    assert set(WITHOUT_CODEC) <= set(BENCHMARKS)


def test_soak_settings_refuse_a_retention_that_would_prune_a_window_before_it_is_read():
    resolved = SoakSettings().resolved()
    assert (resolved.duration, resolved.window, resolved.retention) == (1800, 30, 120)
    assert resolved.retention_interval == 15 and resolved.sample_every == 5
    resolved.validate()
    with pytest.raises(BenchError, match="at least two windows"):
        SoakSettings(window=30, retention=45).resolved().validate()
    with pytest.raises(BenchError, match="--duration"):
        SoakSettings(duration=50, window=30).resolved().validate()


@pytest.mark.timeout(HANG_SECONDS + 120)
def test_soak_runs_a_few_seconds_with_retention_pruning_and_reports_its_windows(admin_url, tmp_path):
    """`konduit bench --only soak` end to end, cut short: a real worker process whose retention
    prunes while the load runs, three 2-second windows, the first against the last. (~40 s
    idle; 160 s at load 17 on 2 cores, past the 120 s it was once given.)"""
    out = tmp_path / "soak.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "konduit.cli", "bench", "--only", "soak", "--duration", "6",
         "--window", "2", "--rate", "5", "--retention", "4", "--burst", "20",
         "--output", str(out), "--database-url", admin_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=HANG_SECONDS)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, stderr
    assert "bench: soak: window 3/3:" in stderr  # a line after each window
    report = json.loads(out.read_text())
    assert set(report["benchmarks"]) == {"soak"}
    soak = report["benchmarks"]["soak"]
    params, results = soak["parameters"], soak["results"]
    assert (params["duration"], params["window"], params["retention"]) == (6, 2, 4)
    assert (params["windows"], params["windows_compared"]) == (3, 1)
    windows = results["windows"]
    assert [w["index"] for w in windows] == [0, 1, 2]
    for w in windows:
        assert w["executions_started"] >= 5 and w["tasks_per_second"] > 0
        assert w["join_dispatch_latency"]["n"] >= 5 and w["worker_rss_mb_samples"]
        assert {"executions", "tasks", "attempts", "steps", "outputs"} <= set(w["state"]["rows"])
    assert (results["first"]["windows"], results["last"]["windows"]) == ([0], [2])
    assert set(results["checks"]) == {"tasks_per_second", "join_dispatch_p99", "worker_rss"}
    assert all(isinstance(c["within_10_percent"], bool) for c in results["checks"].values())
    assert isinstance(results["passed"], bool)
    assert results["executions_not_succeeded"] == 0
    # Retention ran during the soak: executions were deleted while the load went on.
    assert 0 < results["executions_pruned"] < results["executions_started"]
    assert windows[-1]["executions_pruned_so_far"] > 0
    assert set(results["capacity"]) == {"after_first_span", "end"}
    assert all(b["tasks"] == 20 * 10 and b["tasks_per_second"] > 0
               for b in results["capacity"].values())
    assert set(soak["ratios"]) == {"tasks_per_second_last_over_first",
                                   "join_dispatch_p99_last_over_first",
                                   "worker_rss_last_over_first", "capacity_end_over_first_span"}
    assert 0 < results["worker_peak_rss_mb"] < 1000
    assert "soak_worker_rss_last_over_first" in report["summary"]["targets"]
