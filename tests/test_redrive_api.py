"""``POST /api/v1/executions/{id}/redrive`` and ``POST /api/v1/executions:bulk`` (a filter body,
a bounded batch size, counts), served without the workflow's code; refusals are problem+json
naming the field."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import konduit
from tests.support.workers import running_worker
from tests.test_api_v1 import api, refused
from tests.test_bulk import payments, start_failed


def test_redrive_and_bulk_over_http(make_app: Callable[..., konduit.App], db_url: str) -> None:
    healthy = {"on": False}
    app = make_app(payments(healthy))
    one = app.start("bulk-pay", {"n": 1}).id
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed):
        app.wait(one, timeout=30)
    many = start_failed(app, 30, {"cohort": "h1"})
    healthy["on"] = True
    with api(None, db_url) as http:  # no code: the registered definition
        done = http.post(f"/api/v1/executions/{str(one)[-12:]}/redrive")
        assert done.status_code == 200, done.text
        assert done.json() == {"id": str(one), "rerun": ["charge", "notify"],
                               "status": "running"}
        body = refused(http.post(f"/api/v1/executions/{one}/redrive"), 409)
        assert body["code"] == "not_redrivable" and "is running" in body["detail"]
        refused(http.post("/api/v1/executions/0190abcd-0000-7000-8000-000000000000/redrive"),
                404)

        where = {"workflow": "bulk-pay", "status": "failed", "since": "1h",
                 "tag": ["cohort=h1"]}
        dry = http.post("/api/v1/executions:bulk",
                        json={"action": "redrive", "where": where, "dry_run": True})
        assert dry.status_code == 200, dry.text
        assert {k: dry.json()[k] for k in ("matched", "done", "batches", "skipped")} == \
            {"matched": 30, "done": 30, "batches": 0, "skipped": {}}
        assert {app.status(e).status for e in many} == {"failed"}
        bulk = http.post("/api/v1/executions:bulk",
                         json={"action": "redrive", "where": where, "batch_size": 7})
        assert bulk.status_code == 200, bulk.text
        counts = bulk.json()
        assert (counts["matched"], counts["done"], counts["batches"]) == (30, 30, 5)
        assert sorted(counts["ids"]) == sorted(map(str, many))
        assert counts["longest_batch_seconds"] <= counts["seconds"]

        # Bad bodies name the field at fault.
        refused(http.post("/api/v1/executions:bulk", json={"action": "delete", "where": where}),
                422, "body.action")
        refused(http.post("/api/v1/executions:bulk",
                          json={"action": "cancel", "where": where, "batch_size": 5000}),
                422, "body.batch_size")
        refused(http.post("/api/v1/executions:bulk",
                          json={"action": "cancel", "where": {"since": "whenever"}}),
                422, "body.where.since")
        refused(http.post("/api/v1/executions:bulk", json={"action": "cancel", "where": {}}),
                422, "body.where")
        refused(http.post("/api/v1/executions:bulk",
                          json={"action": "cancel", "where": {"colour": "red"}}), 422)
    with running_worker(app, concurrency=8):
        for eid in [one, *many]:
            assert app.wait(eid, timeout=30).status == "succeeded"


def test_a_bulk_job_reports_its_progress_batch_by_batch(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(payments())
    ids = start_failed(app, 2000, {"cohort": "job"})
    where = {"status": "failed", "tag": ["cohort=job"]}
    with api(None, db_url) as http:
        started = http.post("/api/v1/bulk-jobs", json={"action": "redrive", "where": where,
                                                       "batch_size": 50})
        assert started.status_code == 202, started.text
        job = started.json()
        assert job["state"] == "running" and job["action"] == "redrive"
        seen: list[dict[str, Any]] = []
        began = time.monotonic()
        while True:
            now = http.get(f"/api/v1/bulk-jobs/{job['id']}")
            assert now.status_code == 200, now.text
            seen.append(now.json())
            if seen[-1]["state"] != "running":
                break
            assert time.monotonic() - began < 300, seen[-1]
            time.sleep(0.05)
        last = seen[-1]
        assert (last["state"], last["matched"], last["done"], last["batches"], last["error"]) \
            == ("succeeded", 2000, 2000, 40, None)
        # Progress was reported between batches, and only grew.
        done = [s["done"] for s in seen]
        assert any(0 < d < 2000 for d in done), done
        assert done == sorted(done)
        assert {app.status(e).status for e in ids[:20]} == {"running"}
        refused(http.get("/api/v1/bulk-jobs/0190abcd-0000-7000-8000-000000000000"), 404)
        refused(http.post("/api/v1/bulk-jobs", json={"action": "redrive", "where": {}}),
                422, "body.where")
