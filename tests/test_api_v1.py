"""The HTTP API (``/api/v1``) over real HTTP, on a real database with a real worker.

Every endpoint; bad bodies and queries answered ``application/problem+json`` naming the field at
fault (never a 500); cursor pagination walked while executions keep being started.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest

import konduit
from konduit.web import create_app, database_client
from tests.apps import api_app
from tests.support.browser import serving
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage
PROBLEM = "application/problem+json"


@contextmanager
def api(app: konduit.App | None, db_url: str) -> Iterator[httpx.Client]:
    with serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        yield http


def finished(http: httpx.Client, eid: str, timeout: float = 30) -> dict[str, Any]:
    began = time.monotonic()
    while True:
        body: dict[str, Any] = http.get(f"/api/v1/executions/{eid}").json()
        if body["status"] not in ("pending", "running"):
            return body
        assert time.monotonic() - began < timeout, body
        time.sleep(0.1)


def refused(response: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """Check a problem+json refusal; returns its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    assert body["type"].startswith("urn:konduit:problem:")
    if field is not None:
        assert body["field"] == field, body
    return body


def test_every_endpoint(make_app: Callable[..., konduit.App], db_url: str) -> None:
    api_app.HEALED.clear()
    api_app.RELEASE.clear()
    app = make_app(*api_app.WORKFLOWS)
    with running_worker(app, poll_interval=0.05), api(app, db_url) as http:
        started = http.post("/api/v1/executions", json={
            "workflow": "api-flow", "input": {"fail": True}, "idempotency_key": "k-1",
            "timeout": "5m", "deadline_at": "2099-01-01T00:00:00Z"})
        assert started.status_code == 201, started.text
        eid = started.json()["id"]
        assert started.json()["status"] in ("pending", "running", "succeeded")
        again = http.post("/api/v1/executions", json={
            "workflow": "api-flow", "input": {"fail": True}, "idempotency_key": "k-1"})
        assert again.status_code == 201 and again.json()["id"] == eid
        refused(http.post("/api/v1/executions", json={
            "workflow": "api-flow", "input": {"fail": False}, "idempotency_key": "k-1"}),
            409, "body.idempotency_key")

        detail = finished(http, eid)
        assert detail["status"] == "succeeded" and detail["input"] == {"fail": True}
        assert detail["outcomes"]["flaky"] == "failed" and detail["output"] == ["fine"]
        assert detail["deadline_at"].startswith("2099-01-01") and detail["timeout_at"]
        assert {s["step"]: s["status"] for s in detail["steps"]}["flaky"] == "failed"
        [broke] = [a for a in detail["attempts"] if a["step"] == "flaky"]
        assert "Traceback" in broke["error"] and "flaky <b>broke</b> on purpose" in broke["error"]
        assert len(detail["attempts"]) == 4 and len(detail["output_versions"]) == 1

        letters = http.get("/api/v1/dead-letters").json()
        assert [(d["execution_id"], d["step"], d["workflow"]) for d in letters] \
            == [(eid, "flaky", "api-flow")]
        assert "on purpose" in letters[0]["error"]

        api_app.HEALED.set()
        repaired = http.post(f"/api/v1/executions/{eid}/repair")
        assert repaired.status_code == 200, repaired.text
        assert sorted(repaired.json()["rerun"]) == ["end", "flaky"]
        healed = finished(http, eid)
        assert healed["output"] == ["fine", "flaky"] and len(healed["output_versions"]) == 2
        refused(http.post(f"/api/v1/executions/{eid}/repair"), 409)  # nothing left to repair
        cancel_done = http.post(f"/api/v1/executions/{eid}/cancel")
        assert cancel_done.status_code == 200
        assert cancel_done.json() == {"id": eid, "cancelled": False, "status": "succeeded"}

        holding = http.post("/api/v1/executions", json={"workflow": "api-hold"}).json()["id"]
        cancelled = http.post(f"/api/v1/executions/{holding}/cancel").json()
        assert cancelled == {"id": holding, "cancelled": True, "status": "cancelled"}
        refused(http.post(f"/api/v1/executions/{holding}/repair"), 409)
        api_app.RELEASE.set()

        batch = http.post("/api/v1/executions:batch", json={"requests": [
            {"workflow": "api-flow", "input": i, "idempotency_key": f"b-{i}"} for i in range(3)]
            + [{"workflow": "api-flow", "input": 0, "idempotency_key": "b-0"}]})
        assert batch.status_code == 201, batch.text
        ids = [e["id"] for e in batch.json()["executions"]]
        assert len(set(ids)) == 3 and ids[0] == ids[3]
        for i in ids[:3]:
            assert finished(http, i)["status"] == "succeeded"

        listed = http.get("/api/v1/executions", params={"workflow": "api-flow"}).json()
        assert [e["id"] for e in listed["items"]] == [*ids[2::-1], eid]
        assert listed["next_cursor"] is None
        assert http.get("/api/v1/executions", params={"status": "cancelled"}).json()["items"][0]["id"] \
            == holding

        [flow] = [w for w in http.get("/api/v1/workflows").json() if w["name"] == "api-flow"]
        assert flow["served"] and flow["version"] == 1
        assert sorted(map(tuple, flow["edges"])) == [("begin", "fine"), ("begin", "flaky"),
                                                     ("fine", "end"), ("flaky", "end")]
        assert flow["joins"] == [{"step": "end", "upstream": ["fine", "flaky"],
                                  "policy": {"kind": "all_done", "k": None}}]
        assert {s["name"]: s["required"] for s in flow["steps"]}["flaky"] is False

        [worker] = http.get("/api/v1/workers").json()
        assert worker["concurrency"] == 8 and "api-flow@1" in worker["workflows"]
        [schedule] = http.get("/api/v1/schedules").json()
        assert schedule["name"] == "api-hourly" and schedule["workflow"] == "api-hold"
        assert schedule["input"] == {"from": "schedule"} and schedule["next_tick"]
        assert http.get("/api/v1/alerts", params={"all": "true"}).json() == []
        refused(http.get("/api/v1/alerts", params={"kind": "bogus"}), 422, "query.kind")
        stats = http.get("/api/v1/stats", params={"workflow": "api-flow"}).json()
        assert {b["step"] for b in stats["branches"]} >= {"begin", "fine", "flaky", "end"}
        refused(http.get("/api/v1/stats", params={"history": "lately"}), 422, "query.history")

        # The first, unversioned API is gone: /api/v1 is the one JSON shape of an execution.
        for gone in ("/api/executions", f"/api/executions/{eid}", "/api/alerts"):
            assert http.get(gone).status_code == 404, gone
        docs = http.get("/api/v1/docs")
        assert docs.status_code == 200 and "/api/v1/executions:batch" in docs.text
        spec = http.get("/openapi.json").json()
        assert "/api/v1/executions/{execution_id}" in spec["paths"]
        assert not any(p.startswith("/dead-letters") for p in spec["paths"])  # pages are no API


def test_bad_bodies_are_problems_never_500(make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(*api_app.WORKFLOWS, max_payload_bytes=1000)
    with api(app, db_url) as http:
        start = "/api/v1/executions"
        refused(http.post(start, content=b"{not json", headers={"content-type": "application/json"}),
                422)
        refused(http.post(start, json=[1, 2]), 422, "body")
        refused(http.post(start, json={}), 422, "body.workflow")
        refused(http.post(start, json={"workflow": "api-flow", "colour": "red"}), 422, "body.colour")
        refused(http.post(start, json={"workflow": 7}), 422, "body.workflow")
        unknown = refused(http.post(start, json={"workflow": "nope"}), 422, "body.workflow")
        assert "unknown workflow 'nope'" in unknown["detail"] and "api-flow" in unknown["detail"]
        assert unknown["code"] == "workflow_not_found"
        refused(http.post(start, json={"workflow": "api-flow", "version": 9}), 422, "body.version")
        refused(http.post(start, json={"workflow": "nope", "version": 1}), 422, "body.workflow")
        refused(http.post(start, json={"workflow": "api-flow", "timeout": "soon"}), 422, "body.timeout")
        refused(http.post(start, json={"workflow": "api-flow", "timeout": -1}), 422, "body.timeout")
        refused(http.post(start, json={"workflow": "api-flow", "deadline_at": "2099-01-01T00:00:00"}),
                422, "body.deadline_at")
        refused(http.post(start, json={"workflow": "api-flow", "input": "x" * 2000}), 422,
                "body.input")
        batch = "/api/v1/executions:batch"
        refused(http.post(batch, json={"requests": [{"workflow": "api-flow"}, {"workflow": "nope"}]}),
                422, "body.requests.1.workflow")
        refused(http.post(batch, json={"requests": [{"workflow": "api-flow"}] * 1001}), 422,
                "body.requests")
        conflict = refused(http.post(batch, json={"requests": [
            {"workflow": "api-flow", "input": 1, "idempotency_key": "same"},
            {"workflow": "api-flow", "input": 2, "idempotency_key": "same"}]}), 409,
            "body.requests.1.idempotency_key")
        assert conflict["code"] == "idempotency_conflict"
        refused(http.post(batch, json={"requests": [{"workflow": "api-flow"},
                                                    {"workflow": "api-flow", "timeout": "soon"}]}),
                422, "body.requests.1.timeout")
        assert http.get(start).json()["items"] == []  # nothing of the refused batches started

        refused(http.get(start, params={"limit": 0}), 422, "query.limit")
        refused(http.get(start, params={"limit": "many"}), 422, "query.limit")
        refused(http.get(start, params={"status": "asleep"}), 422, "query.status")
        refused(http.get(start, params={"cursor": "bm90IGEgY3Vyc29y"}), 422, "query.cursor")
        refused(http.get(start, params={"cursor": "!!"}), 422, "query.cursor")
        # The queries' faults are named by the errors too (the field, never the message).
        refused(http.get("/api/v1/stats", params={"history": "soon"}), 422, "query.history")
        refused(http.get("/api/v1/stats", params={"fan_in_alert": "x"}), 422,
                "query.fan_in_alert")
        refused(http.get("/api/v1/stats", params={"workflow": "nope"}), 422, "query.workflow")
        assert refused(http.get("/api/v1/alerts", params={"kind": "nope"}), 422,
                       "query.kind")["code"] == "alert_error"
        refused(http.get(f"{start}/not-an-id"), 404)
        refused(http.get(f"{start}/{uuid4()}"), 404)
        refused(http.post(f"{start}/{uuid4()}/cancel"), 404)
        refused(http.post(f"{start}/{uuid4()}/repair"), 404)
        refused(http.get("/api/v1/nothing-here"), 404)
        # A body announced bigger than the server takes is refused before it is read.
        host, port = str(http.base_url.host), http.base_url.port
        with socket.create_connection((host, port or 80), timeout=10) as raw:
            raw.sendall(f"POST {start} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                        f"\r\nContent-Length: {65 * 2**20}\r\n\r\n{{".encode())
            answer = raw.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 413") and PROBLEM in answer
        refused(http.delete(start), 405)


def test_starting_without_the_app_uses_the_registered_definitions(db_url: str) -> None:
    """Without --app a start needs the workflow registered by a worker (tests of the starts
    themselves: tests/test_client_by_name.py); an unknown one is refused naming the field."""
    with api(None, db_url) as http:
        body = refused(http.post("/api/v1/executions", json={"workflow": "api-flow"}), 422,
                       "body.workflow")
        assert "unknown workflow 'api-flow'" in body["detail"]
        empty = http.post("/api/v1/executions:batch", json={"requests": []})
        assert empty.status_code == 201 and empty.json() == {"executions": []}
        assert http.get("/api/v1/workflows").json() == []  # reading needs no code


def test_cursor_walk_has_no_duplicates_or_gaps(make_app: Callable[..., konduit.App],
                                               db_url: str) -> None:
    app = make_app(*api_app.WORKFLOWS)
    # One transaction: every one of them has the same created_at, so the id breaks the ties.
    first = [str(h.id) for h in app.start_many([konduit.StartRequest("api-flow", i) for i in range(37)])]
    first += [str(app.start("api-hold", i).id) for i in range(8)]
    with api(app, db_url) as http:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            page = http.get("/api/v1/executions", params={"limit": 10} | (
                {"cursor": cursor} if cursor else {})).json()
            seen += [e["id"] for e in page["items"]]
            pages += 1
            # Executions started during the walk are newer: they never shift a later page.
            app.start("api-flow", {"during": pages})
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 5 and len(seen) == len(set(seen)) == 45
        assert set(seen) == set(first)
        assert seen == first[:36:-1] + sorted(first[:37], key=UUID, reverse=True)
        filtered = http.get("/api/v1/executions", params={"workflow": "api-hold", "limit": 5}).json()
        rest = http.get("/api/v1/executions", params={"workflow": "api-hold", "limit": 5,
                                                      "cursor": filtered["next_cursor"]}).json()
        assert [e["id"] for e in filtered["items"] + rest["items"]] == first[:36:-1]
        assert rest["next_cursor"] is None


def test_a_callers_traceparent_is_stored_with_the_execution(make_app: Callable[..., konduit.App],
                                                            db_url: str) -> None:
    """A W3C traceparent header on a start puts the execution in the caller's trace (stored for
    the workers that trace); one that is not valid is ignored, never an error."""
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    app = make_app(*api_app.WORKFLOWS)
    with api(app, db_url) as http:
        one = http.post("/api/v1/executions", json={"workflow": "api-flow", "input": {}},
                        headers={"traceparent": parent, "tracestate": "vendor=x"})
        many = http.post("/api/v1/executions:batch", json={"requests": [
            {"workflow": "api-flow", "input": i} for i in range(2)]},
            headers={"traceparent": parent})
        bad = [http.post("/api/v1/executions", json={"workflow": "api-flow", "input": {}},
                         headers={"traceparent": value})
               for value in ("nonsense", "ff-" + parent[3:],
                             "00-00000000000000000000000000000000-00f067aa0ba902b7-01")]
        assert one.status_code == 201 and many.status_code == 201
        assert all(r.status_code == 201 for r in bad), [r.text for r in bad]
    with psycopg.connect(db_url) as conn:
        def stored(eid: str) -> tuple[object, ...]:
            row = conn.execute("SELECT traceparent, tracestate FROM konduit_executions "
                               "WHERE id = %s", (eid,)).fetchone()
            assert row is not None
            return tuple(row)

        assert stored(one.json()["id"]) == (parent, "vendor=x")
        assert [stored(e["id"]) for e in many.json()["executions"]] == [(parent, None)] * 2
        assert [stored(r.json()["id"]) for r in bad] == [(None, None)] * 3
