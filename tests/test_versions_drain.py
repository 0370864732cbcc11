"""A version kept on purpose until its executions drain: a worker *process* that registers v1
and v2 runs v1's waiting execution to its end while new starts take v2; ``konduit versions``
and ``GET /api/v1/workflows`` show who serves what (docs/changing-workflows.md)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

import konduit
from konduit.web import create_app, database_client
from tests.apps import versions_app
from tests.support.browser import serving
from tests.support.waiting import until
from tests.support.workers import spawn_worker, stop_workers
from tests.test_cli import konduit_cli

pytestmark = [pytest.mark.storage, pytest.mark.slow]  # a worker process: about 25 s


def test_a_v1_execution_drains_on_a_worker_process_serving_v1_and_v2(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    old = make_app(versions_app._version(1))  # the deployment before: v1 only
    waiting = old.start("drain", 7)
    listed = konduit_cli("versions", "--json", "--database-url", db_url)
    assert listed.returncode == 3, listed.stderr  # an unserved version is listed
    (v1,) = json.loads(listed.stdout)
    assert (v1["name"], v1["version"], v1["running"], v1["workers"], v1["unserved"]) == (
        "drain", 1, 1, [], True)

    new = make_app(versions_app.V1, versions_app.V2)  # the new deployment keeps v1 beside v2
    worker = spawn_worker("tests.apps.versions_app:app", db_url, concurrency=2)
    try:
        until(lambda: all(v.workers for v in new.versions("drain")), timeout=60,
              what="the worker process to serve drain@1 and drain@2")
        fresh = new.start("drain", 8)  # the newest version unless told
        assert new.wait(waiting.id, timeout=60).output == {"value": 7, "version": 1}
        done = new.wait(fresh.id, timeout=60)
        assert (done.version, done.output) == (2, {"value": 8, "version": 2, "announced": 1})
        table = konduit_cli("versions", "drain", "--database-url", db_url)
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()
                if line.split()[:1] == ["drain"]]
        assert [r[:5] for r in rows] == [["drain", "1", "rev", "1", "0"],
                                         ["drain", "2", "rev", "1", "0"]]
        assert all(r[-1] == "yes" for r in rows), table.stdout
        with serving(create_app(database_client(db_url, None), None)) as base, \
                httpx.Client(base_url=base, timeout=30) as http:
            body = http.get("/api/v1/workflows").json()
        by_version = {w["version"]: w for w in body if w["name"] == "drain"}
        assert {v: (w["running"], w["unserved"], len(w["workers"]))
                for v, w in by_version.items()} == {1: (0, False, 1), 2: (0, False, 1)}
        assert by_version[1]["workers"] == by_version[2]["workers"]
        assert [s["name"] for s in by_version[2]["steps"]] == ["fetch", "publish", "announce"]
    finally:
        stop_workers([worker])
    # Stopped: nothing runs, so an unserved version is no alarm.
    assert all(not v.unserved and v.running == 0 for v in new.versions("drain"))
