"""Budgets with a margin (issue 29): a hung branch under ``Deadline.adaptive()`` in an execution
with a window degrades early enough for the execution to finish *inside* the window, on real
worker processes.

Before, the reserve was only the p95 of the steps after the branch: six executions with a 15 s
window finished 14-33 ms after it (43-78 ms on a busier machine), and 8 s windows, shorter than
the adaptive floor (10 s), were missed by 3.5-3.8 s because the cut stopped at the floor. Now the
reserve also covers the fallback, the join's dispatch and the finish at their p99, with a
margin, and the window wins over the floor. And when the window leaves nothing at all, the
window alert says so at once, not at the miss.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest

import konduit
from tests.apps import window_margins_app
from tests.support.db import rows
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

APP = "tests.apps.window_margins_app:app"


@contextmanager
def workers(db_url: str, count: int = 2) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [spawn_worker(APP, db_url, "--alert-interval", "0.2", concurrency=16)
             for _ in range(count)]
    try:
        yield procs
    finally:
        stop_workers(procs)


def history(app: konduit.App, publish: float, runs: int = 3) -> None:
    """Runs without a window, so publish has a span in history and the overheads samples."""
    for eid in app.start_many([{"workflow": window_margins_app.wf.name,
                                "input": {"hang": False, "publish": publish}}
                               for _ in range(runs)]):
        assert app.wait(eid, timeout=120).status == "succeeded"


def test_a_hung_adaptive_branch_leaves_15_s_and_8_s_windows_kept(db_url: str) -> None:
    app = konduit.App([window_margins_app.wf], database_url=db_url)
    try:
        with workers(db_url):
            history(app, publish=0.2)
            now = datetime.now(UTC)
            windows = [now + timedelta(seconds=15)] * 6 + [now + timedelta(seconds=8)] * 6
            ids = [h.id for h in app.start_many([
                {"workflow": window_margins_app.wf.name, "input": {"hang": True, "publish": 0.2},
                 "deadline_at": w} for w in windows])]
            results = [app.wait(eid, timeout=120) for eid in ids]
        found = {r[0]: r[1:] for r in rows(db_url, """
            SELECT e.id, e.deadline_at, e.finished_at, t.deadline_seconds,
                   t.deadline_uncut_seconds, t.deadline_reserve_seconds
            FROM konduit_executions e JOIN konduit_tasks t
              ON t.execution_id = e.id AND t.step = 'cover'
            WHERE e.id = ANY(%s)""", list(ids))}
    finally:
        app.close()
    margins = []
    for eid, result in zip(ids, results, strict=True):
        assert result.status == "succeeded"
        assert result.output["cover"] == "fallback cover"  # the branch did hang: degraded
        window, finished, seconds, uncut, reserve = found[eid]
        margins.append((window - finished).total_seconds())
        # Cut by the window (its own budget was 45 s: thin history), keeping a reserve of at
        # least the margin; the 8 s windows below the adaptive floor (10 s): the window won.
        assert uncut == 45.0 and reserve >= 0.25
        if window == windows[-1]:
            assert seconds < 8.0 < 10.0
    print(f"margins (s) 15 s windows: {sorted(margins[:6])}, 8 s windows: {sorted(margins[6:])}")
    assert all(m > 0 for m in margins), \
        f"executions finished after their window: margins {margins} s"


def test_a_window_that_leaves_no_time_is_alerted_at_once_not_at_the_miss(db_url: str) -> None:
    """publish's history takes 4 s; a 3 s window cannot be kept even if the cover degrades at
    once. The budget is the token one (the fallback runs at once), and the window alert is
    raised before the window passes, naming the branch, rather than after the miss."""
    app = konduit.App([window_margins_app.wf], database_url=db_url)
    try:
        with workers(db_url):
            history(app, publish=4.0)
            window = datetime.now(UTC) + timedelta(seconds=3)
            handle = app.start(window_margins_app.wf.name, {"hang": True, "publish": 4.0},
                               deadline_at=window)
            deadline = time.monotonic() + 60
            # The forecast rule may raise the alert first (publish's 4 s p95 alone misses); the
            # round after the cover's task is made says why, in the same alert.
            while not (seen := [a for a in app.alerts(kind="window_at_risk")
                                if "unkeepable_step" in a.details]):
                assert time.monotonic() < deadline, f"no such window alert: {app.alerts()}"
                time.sleep(0.05)
            seen_at = datetime.now(UTC)
            result = handle.wait(timeout=60)
    finally:
        app.close()
    [alert] = seen
    assert alert.severity == "critical" and "leaves no time" in alert.message, alert.message
    assert alert.details["unkeepable_step"] == "cover"
    assert alert.details["unkeepable_reserve_seconds"] >= 4.0
    assert seen_at < window  # said at once, before the window ...
    assert result.finished_at is not None and result.finished_at > window  # ... it then missed
    assert result.output["cover"] == "fallback cover"
    [(seconds,)] = rows(db_url, "SELECT deadline_seconds FROM konduit_tasks"
                                " WHERE execution_id = %s AND step = 'cover'", handle.id)
    assert seconds == pytest.approx(0.001)  # the fallback at once
