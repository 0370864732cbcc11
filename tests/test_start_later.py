"""Start later, start first (issue 18, item 7): ``run_at``/``delay`` make a ``scheduled``
execution that a worker's maintenance pass starts within its interval of its time, that can be
waited for and cancelled before it; ``priority`` is added to each step's priority in the claim
order. Real workers on threads, the real database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import konduit
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

INTERVAL = 0.5
"""The maintenance interval of the workers here: a scheduled start is due within it."""


def two_steps(ran: list[tuple[str, str]] | None = None, name: str = "later") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    lock = threading.Lock()

    @wf.step(priority=2)
    def first(ctx: Any) -> str:
        with lock:
            if ran is not None:
                ran.append((str(ctx.execution_id), "first"))
        return "ok"

    @wf.step(after=[first], priority=1)
    def second(ctx: Any) -> str:
        return "done"

    return wf


def started_at(db_url: str, execution_id: Any) -> datetime:
    """When the execution's first task was first claimed."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT min(started_at) FROM konduit_tasks WHERE execution_id = %s",
                           (execution_id,)).fetchone()
    assert row is not None and row[0] is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_delayed_start_waits_scheduled_then_runs_within_the_maintenance_interval(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(two_steps())
    handle = app.start("later", {"n": 1}, delay="2s", tags={"kind": "later"})
    status = app.status(handle.id)
    assert status.status == "scheduled"
    [found] = app.search(status="scheduled")
    assert found.id == handle.id and found.run_at is not None
    with running_worker(app, maintenance_interval=INTERVAL):
        # Not before its time, however eager the worker: its tasks are not claimable.
        time.sleep(1.0)
        assert app.status(handle.id).status == "scheduled"
        result = handle.wait(timeout=60)
    assert result.status == "succeeded"
    began = started_at(db_url, handle.id)
    assert began >= found.run_at
    # Within the interval (plus the claim, on a loaded machine: generous, but not 10 intervals).
    assert began - found.run_at < timedelta(seconds=INTERVAL + 3)


def test_run_at_in_the_past_starts_at_once(make_app: Callable[..., konduit.App]) -> None:
    app = make_app(two_steps())
    handle = app.start("later", {}, run_at=datetime.now(UTC) - timedelta(minutes=1))
    assert app.status(handle.id).status == "running"
    with running_worker(app, maintenance_interval=60):
        assert handle.wait(timeout=60).status == "succeeded"


def test_a_scheduled_execution_cancelled_before_its_time_never_runs(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    ran: list[tuple[str, str]] = []
    app = make_app(two_steps(ran))
    doomed = app.start("later", {}, run_at=datetime.now(UTC) + timedelta(seconds=1))
    kept = app.start("later", {}, run_at=datetime.now(UTC) + timedelta(seconds=1))
    assert app.cancel(doomed.id) is True
    assert app.cancel(doomed.id) is False
    assert app.status(doomed.id).status == "cancelled"
    with running_worker(app, maintenance_interval=INTERVAL):
        assert kept.wait(timeout=60).status == "succeeded"
        time.sleep(2 * INTERVAL)
    assert app.status(doomed.id).status == "cancelled"
    assert [eid for eid, _ in ran] == [str(kept.id)]
    with psycopg.connect(db_url) as conn:
        statuses = {r[0] for r in conn.execute(
            "SELECT status FROM konduit_tasks WHERE execution_id = %s", (doomed.id,))}
    assert statuses == {"cancelled"}


@pytest.mark.parametrize("kwargs, fault", [
    ({"run_at": datetime(2030, 1, 1)}, "time zone"),
    ({"run_at": "tomorrow"}, "run_at is a datetime"),
    ({"delay": "soon"}, "delay"),
    ({"delay": "1m", "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
    ({"priority": "high"}, "priority is a whole number"),
    ({"priority": 10**9}, "between"),
])
def test_bad_start_times_and_priorities_are_refused(make_app: Callable[..., konduit.App],
                                                    kwargs: dict[str, Any], fault: str) -> None:
    app = make_app(two_steps())
    with pytest.raises(konduit.KonduitError, match=fault):
        app.start("later", {}, **kwargs)
    assert app.search() == []


def test_execution_priority_orders_the_claims_and_adds_to_each_steps(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    ran: list[tuple[str, str]] = []
    app = make_app(two_steps(ran))
    # Started in the opposite of the order they must run in: priority beats age and turns.
    low = app.start("later", {}, priority=5)
    mid = app.start("later", {})
    high = app.start("later", {}, priority=-3)
    with psycopg.connect(db_url) as conn:
        roots = dict(conn.execute(
            "SELECT execution_id, priority FROM konduit_tasks WHERE step = 'first'").fetchall())
    assert roots == {low.id: 7, mid.id: 2, high.id: -1}
    with running_worker(app, concurrency=1, maintenance_interval=60):
        for h in (low, mid, high):
            assert h.wait(timeout=60).status == "succeeded"
    assert [eid for eid, _ in ran] == [str(high.id), str(mid.id), str(low.id)]
    with psycopg.connect(db_url) as conn:
        joins = dict(conn.execute(
            "SELECT execution_id, priority FROM konduit_tasks WHERE step = 'second'").fetchall())
    # A downstream task made when its upstream finished carries its execution's priority too.
    assert joins == {low.id: 6, mid.id: 1, high.id: -2}


def _due_now(db_url: str, count: int) -> None:
    """Make ``count`` scheduled executions due (their time moved into the past)."""
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE konduit_executions SET run_at = now() - interval '1 second' "
                     "WHERE status = 'scheduled'")
        (n,) = conn.execute("SELECT count(*) FROM konduit_executions WHERE status = 'scheduled'"
                            ).fetchone()  # type: ignore[misc]
    assert n == count


def _start_due(db_url: str) -> list[Any]:
    import asyncio

    from konduit.db.database import Database
    from konduit.engine.later import start_due

    async def go() -> list[Any]:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            return await start_due(db)
        finally:
            await db.close()

    return asyncio.run(go())


def test_passes_racing_on_the_same_due_executions_start_each_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(two_steps())
    app.start_many([{"workflow": "later", "delay": "1h"} for _ in range(200)])
    _due_now(db_url, 200)
    racers = 4
    barrier = threading.Barrier(racers)
    started: list[list[Any]] = []

    def race() -> None:
        barrier.wait(30)
        started.append(_start_due(db_url))

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [eid for ids in started for eid in ids]
    assert len(everything) == len(set(everything)) == 200
    assert app.search(status="scheduled") == []


def test_a_cancel_holding_the_row_wins_over_the_start(make_app: Callable[..., konduit.App],
                                                      db_url: str) -> None:
    app = make_app(two_steps())
    handle = app.start("later", {}, delay="1h")
    _due_now(db_url, 1)
    with psycopg.connect(db_url) as conn:
        # The cancel's transaction, as stop_execution runs it: the row locked, then ended.
        conn.execute("SELECT 1 FROM konduit_executions WHERE id = %s FOR NO KEY UPDATE",
                     (handle.id,))
        assert _start_due(db_url) == []  # skipped, not waited for
        conn.execute("UPDATE konduit_executions SET status = 'cancelled', "
                     "finished_at = now() WHERE id = %s", (handle.id,))
    assert _start_due(db_url) == []  # its status is re-checked: nothing to start
    assert app.status(handle.id).status == "cancelled"
