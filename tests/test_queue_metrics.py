"""The metrics to scale workers on (``konduit metrics``): per queue and workflow, the tasks ready
to run now, delayed, running, and the age of the oldest ready one, scraped over HTTP from a real
database; and the naming rule every family keeps (counters, and only counters, end in
``_total``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import konduit
from konduit.observe.metrics import serve
from tests.support.workers import running_worker
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.storage


def test_per_queue_depth_age_and_running(make_app: Callable[..., konduit.App],
                                         db_url: str) -> None:
    release = threading.Event()
    bulk = konduit.Workflow("bulk-work", version=1)

    @bulk.step(queue="bulk")
    def crunch(ctx: konduit.Context) -> int:
        release.wait(30)
        return 1

    other = konduit.Workflow("other-work", version=1)

    @other.step(queue="bulk")
    def tidy(ctx: konduit.Context) -> int:
        return 2

    app = make_app(bulk, other)
    handles = [app.start("bulk-work", i) for i in range(5)] + [app.start("other-work", 0)]
    with psycopg.connect(db_url) as conn:  # one of them ready only in an hour (a backoff)
        conn.execute("UPDATE konduit_tasks SET run_at = now() + interval '1 hour' "
                     "WHERE execution_id = %s", (handles[-2].id,))
    time.sleep(0.3)  # the oldest ready task has waited at least this long
    with serve(db_url, port=0) as exporter:
        samples = scrape(exporter.url)
        bulk_work = {"queue": "bulk", "workflow": "bulk-work"}
        assert value(samples, "konduit_queue_ready_tasks", **bulk_work) == 4
        assert value(samples, "konduit_queue_delayed_tasks", **bulk_work) == 1
        assert value(samples, "konduit_queue_running_tasks", **bulk_work) == 0
        assert value(samples, "konduit_queue_ready_tasks", queue="bulk",
                     workflow="other-work") == 1
        age = value(samples, "konduit_queue_oldest_ready_age_seconds", **bulk_work)
        assert 0.3 <= age < 60

        try:
            with running_worker(app, concurrency=2, queues=("bulk",), poll_interval=0.05):
                deadline = time.monotonic() + 20
                while True:  # two handlers hold their slots: two running, the rest ready
                    samples = scrape(exporter.url)
                    running = value(samples, "konduit_queue_running_tasks", **bulk_work)
                    if running == 2 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                assert running == 2
                assert value(samples, "konduit_queue_ready_tasks", **bulk_work) == 2
                release.set()
                for h in handles[:4] + handles[-1:]:
                    h.wait(timeout=30)
        finally:
            release.set()
        # Drained: the series stay, at 0 (an autoscaler reads a vanished one as no data).
        samples = scrape(exporter.url)
        assert value(samples, "konduit_queue_ready_tasks", **bulk_work) == 0
        assert value(samples, "konduit_queue_running_tasks", **bulk_work) == 0
        assert value(samples, "konduit_queue_oldest_ready_age_seconds", **bulk_work) == 0
        assert value(samples, "konduit_queue_ready_tasks", queue="bulk",
                     workflow="other-work") == 0
        assert value(samples, "konduit_queue_delayed_tasks", **bulk_work) == 1


def test_counters_and_only_counters_end_in_total(make_app: Callable[..., konduit.App],
                                                 db_url: str) -> None:
    wf = konduit.Workflow("named", version=1)

    @wf.step(concurrency=1)
    def limited(ctx: konduit.Context) -> int:
        return 1

    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        app.start("named").wait(timeout=30)
    import urllib.request

    with serve(db_url, port=0) as exporter, urllib.request.urlopen(exporter.url) as response:
        text = response.read().decode()
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
    deprecated = {"konduit_step_hedges_total", "konduit_step_hedges_won_total"}
    for name, kind in types.items():
        if name in deprecated:
            continue
        assert (kind == "counter") == name.endswith("_total"), (name, kind)
    assert types["konduit_stalls_total"] == "counter"
    assert types["konduit_step_throttled_seconds_total"] == "counter"
    assert types["konduit_queue_ready_tasks"] == "gauge"
    assert {"konduit_step_attempts", "konduit_step_retries", "konduit_step_lost_attempts",
            "konduit_step_hedges", "konduit_step_hedges_won"} <= set(types)
    assert list(text_string_to_metric_families(text))  # the whole page parses
