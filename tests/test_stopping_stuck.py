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
from konduit.db.database import Database, Tx
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


async def held_in_a_statement(on: Database | Tx) -> None:
    """A database call that does not end by itself (a real statement, 60 s long, on a pooled
    connection or in the transaction ``on``); cancelled, it fails as the driver fails a
    statement whose connection was closed under it."""
    entered.set()
    try:
        if isinstance(on, Tx):
            await on.conn.execute("SELECT pg_sleep(60)")
        else:
            async with on.connection() as conn:
                await conn.execute("SELECT pg_sleep(60)")
    except asyncio.CancelledError as exc:
        raise DatabaseUnavailable("database unavailable: the connection was closed under "
                                  "the statement") from exc


def hold(monkeypatch: pytest.MonkeyPatch, method: str, query: str,
         kind: type[Database | Tx] = Database) -> None:
    """Every call of ``query`` through ``kind.<method>`` is held in a statement."""
    original = getattr(kind, method)

    async def patched(self: Any, name: str, /, **params: Any) -> Any:
        if name == query:
            await held_in_a_statement(self)
        return await original(self, name, **params)

    monkeypatch.setattr(kind, method, patched)


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


HELD = {
    # loop: (class, method, query): the loop's database call held in a statement
    "schedules round": (Database, "all", "schedule_list_by_names"),
    "a schedule's start": (Tx, "one", "schedule_lock_if_active"),
    "alerts": (Database, "one", "alert_get_clock"),  # the first call of both alert loops
    "heartbeat": (Tx, "one", "worker_heartbeat"),
    "leadership": (Database, "one", "leader_take"),
    "a maintenance pass": (Database, "all", "execution_list_timed_out"),
    "maintenance's look at what comes due": (Database, "one", "task_get_next_due"),
}


@pytest.mark.parametrize("loop", list(HELD))
def test_a_loop_stopped_inside_a_database_call_ends(
        make_app: Callable[..., konduit.App], monkeypatch: pytest.MonkeyPatch,
        loop: str) -> None:
    kind, method, query = HELD[loop]
    hold(monkeypatch, method, query, kind)
    took = stop_time(make_app(ticking()), alert_interval=0.1, maintenance_interval=0.2)
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
    running = threading.Event()

    @wf.step()
    async def sleeper(ctx: Any) -> None:
        running.set()
        await asyncio.sleep(300)

    app = make_app(wf)
    handle = app.start("long-sleeper")
    caplog.set_level(logging.WARNING, logger="konduit.worker.worker")
    with psycopg.connect(db_url) as locker:
        with running_worker(app, concurrency=1, shutdown_grace=GRACE):
            assert running.wait(60), "the task never started"
            locker.execute("SELECT 1 FROM konduit_tasks WHERE execution_id = %s FOR UPDATE",
                           (handle.id,))
            began = time.monotonic()
        took = time.monotonic() - began
        locker.rollback()
    assert took < STOPPED_WITHIN
    said = [r.getMessage() for r in caplog.records]
    assert any("could not release task" in m and "another transaction holds it" in m
               for m in said), said


def test_a_cancellation_that_comes_as_a_connection_is_handed_over_is_not_lost(
        db_url: str) -> None:
    """A caller waiting for the pool's only connection is cancelled a few loop turns after the
    connection is handed back, for each number of turns: in some of them the connection
    reached the waiter's side as the cancellation came, and Python 3.11's asyncio.wait_for
    (the pool's wait) returned the connection and dropped the cancellation. The caller ran on
    as if never cancelled: a worker loop caught there never stopped (seen 1 stop in 4 in the
    leadership case above). Every variant must end cancelled, or have got its connection and
    ended before the cancellation was sent."""
    async def main() -> dict[int, str]:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        seen: dict[int, str] = {}
        try:
            for turns in range(12):
                held = await db.pool.getconn()
                sent = [False]

                async def waiter(sent: list[bool] = sent) -> str:
                    async with db.connection():
                        after = sent[0]
                        await asyncio.sleep(0)  # where a cancellation not lost would land
                        return "ran on after its cancellation" if after else "done before it"

                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.05)  # waiting for the pool
                await db.pool.putconn(held)
                for _ in range(turns):
                    await asyncio.sleep(0)
                sent[0] = True
                task.cancel()
                try:
                    seen[turns] = await task
                except asyncio.CancelledError:
                    seen[turns] = "cancelled"
            # The pool's connection came back every time: it serves on.
            async with db.connection() as conn:
                assert await (await conn.execute("SELECT 1 AS one")).fetchone() == {"one": 1}
        finally:
            await db.close()
        return seen

    seen = asyncio.run(main())
    assert "cancelled" in seen.values()
    assert "ran on after its cancellation" not in seen.values(), seen
