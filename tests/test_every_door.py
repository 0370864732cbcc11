"""One operation means the same through every door: a per-customer limit started from the App,
``start_many``, ``konduit.Client``, ``konduit.AsyncClient``, ``konduit start`` without
``--app``, the HTTP API served without the code, and an event trigger.

Before start-time keys were registered as data (migration 0030), every door without the
workflow's code left the key NULL: a ``Limit(1, key=...)`` per customer became one limit for
all customers, and 3 customers x 2 tasks of 1 s took 6-10 s instead of about 2 s, with no
warning. Now a key declared as a path (``key="input.customer"``) is computed by every door,
and a key that is a function is refused by a door without the code (:class:`KeyNeedsCode`,
naming the step and the fix), never left out.

The worker is a real process (``tests.apps.doors_app``); each door's executions are started
at once with customers of their own, and the handler records when each ran.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from tests.apps import doors_app
from tests.support.waiting import until
from tests.support.workers import spawn_worker, stop_workers, worker_environment
from tests.test_api_v1 import api
from tests.test_limit_keys import _most_at_once

pytestmark = [pytest.mark.storage]

CUSTOMERS = ("a", "b", "c")
PER_CUSTOMER = 2


def _inputs(door: str, db_url: str) -> list[dict[str, Any]]:
    return [{"customer": f"{door}-{c}", "door": door, "dsn": db_url}
            for c in CUSTOMERS for _ in range(PER_CUSTOMER)]


@pytest.mark.slow
def test_a_per_customer_limit_means_the_same_through_every_door(
        db_url: str, make_app: Callable[..., konduit.App], tmp_path: Path) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE door_spans (customer text, door text, began float8, "
                     "ended float8)")
    worker = spawn_worker("tests.apps.doors_app:app", db_url, concurrency=32)
    try:
        with konduit.Client(db_url) as client:  # the worker registers the definitions
            until(lambda: {"orders", "orders-by-function"}
                  <= {w.name for w in client.workflows()}, 60, "the worker's registration")
        app = make_app(doors_app.orders, doors_app.by_function)
        doors: dict[str, Callable[[list[dict[str, Any]]], None]] = {}

        doors["app.start"] = lambda inputs: [app.start("orders", i) for i in inputs] and None
        doors["app.start_many"] = lambda inputs: app.start_many(
            [{"workflow": "orders", "input": i} for i in inputs]) and None

        def by_client(inputs: list[dict[str, Any]]) -> None:
            with konduit.Client(db_url) as client:
                for i in inputs:
                    client.start("orders", i)
        doors["client.start"] = by_client

        def by_client_many(inputs: list[dict[str, Any]]) -> None:
            with konduit.Client(db_url) as client:
                client.start_many([konduit.StartRequest("orders", i) for i in inputs])
        doors["client.start_many"] = by_client_many

        def by_async_client(inputs: list[dict[str, Any]]) -> None:
            async def go() -> None:
                async with konduit.AsyncClient(db_url) as client:
                    await asyncio.gather(*(client.start("orders", i) for i in inputs))
            asyncio.run(go())
        doors["async_client.start"] = by_async_client

        def by_cli(inputs: list[dict[str, Any]]) -> None:
            import json
            procs = [subprocess.Popen(
                [sys.executable, "-m", "konduit.cli", "start", "orders", "--input",
                 json.dumps(i), "--database-url", db_url], cwd=tmp_path,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=worker_environment()) for i in inputs]
            for p in procs:
                _, err = p.communicate(timeout=120)
                assert p.returncode == 0, err
        doors["cli"] = by_cli

        def by_http(inputs: list[dict[str, Any]]) -> None:
            with api(None, db_url) as http:
                for i in inputs:
                    response = http.post("/api/v1/executions",
                                         json={"workflow": "orders", "input": i})
                    assert response.status_code == 201, response.text
        doors["http"] = by_http

        def by_event(inputs: list[dict[str, Any]]) -> None:
            with konduit.Client(db_url) as client:  # code-less: a worker applies the trigger
                for n, i in enumerate(inputs):
                    assert client.send_event("order-placed", key=f"{i['customer']}-{n}",
                                             payload=i) == "started"
        doors["event"] = by_event

        for door, start in doors.items():
            start(_inputs(door, db_url))

        def spans() -> list[tuple[str, str, float, float]]:
            with psycopg.connect(db_url) as conn:
                return conn.execute("SELECT customer, door, began, ended FROM door_spans"
                                    ).fetchall()
        expected = len(doors) * len(CUSTOMERS) * PER_CUSTOMER
        done = until(lambda: (lambda s: s if len(s) == expected else None)(spans()), 180,
                     f"{expected} reservations")

        def scheduled_keys() -> set[str | None]:  # the worker's schedule door
            with psycopg.connect(db_url) as conn:
                return {k for (k,) in conn.execute(
                    "SELECT limit_key FROM konduit_tasks WHERE workflow = 'nightly-orders@1'")}
        assert until(scheduled_keys, 60, "a scheduled start") == {"nightly"}
    finally:
        stop_workers([worker])
    with psycopg.connect(db_url) as conn:
        keys = conn.execute("SELECT DISTINCT limit_key FROM konduit_tasks "
                            "WHERE workflow = 'orders@1'").fetchall()
    assert None not in {k for (k,) in keys}  # every door computed the key
    report = {}
    for door in doors:
        mine = [(c, b, e) for c, d, b, e in done if d == door]
        by_customer: dict[str, list[tuple[float, float]]] = {}
        for c, b, e in mine:
            by_customer.setdefault(c, []).append((b, e))
        assert sorted(by_customer) == [f"{door}-{c}" for c in CUSTOMERS], door
        # Never two of a customer at once: the limit holds through this door...
        assert max(_most_at_once(s) for s in by_customer.values()) == 1, (door, by_customer)
        # ... and customers ran side by side: the key is the customer's, not one for all
        # (keyless, this door's six reservations ran one after another).
        assert _most_at_once([(b, e) for _, b, e in mine]) >= 2, (door, mine)
        report[door] = round(max(e for _, _, e in mine) - min(b for _, b, _ in mine), 2)
    print("seconds from each door's first reservation to its last:", report)


def test_a_key_that_is_code_is_refused_by_a_door_without_the_code(
        db_url: str, make_app: Callable[..., konduit.App], tmp_path: Path) -> None:
    """A door without the code cannot compute a key function: it refuses the start naming the
    workflow, the step and the fix, and writes nothing; the App (which has the code) starts it."""
    app = make_app(doors_app.orders, doors_app.by_function)
    app.start("orders-by-function", {"customer": "warm"})  # registers them
    first = app.start("orders", {"customer": "warm", "door": "-", "dsn": ""}).id
    fix = r"step 'reserve' of workflow 'orders-by-function'.*customer_of.*key='input\.customer'"
    with konduit.Client(db_url) as client:
        with pytest.raises(konduit.KeyNeedsCode, match=fix) as refused:
            client.start("orders-by-function", {"customer": "x"})
        assert (refused.value.workflow, refused.value.step) == ("orders-by-function", "reserve")
        assert refused.value.function is not None and "customer_of" in refused.value.function
        with pytest.raises(konduit.KeyNeedsCode, match=r"start request 1: "):
            client.start_many([{"workflow": "orders", "input": {"customer": "x", "door": "-",
                                                                 "dsn": ""}},
                               {"workflow": "orders-by-function", "input": {"customer": "x"}}])
        # Nothing of either request was written (a batch is all or none).
        assert [r.id for r in client.list(workflow="orders")] == [first]

    async def by_async() -> None:
        async with konduit.AsyncClient(db_url) as client:
            with pytest.raises(konduit.KeyNeedsCode, match=fix):
                await client.start("orders-by-function", {"customer": "x"})
    asyncio.run(by_async())
    cli = subprocess.run([sys.executable, "-m", "konduit.cli", "start", "orders-by-function",
                          "--input", '{"customer": "x"}', "--database-url", db_url],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=worker_environment(), stdin=subprocess.DEVNULL)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
    assert "customer_of" in cli.stderr and "key='input.customer'" in cli.stderr, cli.stderr
    with api(None, db_url) as http:
        response = http.post("/api/v1/executions", json={"workflow": "orders-by-function",
                                                         "input": {"customer": "x"}})
        assert response.status_code == 422, response.text
        body = response.json()
        # No field of the request is at fault: the server lacks the workflow's code.
        assert "customer_of" in body["detail"] and "field" not in body, body
        assert body["code"] == "key_needs_code"
        batch = http.post("/api/v1/executions:batch", json={"requests": [
            {"workflow": "orders-by-function", "input": {"customer": "x"}}]})
        assert batch.status_code == 422 and batch.json()["code"] == "key_needs_code", batch.text
    assert len(app.list(workflow="orders-by-function")) == 1  # only the App's start
    # The workflow's own keys too: max_running's key function, from a door without the code.
    app2 = konduit.Workflow("runs-by-function", version=1, max_running=1, key=lambda i: i["c"])
    app2.step(name="only")(lambda ctx: 1)
    make_app(app2).start("runs-by-function", {"c": "warm"})
    with konduit.Client(db_url) as client, \
            pytest.raises(konduit.KeyNeedsCode, match=r"max_running key .*Workflow\(max_running"):
        client.start("runs-by-function", {"c": "x"})


def test_key_paths_read_the_input_as_stored_from_every_door(
        db_url: str, make_app: Callable[..., konduit.App]) -> None:
    """A path finds text or a whole number; a missing field or another kind of value refuses the
    start naming the path, the same from the App and from a Client."""
    wf = konduit.Workflow("paths", version=1, max_running=3, key="input.account.region",
                          fair_by="input.customer")
    wf.step(name="s", concurrency=konduit.Limit(2, key="input.items.0"))(lambda ctx: 1)
    app = make_app(wf)
    good = {"customer": 7, "account": {"region": "eu"}, "items": ["sku-1"]}
    by_app = app.start("paths", good).id
    with konduit.Client(db_url) as client:
        by_client = client.start("paths", good).id
        for bad, what in [({**good, "items": []}, r"'input\.items\.0' finds nothing"),
                          ({**good, "account": {"region": {"x": 1}}},
                           r"'input\.account\.region' finds dict"),
                          ({**good, "customer": True}, r"fair_by .*finds bool")]:
            for door in (app, client):
                with pytest.raises(konduit.KonduitError, match=what):
                    door.start("paths", bad)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT e.id, e.fair_key, e.run_key, t.limit_key "
                            "FROM konduit_executions e JOIN konduit_tasks t "
                            "ON t.execution_id = e.id ORDER BY e.id").fetchall()
    assert {r[0]: r[1:] for r in rows} == {by_app: ("7", "eu", "sku-1"),
                                           by_client: ("7", "eu", "sku-1")}
