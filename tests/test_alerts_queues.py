"""The queue_unserved alert with real worker processes: an execution whose next step is on a
queue that no live worker takes is not silent, and the alert resolves once a worker takes it."""

from __future__ import annotations

import pytest

import konduit
from tests.apps import queues_app
from tests.support.waiting import until
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

APP = "tests.apps.queues_app:app"


def test_ready_work_on_a_queue_no_live_worker_takes_raises_queue_unserved_until_one_does(
        db_url: str) -> None:
    app = konduit.App([queues_app.wf], database_url=db_url)
    env = {"KONDUIT_ALERT_QUEUE_UNSERVED": "2"}
    workers = [spawn_worker(APP, db_url, "--queue", "default", env=env)]
    try:
        until(lambda: app.workers(), timeout=60, what="the default-queue worker to register")
        handle = app.start("queues-render")
        until(lambda: handle.status().outcomes.get("prepare") == "succeeded", timeout=60,
              what="prepare to run on the default queue")
        (alert,) = until(lambda: app.alerts(kind="queue_unserved"), timeout=60,
                         what="a queue_unserved alert")
        assert (alert.subject, alert.workflow, alert.severity) == (
            "queues-render@1/gpu", "queues-render", "critical")
        assert alert.details["queue"] == "gpu" and alert.details["ready"] == 1
        assert alert.details["executions"] == [str(handle.id)]
        assert "'gpu'" in alert.message and str(handle.id) in alert.message
        # Soon after its grace (2 s), not at a cadence of half a minute.
        created = handle.status().created_at
        assert created is not None and (alert.raised_at - created).total_seconds() < 10, (
            alert.raised_at, created)
        assert handle.status().status == "running"

        workers.append(spawn_worker(APP, db_url, "--queue", "gpu", env=env))
        assert handle.wait(timeout=60).status == "succeeded"
        until(lambda: not app.alerts(kind="queue_unserved"), timeout=60,
              what="the queue_unserved alert to resolve")
        (closed,) = app.alerts(kind="queue_unserved", include_resolved=True)
        assert closed.resolved_at is not None
        assert "takes the queue" in str(closed.details["resolution"])
    finally:
        stop_workers(workers)
        app.close()
