"""A worker stops when one of its loops is inside a database call that does not end by itself.

A stop cancels the worker's loops. A cancellation that reaches a loop as another error (the
driver closes the connection under the statement and says so) must end the loop, not be logged
as a failed round that the loop then tries again: the worker would wait for that loop forever.
Checked for the leader services (schedules, alerts) and for the chunk taker of big maps, each
held inside a real database call when the stop comes. And a task handed back at shutdown whose
row another transaction holds does not hold the stop either. A chunk that fails is logged
naming its map step, execution and items.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.engine import maps
from konduit.errors import DatabaseUnavailable
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

GRACE = 0.5
STOPPED_WITHIN = 20.0
"""Seconds a stop may take here: the grace, the release's bound (5 s), a cancelled query's
end. A loop that swallowed the stop never ends: ``running_worker`` gives up after the grace
plus 30 s and raises."""

entered = threading.Event()


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    entered.clear()
    yield
    maps.chunk_hook = None


async def held_in_a_statement(db: Database) -> None:
    """A database call that does not end by itself (a real statement, 60 s long); cancelled,
    it fails as the driver fails a statement whose connection was closed under it."""
    entered.set()
    try:
        async with db.connection() as conn:
            await conn.execute("SELECT pg_sleep(60)")
    except asyncio.CancelledError as exc:
        raise DatabaseUnavailable("database unavailable: the connection was closed under "
                                  "the statement") from exc


def hold(monkeypatch: pytest.MonkeyPatch, method: str, query: str) -> None:
    """Every call of ``query`` through ``Database.<method>`` is held in a statement."""
    original = getattr(Database, method)

    async def patched(self: Database, name: str, /, **params: Any) -> Any:
        if name == query:
            await held_in_a_statement(self)
        return await original(self, name, **params)

    monkeypatch.setattr(Database, method, patched)


def stop_time(app: konduit.App, **options: Any) -> float:
    """Run a worker until ``entered`` is set, then stop it: how long the stop took."""
    with running_worker(app, concurrency=2, shutdown_grace=GRACE, **options):
        assert entered.wait(60), "the loop never reached its database call"
        began = time.monotonic()
    return time.monotonic() - began


def ticking() -> konduit.Workflow:
    wf = konduit.Workflow("ticking")

    @wf.step()
    def only(ctx: Any) -> int:
        return 1

    wf.schedule(every="1s", name="every-second")
    return wf


def test_the_schedules_loop_stopped_inside_a_database_call_ends(
        make_app: Callable[..., konduit.App], monkeypatch: pytest.MonkeyPatch) -> None:
    hold(monkeypatch, "all", "schedule_list_by_names")
    took = stop_time(make_app(ticking()), alert_interval=0)
    assert took < STOPPED_WITHIN


def test_the_alerts_loops_stopped_inside_a_database_call_end(
        make_app: Callable[..., konduit.App], monkeypatch: pytest.MonkeyPatch) -> None:
    hold(monkeypatch, "one", "alert_get_clock")  # the first call of both alert loops
    took = stop_time(make_app(ticking()), alert_interval=0.1)
    assert took < STOPPED_WITHIN


def chunky() -> konduit.Workflow:
    wf = konduit.Workflow("chunky-stop")

    @wf.step()
    def seed(ctx: Any) -> int:
        return int(ctx.input)

    @wf.map(after=[seed], over=range, queue="unserved")
    def item(ctx: Any) -> int:
        return 1

    return wf


def test_the_chunk_taker_stopped_inside_a_chunk_transaction_ends(
        make_app: Callable[..., konduit.App], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maps, "MAP_CHUNK_ROWS", 100)
    db_of: list[Database] = []
    original = maps.create_next_chunk

    async def remembering(db: Database) -> int | None:
        db_of[:] = [db]
        return await original(db)

    monkeypatch.setattr("konduit.worker.chunks.create_next_chunk", remembering)

    async def hook(execution_id: UUID, first_index: int) -> None:
        # Inside the chunk's transaction, a second real statement that does not end.
        await held_in_a_statement(db_of[0])

    maps.chunk_hook = hook
    app = make_app(chunky())
    app.start("chunky-stop", input=350)
    took = stop_time(app)
    assert took < STOPPED_WITHIN


def test_a_failing_chunk_is_logged_naming_it_and_made_once_it_passes(
        make_app: Callable[..., konduit.App], db_url: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(maps, "MAP_CHUNK_ROWS", 100)
    failing = [True]

    async def hook(execution_id: UUID, first_index: int) -> None:
        if first_index == 200 and failing[0]:
            entered.set()
            raise RuntimeError("a bug in the chunk path")

    maps.chunk_hook = hook
    app = make_app(chunky())
    caplog.set_level(logging.WARNING, logger="konduit.worker.chunks")
    with running_worker(app, concurrency=2, shutdown_grace=GRACE, maintenance_interval=0.2):
        handle = app.start("chunky-stop", input=350)
        assert entered.wait(60), "the chunk never failed"
        until(lambda: any("a bug in the chunk path" in (r.exc_text or "")
                          for r in caplog.records), 30, "the failure to be logged")
        failing[0] = False
        until(lambda: _items(db_url, handle.id) == 350, 60, "every item once it passes")
        began = time.monotonic()
    assert time.monotonic() - began < STOPPED_WITHIN
    (logged, *_) = [r for r in caplog.records if "a bug in the chunk path" in (r.exc_text or "")]
    message = logged.getMessage()
    assert f"map step 'item' of execution {handle.id}, items 200 to 299" in message
    assert "tried again" in message


def _items(db_url: str, execution_id: UUID) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                           " AND step = 'item'", (execution_id,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_task_whose_row_is_held_does_not_hold_the_stop(
        make_app: Callable[..., konduit.App], db_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Past the grace the running task is handed back; its row is locked by another
    transaction (as a completion round stuck in a database call holds it): the hand-back gives
    up after its bound, the lease expires instead."""
    wf = konduit.Workflow("long-sleeper")

    @wf.step()
    async def sleeper(ctx: Any) -> None:
        entered.set()
        await asyncio.sleep(300)

    app = make_app(wf)
    handle = app.start("long-sleeper")
    caplog.set_level(logging.WARNING, logger="konduit.worker.worker")
    with psycopg.connect(db_url) as locker:
        with running_worker(app, concurrency=1, shutdown_grace=GRACE):
            assert entered.wait(60), "the task never started"
            locker.execute("SELECT 1 FROM konduit_tasks WHERE execution_id = %s FOR UPDATE",
                           (handle.id,))
            began = time.monotonic()
        took = time.monotonic() - began
        locker.rollback()
    assert took < STOPPED_WITHIN
    assert any("could not release task" in r.getMessage() and "another transaction holds it"
               in r.getMessage() for r in caplog.records)
