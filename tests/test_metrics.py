"""Prometheus metrics (``konduit metrics``): the stats of a real history, scraped over HTTP.

A fan-out/fan-in workflow with one slow branch runs a few times on a real worker; an exporter
serves its database (in a thread, and once as the real CLI process), and ``/metrics`` is parsed
with prometheus_client's own parser. An unreachable database still answers, with an error gauge.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import konduit
from konduit.observe.metrics import EXECUTION_STATUSES, metric_families, serve
from konduit.observe.stats import build_stats
from tests.support.workers import running_worker
from tests.test_cli import _env, assert_clean_error, konduit_cli
from tests.test_stats import SLOW_SECONDS, fan_in_workflow, run

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"
# prometheus_client names a counter's family without its _total (its sample keeps it).
COUNTERS = {"konduit_step_throttled_seconds", "konduit_step_throttled_claims"}
Samples = dict[str, list[Sample]]


def parse(text: str) -> Samples:
    """Samples by metric family name."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def scrape(url: str, timeout: float = 10) -> Samples:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200
        return parse(response.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    [found] = [s.value for s in samples[name] if labels.items() <= s.labels.items()]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def cli_exporter(*args: str) -> Iterator[str]:
    """``python -m konduit.cli metrics`` on a free port; yields its URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "konduit.cli", "metrics", "--port", str(port),
                             *args], env=_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(300):
            assert proc.poll() is None, proc.communicate()
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err  # SIGTERM is a clean stop
    assert f"serving {url}" in err


def test_metric_families_from_stats() -> None:
    row = {"workflow_name": "wf", "step": "slow", "p50": None, "p95": None, "p99": None,
           "attempts": 2, "retries": 1, "lost": 1, "succeeded": 0, "degraded": 0, "failed": 1,
           "timed_out": 0, "skipped": 0, "cancelled": 0, "unfinished": 1,
           "last_success_at": None, "since_last_success": None}
    join = {"workflow_name": "wf", "step": "join", "samples": 2, "wait_p50": 0.4, "wait_p95": 0.5,
            "wait_max": 0.6, "dispatch_p50": None, "dispatch_p95": None, "stragglers": {"slow": 2}}
    waits = [{"workflow_name": "wf", "step": "join", "execution_id": "e", "straggler": "slow",
              "waiting": False, "wait": 0.6, "created_at": datetime.now(UTC)}]
    stats = build_stats([row], [join], waits, workflow=None, history_seconds=60, threshold=0.5,
                        consecutive=1)
    families = {f.name: f for f in metric_families(stats, [
        {"workflow_name": "wf", "status": "failed", "executions": 1}])}
    # Counters (growing forever) end in _total; the window's counts are gauges.
    assert all(f.type == ("counter" if f.name in COUNTERS else "gauge")
               for f in families.values()), {f.name: f.type for f in families.values()}
    samples = {name: f.samples for name, f in families.items()}
    assert samples["konduit_step_duration_seconds"] == []  # no successful attempt: no value
    assert samples["konduit_step_seconds_since_success"] == []
    assert samples["konduit_join_dispatch_latency_seconds"] == []
    assert value(samples, "konduit_step_lost_attempts", step="slow") == 1
    assert value(samples, "konduit_step_outcomes", outcome="failed") == 1
    assert value(samples, "konduit_join_fan_in_wait_seconds", quantile="0.95") == 0.5
    assert value(samples, "konduit_join_fan_in_alert", join="join") == 1
    assert value(samples, "konduit_join_straggler_count", branch="slow") == 2
    executions = {s.labels["status"]: s.value for s in samples["konduit_executions"]}
    assert executions == {s: float(s == "failed") for s in EXECUTION_STATUSES}


@pytest.mark.storage
def test_exporter_shows_live_workers_their_tasks_and_abandoned_threads(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    hang = threading.Event()
    wf = konduit.Workflow("metrics-hung", version=1)

    @wf.step(deadline="200ms", retry=konduit.Retry(max_attempts=1))
    def stuck(ctx: konduit.Context) -> None:
        hang.wait(60)  # ignores its deadline: the worker abandons the thread

    app = make_app(wf)
    try:
        with running_worker(app, concurrency=2, heartbeat_interval=0.2), \
                serve(db_url, port=0) as exporter:
            with pytest.raises(konduit.ExecutionFailed):
                app.start(wf.name).wait(timeout=10)
            # The heartbeat reports both counts, each as it stood at that beat: one beat may fall
            # between the thread being abandoned and the attempt leaving the running set, so
            # wait for a beat after both.
            deadline = time.monotonic() + 10
            while True:
                samples = scrape(exporter.url)
                abandoned = samples.get("konduit_worker_abandoned_threads", [])
                running = samples.get("konduit_worker_running_tasks", [])
                settled = [s.value for s in abandoned] == [1] and [s.value for s in running] == [0]
                if settled or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert value(samples, "konduit_workers_live") == 1
            assert [s.value for s in abandoned] == [1]
            assert value(samples, "konduit_worker_running_tasks") == 0
    finally:
        hang.set()


@pytest.mark.storage
def test_exporter_serves_the_stats_of_a_real_history(make_app: Callable[..., konduit.App],
                                                      db_url: str) -> None:
    wf = fan_in_workflow("metrics-fan-in")
    runs = 3
    app = make_app(wf)
    with running_worker(app, concurrency=8, poll_interval=0.05):
        run(app, wf.name, runs)

    with serve(db_url, port=0) as exporter:  # the default rule: 20 s, twice in a row
        samples = scrape(exporter.url)
        again = scrape(exporter.url)  # one pool for the process, not one per scrape
    assert value(samples, "konduit_scrape_error") == 0 == value(again, "konduit_scrape_error")
    assert 0 < value(samples, "konduit_scrape_duration_seconds") < 5

    p50 = {s.labels["step"]: s.value for s in samples["konduit_step_duration_seconds"]
           if s.labels["quantile"] == "0.5" and s.labels["workflow"] == wf.name}
    assert set(p50) == {"start", "quick", "brisk", "slow", "join", "announce"}
    assert max(p50, key=lambda step: p50[step]) == "slow" and p50["slow"] >= SLOW_SECONDS
    for quantile in ("0.5", "0.95", "0.99"):
        assert value(samples, "konduit_step_duration_seconds", step="slow", quantile=quantile) > 0
    assert value(samples, "konduit_step_attempts", step="announce") == 2 * runs
    assert value(samples, "konduit_step_retries", step="announce") == runs
    assert value(samples, "konduit_step_lost_attempts", step="slow") == 0
    assert value(samples, "konduit_step_outcomes", step="slow", outcome="succeeded") == runs
    assert 0 <= value(samples, "konduit_step_seconds_since_success", step="join") < 60

    wait = value(samples, "konduit_join_fan_in_wait_seconds", join="join", quantile="0.5")
    assert wait >= SLOW_SECONDS - 0.05
    assert value(samples, "konduit_join_fan_in_wait_seconds", quantile="0.95") >= wait
    assert value(samples, "konduit_join_fan_in_wait_seconds_max", join="join") >= wait
    assert value(samples, "konduit_join_dispatch_latency_seconds", quantile="0.5") < wait
    assert {s.labels["branch"]: s.value for s in samples["konduit_join_straggler_count"]} == \
        {"slow": runs}
    assert value(samples, "konduit_join_fan_in_alert", workflow=wf.name, join="join") == 0
    assert value(samples, "konduit_executions", workflow=wf.name, status="succeeded") == runs
    assert value(samples, "konduit_executions", status="failed") == 0

    # The real command, with seed 004's rule scaled down: one wait over 50 ms pages.
    with cli_exporter("--fan-in-alert", "0.05s", "--consecutive", "1",
                      "--database-url", db_url) as url:
        samples = scrape(url)
    assert value(samples, "konduit_scrape_error") == 0
    assert value(samples, "konduit_join_fan_in_alert", workflow=wf.name, join="join") == 1
    assert value(samples, "konduit_executions", workflow=wf.name, status="succeeded") == runs


@pytest.mark.storage
def test_an_unreachable_database_is_a_scrape_error_not_a_failed_scrape() -> None:
    with serve(UNREACHABLE, port=0, timeout=2) as exporter:
        for _ in range(2):
            began = time.monotonic()
            samples = scrape(exporter.url)
            assert time.monotonic() - began < 3
            assert value(samples, "konduit_scrape_error") == 1
            assert "konduit_step_duration_seconds" not in samples  # no stale or made-up numbers
    with cli_exporter("--database-url", UNREACHABLE) as url:
        began = time.monotonic()
        assert value(scrape(url), "konduit_scrape_error") == 1
        assert time.monotonic() - began < 6


@pytest.mark.storage
def test_bad_options_and_a_taken_port_are_one_line_errors() -> None:
    assert_clean_error(konduit_cli("metrics", "--history", "lately", "--database-url", UNREACHABLE),
                       "--history")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert_clean_error(konduit_cli("metrics", "--port", port, "--database-url", UNREACHABLE),
                           f"cannot listen on 127.0.0.1:{port}")
