"""A worker's own histograms (``konduit worker --metrics-port``): each attempt's handler time is
observed where it ends, in buckets Prometheus can aggregate across workers and time."""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

import konduit
from konduit.testing import worker_thread
from konduit.worker.metrics import BUCKETS, WorkerMetrics

pytestmark = pytest.mark.storage


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(pairs.get(k) == v for k, v in labels.items()):
            found.append(float(value))
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_each_attempt_is_observed_in_its_bucket_by_how_it_ended(db_url: str) -> None:
    wf = konduit.Workflow("histogram", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="0.01s"))
    def slow(ctx: konduit.Context) -> str:
        time.sleep(0.3)
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return "ok"

    @wf.step()
    def quick(ctx: konduit.Context) -> int:
        return 1

    with konduit.App([wf], database_url=db_url) as app, \
            worker_thread(app, metrics_port=0, metrics_host="127.0.0.1") as thread:
        handles = [app.start("histogram", {}) for _ in range(3)]
        for handle in handles:
            assert app.wait(handle.id, timeout=60).status == "succeeded"
        port = thread.worker().metrics_port
        assert port
        text = scrape(port)
    count = "konduit_attempt_duration_seconds_count"
    bucket = "konduit_attempt_duration_seconds_bucket"
    assert sample(text, count, workflow="histogram", step="quick", ending="returned") == 3
    assert sample(text, count, workflow="histogram", step="slow", ending="returned") == 3
    assert sample(text, count, workflow="histogram", step="slow", ending="raised") == 3
    # 0.3 s of sleep is never under the 0.25 s bucket; the upper buckets leave a loaded machine
    # seconds of slack (a sleep overshoots, a thread waits for a core).
    assert sample(text, bucket, step="slow", ending="returned", le="0.25") == 0
    assert sample(text, bucket, step="slow", ending="returned", le="10.0") == 3
    assert sample(text, bucket, step="quick", ending="returned", le="10.0") == 3
    assert sample(text, bucket, step="slow", ending="returned", le="+Inf") == 3
    total = sample(text, "konduit_attempt_duration_seconds_sum", step="slow", ending="returned")
    assert 0.9 <= total < 30
    assert "# TYPE konduit_attempt_duration_seconds histogram" in text
    assert "konduit_worker_attempts_running" in text


def test_without_a_port_nothing_is_measured_and_buckets_are_cumulative() -> None:
    metrics = WorkerMetrics(running=lambda: 2)
    metrics.attempt("w", "s", "returned", 0.07)
    metrics.attempt("w", "s", "returned", 7.0)
    metrics.attempt("w", "s", "deadline_passed", -1.0)  # a clock step: counted as 0 s
    port = metrics.serve(0, "127.0.0.1")
    try:
        text = scrape(port)
    finally:
        metrics.close()
    assert sample(text, "konduit_attempt_duration_seconds_bucket", ending="returned",
                  le="0.1") == 1
    assert sample(text, "konduit_attempt_duration_seconds_bucket", ending="returned",
                  le="10.0") == 2
    assert sample(text, "konduit_attempt_duration_seconds_bucket", ending="deadline_passed",
                  le="0.005") == 1
    assert sample(text, "konduit_worker_attempts_running") == 2
    assert list(BUCKETS) == sorted(BUCKETS)
    # A worker without --metrics-port leaves its executor without metrics: no cost, no port.
    assert konduit.worker.config.WorkerConfig().metrics_port is None


def test_the_metrics_endpoint_listens_on_loopback_unless_told() -> None:
    """As the dashboard: 127.0.0.1 by default; every interface only when --metrics-host says so."""
    from konduit.worker.config import WorkerConfig
    from tests.test_cli import konduit_cli

    assert WorkerConfig().metrics_host == "127.0.0.1"
    helped = konduit_cli("worker", "--help")
    assert helped.returncode == 0
    assert re.search(r"--metrics-host HOST.*?\[default: 127\.0\.0\.1\]", helped.stdout, re.DOTALL)
