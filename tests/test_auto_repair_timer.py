"""Automatic repairs at their due time (issue 16): the repair is armed like a timer when the
execution finishes degraded, so any ``repair_within`` longer than ``repair_delay`` is honoured.

Before, a worker looked for due repairs every 30 s from its start: ``repair_within="20s"`` (due
10-20 s after the finish) was never repaired. Here the worker's full maintenance pass comes only
every 60 s, so only the armed timer can repair in time: the one with a 3 s delay is repaired 3 s
after its finish, and ``repair_within="20s"`` with its default delay (half the window, 10 s) at
10 s, inside its window, well before a pass.

On the virtual clock (docs/testing.md): the test holds it while the executions finish degraded,
then lets it skip to each due repair, so the 10 s of waiting take no real time; the worker's
maintenance loop wakes for the armed repairs exactly as on the real clock (the skip moves the
clock 3 s, then 7 s: never as far as the 60 s pass).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest

import konduit
import konduit.testing
from tests.support.workers import running_worker
from tests.test_auto_repair import HEALED, contract_workflow

pytestmark = [pytest.mark.storage]


def finished_at(db_url: str, eid: object) -> datetime:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT finished_at FROM konduit_executions WHERE id = %s",
                           (eid,)).fetchone()
    assert row is not None and row[0] is not None
    return row[0]


def test_a_20s_repair_window_is_honoured_at_the_due_time(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    short = contract_workflow("short-delay", within="20s", delay="3s")
    default = contract_workflow("twenty-seconds", within="20s", delay=None)
    assert default.spec.repair is not None and default.spec.repair.delay == 10.0
    app = make_app(short, default)
    HEALED.clear()
    try:
        with konduit.testing.virtual_clock(app) as clock, \
                running_worker(app, poll_interval=0.05, maintenance_interval=60):
            with clock.paused():
                handles = {wf.name: app.start(wf.name, 1) for wf in (short, default)}
                for handle in handles.values():
                    assert handle.wait(timeout=15).outcomes["cover_image"] == "degraded"
                first_finish = {name: finished_at(db_url, h.id) for name, h in handles.items()}
                HEALED.set()  # the service is back: the repairs produce the real output
            began = time.monotonic()
            while not all(len(app.outputs(h.id)) == 2 for h in handles.values()):
                assert time.monotonic() - began < 25, "not repaired in its window"
                time.sleep(0.1)
            results = {name: app.status(h.id) for name, h in handles.items()}
    finally:
        HEALED.set()
    with psycopg.connect(db_url) as conn:
        taken = dict(conn.execute(
            "SELECT workflow_name, auto_repair_at FROM konduit_executions"
            " WHERE id = ANY(%s)", ([h.id for h in handles.values()],)).fetchall())
    after = {name: (taken[name] - first_finish[name]).total_seconds() for name in handles}
    print(f"repaired after {after}")
    assert 3.0 <= after["short-delay"] < 3.5, after
    assert 10.0 <= after["twenty-seconds"] < 10.5, after  # due 10-20 s after: on time
    assert clock.offset < 60  # the skips went to the repairs, never to the 60 s pass
    for name, result in results.items():
        assert result.output == "real.png", name
        assert [v.degraded for v in app.outputs(handles[name].id)] == [["cover_image"], []]
