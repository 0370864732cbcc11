"""``konduit workers`` lists the live workers; ``konduit status`` says when no live worker serves
a running execution's workflow version (an execution nobody serves would wait in silence)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import konduit
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

HINT = "no live worker serves"


def konduit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KONDUIT_DATABASE_URL", "KONDUIT_APP")}
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "konduit.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


def cli_json(*args: str) -> Any:
    proc = konduit_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds the workflow's step until the test lets it go (so the execution stays running)."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def held(gate: threading.Event) -> konduit.Workflow:
    wf = konduit.Workflow("publish-content", version=2)

    @wf.step()
    def publish(ctx: konduit.Context) -> str:
        gate.wait(30)
        return "published"

    return wf


@contextmanager
def worker_up(app: konduit.App, **options: Any) -> Iterator[None]:
    with running_worker(app, concurrency=3, **options):
        until(app.workers, what="the worker to register")
        yield


def test_workers_lists_a_live_worker_with_what_it_serves(make_app, db_url: str,
                                                         held: konduit.Workflow) -> None:
    app = make_app(held)
    assert cli_json("workers", "--database-url", db_url) == []
    with worker_up(app, queues=("default", "slow")):
        rows = cli_json("workers", "--database-url", db_url)
        assert len(rows) == 1, rows
        (row,) = rows
        assert row["workflows"] == ["publish-content@2"]
        assert row["pid"] == os.getpid()
        assert sorted(row["queues"]) == ["default", "slow"]
        assert row["concurrency"] == 3 and row["isolation"] == "thread"
        assert row["running"] == 0 and row["abandoned"] == 0
        assert 0 <= row["heartbeat_age"] < 15
        table = konduit_cli("workers", "--database-url", db_url)
        assert table.returncode == 0, table.stderr
        assert "publish-content@2" in table.stdout and str(os.getpid()) in table.stdout
    # A worker that stopped cleanly is not live any more.
    assert cli_json("workers", "--database-url", db_url) == []
    assert "no live workers" in konduit_cli("workers", "--database-url", db_url).stdout


def test_status_hints_when_no_live_worker_serves_a_running_execution(
        make_app, db_url: str, held: konduit.Workflow, gate: threading.Event) -> None:
    app = make_app(held)
    eid = str(app.start("publish-content").id)

    # Nobody serves it: both the text and the JSON say so, naming the workflow version.
    text = konduit_cli("status", eid, "--database-url", db_url)
    assert text.returncode == 0, text.stderr
    assert f"{HINT} publish-content@2" in text.stdout
    assert "konduit worker" in text.stdout
    doc = cli_json("status", eid, "--database-url", db_url)
    assert doc["served_by_live_worker"] is False
    assert doc["hint"].startswith(f"{HINT} publish-content@2")

    # A worker of another version does not serve it either.
    other = konduit.Workflow("publish-content", version=1)
    other.step(name="publish")(lambda ctx: "old")
    with worker_up(make_app(other)):
        assert cli_json("status", eid, "--database-url", db_url)["served_by_live_worker"] is False

    with worker_up(app):
        until(lambda: app.tasks(eid)[0].status == "running", what="the step to start")
        doc = cli_json("status", eid, "--database-url", db_url)
        assert doc["status"] == "running"
        assert doc["served_by_live_worker"] is True and doc["hint"] is None
        text = konduit_cli("status", eid, "--database-url", db_url)
        assert HINT not in text.stdout
        gate.set()
        assert app.wait(eid, timeout=20).status == "succeeded"

    # Finished: no worker needed, no hint, not even a check.
    doc = cli_json("status", eid, "--database-url", db_url)
    assert doc["served_by_live_worker"] is None and doc["hint"] is None
