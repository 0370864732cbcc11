"""A client by name and typed inputs (issue 18, items 4 and 5).

Another process, with only konduit importable (no test module on its path), starts, waits for
and cancels executions through ``konduit.Client`` while a real worker process serves them;
``konduit.AsyncClient`` likewise. A declared ``input=`` is checked at start by the App, the
code-less client and the API alike, refused with each field named before any row is written;
handlers get ``ctx.input`` as the model. The dashboard and its API serve without ``--app``.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import konduit
from konduit.web import create_app, database_client
from tests.apps import typed_app
from tests.support.browser import serving
from tests.support.waiting import until
from tests.support.workers import running_worker, spawn_worker, stop_workers

pytestmark = pytest.mark.storage

PROBLEM = "application/problem+json"

BAD_ORDER = {"quantity": 0, "note": 7, "lines": [{"sku": "a", "count": "many"}]}
"""Four faults: customer missing, quantity below 1, note not a string, a line's count."""
BAD_FIELDS = {"customer", "quantity", "note", "lines.0.count"}


def count_executions(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM konduit_executions").fetchone()
        assert row is not None
        return int(row[0])


def registered(db_url: str) -> set[str]:
    with psycopg.connect(db_url) as conn:
        return {f"{n}@{v}" for n, v in conn.execute("SELECT name, version FROM konduit_workflows")}


CLIENT_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import konduit
    # No workflow code can be imported here: the test's modules are not on the path.
    assert importlib.util.find_spec("tests") is None, "the test package is importable"
    out = {}
    with konduit.Client(sys.argv[1]) as client:
        out["workflows"] = sorted(f"{w.name}@{w.version}" for w in client.workflows())
        done = client.start("typed-order", {"customer": "acme", "quantity": 3,
                                            "lines": [{"sku": "x1", "count": 2}]})
        result = done.wait(timeout=90)
        out["status"], out["output"] = result.status, result.output
        held = client.start("typed-hold")
        out["cancelled"] = held.cancel()
        try:
            held.wait(timeout=60)
        except konduit.ExecutionFailed as failed:
            out["held_status"] = failed.result.status
        out["listed"] = sorted(r.workflow for r in client.list(limit=10))
        try:
            client.start("typed-order", BAD)
        except konduit.InputValidationError as refused:
            out["refused"] = refused.errors
        try:
            client.start("not-registered")
        except konduit.WorkflowNotFound as unknown:
            out["unknown"] = str(unknown)
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_another_process_starts_waits_and_cancels_by_name(db_url: str, tmp_path: Path) -> None:
    worker = spawn_worker("tests.apps.typed_app:app", db_url, log=tmp_path / "worker.log")
    try:
        until(lambda: {"typed-order@1", "typed-hold@1"} <= registered(db_url), timeout=60,
              what="the worker's registration")
        script = f"BAD = {BAD_ORDER!r}\n" + CLIENT_SCRIPT
        # -I: no PYTHONPATH, no current directory on the path; run from an empty directory.
        done = subprocess.run([sys.executable, "-I", "-c", script, db_url], cwd=tmp_path,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()
    finally:
        stop_workers([worker])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["workflows"] == ["typed-hold@1", "typed-order@1", "typed-schema@1"]
    assert out["status"] == "succeeded"
    # The handlers, in the worker, got the model; the client only ever had its schema.
    assert out["output"]["confirmed"] == {
        "model": "Order", "customer": "acme", "quantity": 3, "skus": ["x1"]}
    assert out["cancelled"] is True and out["held_status"] == "cancelled"
    assert out["listed"] == ["typed-hold", "typed-order"]
    assert set(out["refused"]) == BAD_FIELDS
    assert "unknown workflow 'not-registered'" in out["unknown"]
    assert "typed-order" in out["unknown"]  # the registered ones are named
    assert count_executions(db_url) == 2  # the refused start wrote nothing


def test_async_client_by_name(make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(*typed_app.WORKFLOWS)

    async def scenario() -> dict[str, Any]:
        async with konduit.AsyncClient(db_url) as client:
            with pytest.raises(konduit.WorkflowNotFound, match="typed-order"):
                await client.start("typed-orders")  # a typo: the known ones are listed
            ok = await client.start("typed-order", typed_app.Order(customer="b", quantity=2))
            schema = await client.start("typed-schema", {"n": 4, "tags": ["a"]})
            many = await client.start_many([
                {"workflow": "typed-schema", "input": {"n": 1}},
                {"workflow": "typed-order", "input": {"customer": "c", "quantity": 1},
                 "version": 1}])
            held = await client.start("typed-hold")
            with pytest.raises(konduit.InputValidationError) as bad:
                await client.start_many([{"workflow": "typed-schema", "input": {"n": 1}},
                                         {"workflow": "typed-schema", "input": {"n": -1, "x": 1}}])
            assert str(bad.value).startswith("start request 1: ")
            assert bad.value.errors == {"n": "-1 is less than the minimum of 0",
                                        "x": "unexpected field"}
            await asyncio.sleep(0)
            assert await held.cancel() is True
            with pytest.raises(konduit.ExecutionFailed):
                await held.wait(timeout=60)
            return {
                "ok": (await ok.wait(timeout=60)).output,
                "schema": (await schema.wait(timeout=60)).output,
                "many": [(await h.wait(timeout=60)).status for h in many],
                "status": (await client.status(ok.id)).status,
            }

    with running_worker(app):
        until(lambda: len(registered(db_url)) == 3, what="the worker's registration")
        out = asyncio.run(scenario())
    assert out["ok"]["input"] == "Order"
    assert out["schema"] == {"type": "dict", "input": {"n": 4, "tags": ["a"]}}
    assert out["many"] == ["succeeded", "succeeded"] and out["status"] == "succeeded"
    assert count_executions(db_url) == 5  # nothing of the refused batch


def test_bad_input_refused_by_the_app_naming_each_field(make_app: Callable[..., konduit.App],
                                                         db_url: str) -> None:
    app = make_app(*typed_app.WORKFLOWS)
    with pytest.raises(konduit.InputValidationError) as bad:
        app.start("typed-order", BAD_ORDER)
    assert set(bad.value.errors) == BAD_FIELDS
    assert bad.value.errors["quantity"] == "0 is less than the minimum of 1"
    assert bad.value.errors["customer"] == "field required"
    for field in BAD_FIELDS:
        assert field in str(bad.value)
    assert isinstance(bad.value, konduit.KonduitError)
    with pytest.raises(konduit.InputValidationError) as whole:
        app.start("typed-order", "not an object")
    assert list(whole.value.errors) == ["(root)"]
    with pytest.raises(konduit.InputValidationError, match="start request 2: "):
        app.start_many([{"workflow": "typed-order", "input": {"customer": "a", "quantity": 1}},
                        {"workflow": "typed-hold"}, {"workflow": "typed-schema", "input": {}}])
    assert count_executions(db_url) == 0  # refused before any row was written
    # What is stored is what the App stored for the same input given as the model: one
    # idempotency key means one execution whichever door started it.
    first = app.start("typed-order", typed_app.Order(customer="k", quantity=5), idempotency_key="k")
    with konduit.Client(db_url) as client:
        again = client.start("typed-order", {"customer": "k", "quantity": 5, "note": None,
                                             "lines": []}, idempotency_key="k")
    assert again.id == first.id


def test_the_stored_definition_starts_as_the_code_does(make_app: Callable[..., konduit.App],
                                                       db_url: str) -> None:
    """A code-less start makes the same rows as the App's: its flow-limited root task is
    limited (the claim enforces the limit), with the step's deadline, queue and attempts."""
    app = make_app(*typed_app.WORKFLOWS)
    by_app = app.start("typed-order", {"customer": "a", "quantity": 1})
    with konduit.Client(db_url) as client:
        by_name = client.start("typed-order", {"customer": "a", "quantity": 1})
    with psycopg.connect(db_url) as conn:
        rows = {eid: row for eid, *row in conn.execute(
            "SELECT execution_id, step, limited, queue, max_attempts, deadline_seconds, status "
            "FROM konduit_tasks ORDER BY step")}
        steps = conn.execute("SELECT execution_id, step, status, up_pending FROM konduit_steps "
                             "ORDER BY execution_id, step").fetchall()
    assert rows[by_app.id] == rows[by_name.id] == ["price", True, "default", 3, 60.0, "ready"]
    assert [s[1:] for s in steps if s[0] == by_app.id] == [s[1:] for s in steps if s[0] == by_name.id]


@contextmanager
def api(db_url: str) -> Iterator[httpx.Client]:
    """The dashboard as ``konduit dashboard`` serves it without ``--app``: no workflow code."""
    with serving(create_app(database_client(db_url, None), None)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        yield http


def refused(response: httpx.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["field"] == field, body
    return body


def test_the_api_without_the_app_starts_by_name_and_checks_input(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    with api(db_url) as http:
        unknown = refused(http.post("/api/v1/executions", json={"workflow": "typed-order"}),
                          "body.workflow")
        assert "unknown workflow 'typed-order'" in unknown["detail"]
        app = make_app(*typed_app.WORKFLOWS)
        with running_worker(app):  # registers the workflows, and runs them
            until(lambda: len(registered(db_url)) == 3, what="the worker's registration")
            started = http.post("/api/v1/executions", json={
                "workflow": "typed-order", "input": {"customer": "api", "quantity": 2}})
            assert started.status_code == 201, started.text
            eid = started.json()["id"]
            bad = refused(http.post("/api/v1/executions", json={
                "workflow": "typed-order", "input": BAD_ORDER}), "body.input.customer")
            assert {e["field"] for e in bad["errors"]} == {f"body.input.{f}" for f in BAD_FIELDS}
            assert all(e["message"] for e in bad["errors"])
            whole = refused(http.post("/api/v1/executions", json={
                "workflow": "typed-schema", "input": [1]}), "body.input")
            assert whole["errors"] == [{"field": "body.input", "message": "[1] is not of type 'object'"}]
            batch = refused(http.post("/api/v1/executions:batch", json={"requests": [
                {"workflow": "typed-schema", "input": {"n": 1}},
                {"workflow": "typed-schema", "input": {"n": "one"}}]}), "body.requests.1.input.n")
            assert [e["field"] for e in batch["errors"]] == ["body.requests.1.input.n"]
            refused(http.post("/api/v1/executions", json={"workflow": "typed-order", "version": 2,
                                                          "input": {"customer": "a", "quantity": 1}}),
                    "body.version")
            began = time.monotonic()
            while (body := http.get(f"/api/v1/executions/{eid}").json())["status"] == "running":
                assert time.monotonic() - began < 60, body
                time.sleep(0.1)
        assert body["status"] == "succeeded", body
        assert body["output"]["confirmed"]["model"] == "Order"
        listed = http.get("/api/v1/executions").json()["items"]
        assert [e["id"] for e in listed] == [eid]  # the refused starts wrote nothing


@pytest.mark.slow
def test_konduit_dashboard_serves_the_api_without_app(make_app: Callable[..., konduit.App],
                                                      db_url: str, tmp_path: Path) -> None:
    app = make_app(*typed_app.WORKFLOWS)
    with running_worker(app):
        until(lambda: len(registered(db_url)) == 3, what="the worker's registration")
        served = subprocess.Popen(
            [sys.executable, "-I", "-m", "konduit.cli", "dashboard", "--port", "0",
             "--database-url", db_url], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        try:
            assert served.stderr is not None
            line = served.stderr.readline()
            assert "no --app" in line, line
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert found, line
            with httpx.Client(base_url=f"http://127.0.0.1:{found.group(1)}", timeout=30) as http:
                began = time.monotonic()
                while True:  # the address is announced before the server listens on it
                    try:
                        answer = http.post("/api/v1/executions", json={
                            "workflow": "typed-schema", "input": {"n": 3}})
                        break
                    except httpx.ConnectError:
                        assert served.poll() is None and time.monotonic() - began < 30
                        time.sleep(0.1)
                assert answer.status_code == 201, answer.text
                assert app.wait(answer.json()["id"], timeout=60).output == {
                    "type": "dict", "input": {"n": 3}}
                assert http.get("/").status_code == 200  # the pages too
        finally:
            served.terminate()
            served.wait(timeout=30)


def test_repair_by_name_from_the_registered_definition(make_app: Callable[..., konduit.App],
                                                       db_url: str) -> None:
    """A repair needs no code either: the re-run steps are planned and started from the stored
    definition, and the worker that has the code runs them."""
    from tests.apps import api_app

    api_app.HEALED.clear()
    app = make_app(*api_app.WORKFLOWS)
    with running_worker(app, poll_interval=0.05), konduit.Client(db_url) as client:
        until(lambda: "api-flow@1" in registered(db_url), what="the worker's registration")
        handle = client.start("api-flow", {"fail": True})
        first = handle.wait(timeout=60)
        assert first.outcomes["flaky"] == "failed" and first.output == ["fine"]
        api_app.HEALED.set()
        try:
            assert sorted(client.repair(handle.id)) == ["end", "flaky"]
            until(lambda: client.status(handle.id).output == ["fine", "flaky"], timeout=60,
                  what="the repaired output")
        finally:
            api_app.HEALED.clear()


def test_a_repair_that_may_expand_a_map_needs_the_code(make_app: Callable[..., konduit.App],
                                                        db_url: str) -> None:
    """Expanding a map runs its ``over=`` code where the repair runs: without the code the
    repair is refused, and the execution is left as it was."""
    app = make_app(typed_app.fan)
    with running_worker(app):
        done = app.start("typed-map").wait(timeout=60)
    with konduit.Client(db_url) as client, \
            pytest.raises(konduit.KonduitError, match=r"needs its code: its map step\(s\) double"):
        client.repair(done.id)
    assert app.status(done.id).status == "succeeded"


def test_a_changed_input_schema_reaches_a_running_client(make_app: Callable[..., konduit.App],
                                                        db_url: str) -> None:
    """The input schema is policy: re-registering the same version with another one changes
    what every start checks from then on, a long-lived code-less client's included."""
    make_app(*typed_app.WORKFLOWS).start("typed-schema", {"n": 1})  # registers the strict one
    with konduit.Client(db_url) as client:
        with pytest.raises(konduit.InputValidationError, match="n: -1 is less than the minimum"):
            client.start("typed-schema", {"n": -1})
        looser = konduit.Workflow("typed-schema", version=1, input={"type": "object"})
        looser.step(name="echo")(typed_app.echo)
        make_app(looser).start("typed-schema", {"n": -2})  # the same DAG: same version
        assert client.start("typed-schema", {"n": -1}).status().status in ("pending", "running")
        unchecked = konduit.Workflow("typed-schema", version=1)
        unchecked.step(name="echo")(typed_app.echo)
        make_app(unchecked).start("typed-schema", "anything")
        client.start("typed-schema", [1, 2])
    assert count_executions(db_url) == 5


@pytest.mark.slow
def test_konduit_start_without_app(make_app: Callable[..., konduit.App], db_url: str,
                                   tmp_path: Path) -> None:
    """``konduit start NAME`` needs no --app either; a bad --input is one line naming fields."""
    make_app(*typed_app.WORKFLOWS).start("typed-schema", {"n": 0})  # registers them

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-I", "-m", "konduit.cli", "start", *args,
                               "--database-url", db_url], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)

    bad = cli("typed-schema", "--input", '{"n": "x", "extra": 1}')
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "n: 'x' is not of type 'integer'" in bad.stderr and "extra: unexpected field" in bad.stderr
    good = cli("typed-schema", "--input", '{"n": 5}')
    assert good.returncode == 0, good.stderr
    started = good.stdout.strip()
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT input FROM konduit_executions WHERE id = %s",
                           (started,)).fetchone()
    assert row is not None and row[0] == {"n": 5}
    assert count_executions(db_url) == 2
