"""A map's items are created in chunks beside the worker's claims (engine/maps.py, issue 29).

The fan-in that fires a map step runs ``over()``, counts every item and creates the first chunk
of tasks; the others wait as rows of ``konduit_map_chunks`` that any worker's chunk taker turns
into tasks, one transaction per chunk. Checked here with real PostgreSQL: a chunk transaction
that fails (a crash before its commit) neither loses nor doubles an item and the join fires
once; takers that collide never double an item; the worker claims and records other work while
a big fan-out is made (ordering signals, not seconds); a cancel leaves no chunk behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.replica import Reads
from konduit.db.sealing import configured as configured_payloads
from konduit.engine import maps
from konduit.engine.maps import MAP_CHUNK_ROWS, create_next_chunk
from konduit.reads import ReadModel
from konduit.worker.chunks import ChunkTaker
from tests.apps import chunk_crash_app
from tests.support.waiting import until
from tests.support.workers import (
    kill_workers,
    reaped,
    running_worker,
    spawn_worker,
    stop_workers,
)

pytestmark = [pytest.mark.storage]

over_entered = threading.Event()
over_release = threading.Event()
over_gate = [False]  # whether over() waits for over_release


def items_of(n: int) -> Iterator[int]:
    if over_gate[0]:
        over_entered.set()
        assert over_release.wait(120), "over() was never released"
    return iter(range(n))


def chunky(queue: str = "default") -> konduit.Workflow:
    wf = konduit.Workflow("chunky")

    @wf.step()
    def seed(ctx: Any) -> int:
        return int(ctx.input)

    @wf.map(after=[seed], over=items_of, queue=queue, max_items=1_000_000)
    def item(ctx: Any) -> int:
        return 1

    @wf.step(after=[item])
    def join(ctx: Any) -> int:
        return len(ctx.upstream["item"])

    return wf


def small() -> konduit.Workflow:
    wf = konduit.Workflow("small")

    @wf.step()
    def only(ctx: Any) -> int:
        return 1

    return wf


CHUNK = 500
"""Chunks of the in-process tests: MAP_CHUNK_ROWS (5,000) made smaller, so that a map of several
chunks has few enough items to run on a busy machine."""


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(maps, "MAP_CHUNK_ROWS", CHUNK)
    over_entered.clear()
    over_release.clear()
    over_gate[0] = False
    yield
    over_release.set()
    maps.chunk_hook = None


def q(db_url: str, sql: str, *params: Any) -> Any:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def chunk_rows(db_url: str) -> int:
    return int(q(db_url, "SELECT count(*) FROM konduit_map_chunks"))


def item_indexes(db_url: str, execution_id: UUID) -> list[int]:
    with psycopg.connect(db_url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT map_index FROM konduit_tasks WHERE execution_id = %s AND step = 'item'"
            " ORDER BY map_index", (execution_id,)).fetchall()]


def test_a_failed_chunk_transaction_neither_loses_nor_doubles_an_item(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    n = 4 * CHUNK + 123
    failures = {2 * CHUNK: 2, 4 * CHUNK: 1}  # first index -> times to fail
    seen: list[int] = []

    async def hook(execution_id: UUID, first_index: int) -> None:
        seen.append(first_index)
        if failures.get(first_index, 0) > 0:
            failures[first_index] -= 1
            raise RuntimeError(f"crash before the commit of the chunk at {first_index}")

    maps.chunk_hook = hook
    app = make_app(chunky())
    with running_worker(app, concurrency=8, maintenance_interval=0.2):
        handle = app.start("chunky", input=n)
        result = handle.wait(timeout=240)
    assert result.output == n
    assert item_indexes(db_url, handle.id) == list(range(n))
    assert failures == {2 * CHUNK: 0, 4 * CHUNK: 0}, seen
    assert seen.count(2 * CHUNK) == 3 and seen.count(4 * CHUNK) == 2
    assert q(db_url, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
             " AND step = 'join'", handle.id) == 1
    assert q(db_url, "SELECT count(*) FROM konduit_attempts a JOIN konduit_tasks t"
             " ON t.id = a.task_id WHERE t.execution_id = %s AND t.step = 'join'",
             handle.id) == 1
    assert chunk_rows(db_url) == 0


def test_takers_that_collide_never_double_an_item(
        make_app: Callable[..., konduit.App], db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = 12 * CHUNK + 7

    async def no_taker(self: ChunkTaker) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(ChunkTaker, "run", no_taker)  # the chunks wait for the takers below
    app = make_app(chunky(queue="unserved"))
    with running_worker(app, concurrency=4):
        handle = app.start("chunky", input=n)
        until(lambda: chunk_rows(db_url) == 12, 120, "the fan-in to leave 12 chunks")
    assert len(item_indexes(db_url, handle.id)) == CHUNK

    takers = 6
    start = threading.Barrier(takers)
    made: list[list[int]] = [[] for _ in range(takers)]

    async def hook(execution_id: UUID, first_index: int) -> None:
        await asyncio.sleep(0.05)  # hold the chunk a moment: the others must skip it

    maps.chunk_hook = hook

    def take(i: int) -> None:
        async def go() -> None:
            db = Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
            await db.open()
            try:
                start.wait(30)
                while (count := await create_next_chunk(db)) is not None:
                    made[i].append(count)
            finally:
                await db.close()

        asyncio.run(go())

    threads = [threading.Thread(target=take, args=(i,)) for i in range(takers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sum(len(m) for m in made) == 12
    assert sum(sum(m) for m in made) == n - CHUNK
    assert sum(1 for m in made if m) > 1, f"the takers never overlapped: {made}"
    assert item_indexes(db_url, handle.id) == list(range(n))
    assert chunk_rows(db_url) == 0


def test_the_worker_claims_while_a_big_fan_out_is_made(
        make_app: Callable[..., konduit.App], db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maps, "MAP_CHUNK_ROWS", MAP_CHUNK_ROWS)  # the chunks as shipped
    n = 150_000
    chunk_entered = threading.Event()
    chunk_release = threading.Event()

    async def hook(execution_id: UUID, first_index: int) -> None:
        if first_index == 10 * MAP_CHUNK_ROWS:  # holds one chunk transaction open
            chunk_entered.set()
            assert await asyncio.to_thread(chunk_release.wait, 120), "never released"

    maps.chunk_hook = hook
    over_gate[0] = True
    app = make_app(chunky(queue="unserved"), small())
    try:
        with running_worker(app, concurrency=4):
            big = app.start("chunky", input=n)
            # The fan-in round runs over(), which holds until released: the worker records
            # and claims small executions meanwhile.
            assert over_entered.wait(60), "over() never ran"
            during_over = [app.start("small") for _ in range(5)]
            for h in during_over:
                assert h.wait(timeout=60).output == 1
            assert q(db_url, "SELECT tasks_total FROM konduit_steps WHERE execution_id = %s"
                     " AND step = 'item'", big.id) is None, "the fan-in ended before them"
            over_release.set()
            # The chunks are being created; one of them is held open.
            assert chunk_entered.wait(120), "the chunks were never taken"
            during_chunks = [app.start("small") for _ in range(5)]
            for h in during_chunks:
                assert h.wait(timeout=60).output == 1
            made = len(item_indexes(db_url, big.id))
            assert made < n, "the items were all made before them"
            # The execution page's map row reads "creating items: k of N".
            counts = asyncio.run(_map_counts(db_url, big.id))
            assert (counts.tasks, counts.tasks + counts.creating) == (made, n)
            chunk_release.set()
            until(lambda: len(item_indexes(db_url, big.id)) == n, 240,
                  "every item to be created")
            assert item_indexes(db_url, big.id) == list(range(n))
            assert chunk_rows(db_url) == 0
            big.cancel("measured")
    finally:
        over_release.set()
        chunk_release.set()


async def _map_counts(db_url: str, execution_id: UUID) -> Any:
    db = Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
    await db.open()
    try:
        (counts,) = await ReadModel(Reads(db)).map_counts(execution_id, ["item"])
        return counts
    finally:
        await db.close()


def test_a_cancel_during_the_fan_out_leaves_no_chunk(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    n = 30 * CHUNK
    chunk_entered = threading.Event()
    chunk_release = threading.Event()

    async def hook(execution_id: UUID, first_index: int) -> None:
        if first_index == 3 * CHUNK:  # a taker holds this one while the cancel runs
            chunk_entered.set()
            assert await asyncio.to_thread(chunk_release.wait, 120), "never released"

    maps.chunk_hook = hook
    app = make_app(chunky(queue="unserved"))
    try:
        with running_worker(app, concurrency=4):
            big = app.start("chunky", input=n)
            assert chunk_entered.wait(120), "the chunks were never taken"
            assert chunk_rows(db_url) > 0
            canceller = threading.Thread(target=lambda: big.cancel("enough"))
            canceller.start()
            # The cancel waits for the chunk's transaction (it holds the execution, shared):
            # release it, and the rest of the chunks go with the cancel.
            chunk_release.set()
            canceller.join(60)
            until(lambda: chunk_rows(db_url) == 0, 60, "the chunks to be gone")
            assert q(db_url, "SELECT status FROM konduit_executions WHERE id = %s",
                     big.id) == "cancelled"
            made = len(item_indexes(db_url, big.id))
            assert made < n
            assert q(db_url, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                     " AND status = 'ready'", big.id) == 0
            # Nothing more is created later.
            threading.Event().wait(1.0)
            assert len(item_indexes(db_url, big.id)) == made
            assert chunk_rows(db_url) == 0
    finally:
        chunk_release.set()


def test_a_worker_killed_between_chunks_neither_loses_nor_doubles_an_item(db_url: str) -> None:
    n = 10 * MAP_CHUNK_ROWS + 11
    options = ("--lease-seconds", "3", "--heartbeat-interval", "0.5",
               "--maintenance-interval", "0.5")
    with reaped([]) as procs, \
            konduit.App([chunk_crash_app.wf], database_url=db_url) as client:
        procs.append(spawn_worker("tests.apps.chunk_crash_app:app", db_url, *options,
                                  env={"KONDUIT_TEST_CHUNK_PAUSE": "0.4"}))
        handle = client.start("chunk-crash", input=n)
        # Some chunks made, others not: the worker sits inside a chunk's transaction (it
        # pauses there) when it is killed.
        until(lambda: 0 < chunk_rows(db_url) <= 7, 180, "some chunks to be created")
        kill_workers(procs)
        # Nothing lost, nothing doubled at the crash: every item is a task or in a chunk.
        pending = int(q(db_url, "SELECT coalesce(sum(item_count), 0) FROM konduit_map_chunks"))
        assert pending > 0
        assert len(item_indexes(db_url, handle.id)) + pending == n
        # Another worker takes the chunks the dead one left (its poll: no notification).
        procs.append(spawn_worker("tests.apps.chunk_crash_app:app", db_url, *options))
        until(lambda: chunk_rows(db_url) == 0, 180, "the other worker to take the chunks")
        stop_workers(procs[1:])
    assert item_indexes(db_url, handle.id) == list(range(n))
    assert q(db_url, "SELECT tasks_total FROM konduit_steps WHERE execution_id = %s"
             " AND step = 'item'", handle.id) == n


def test_items_made_later_keep_the_deadline_the_window_cut_at_the_fan_in(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    n = 3 * CHUNK + 5

    async def hook(execution_id: UUID, first_index: int) -> None:
        await asyncio.sleep(0.3)  # later chunks are made well after the fan-in

    maps.chunk_hook = hook
    wf = konduit.Workflow("windowed")

    @wf.step()
    def seed(ctx: Any) -> int:
        return int(ctx.input)

    @wf.map(after=[seed], over=range, queue="unserved", deadline="60s")
    def item(ctx: Any) -> int:
        return 1

    app = make_app(wf)
    with running_worker(app, concurrency=4):
        handle = app.start("windowed", input=n,
                           deadline_at=datetime.now(UTC) + timedelta(seconds=30))
        until(lambda: len(item_indexes(db_url, handle.id)) == n, 120, "every item")
    with psycopg.connect(db_url) as conn:
        moments, uncut, created = conn.execute(
            "SELECT count(DISTINCT deadline_at), count(*) FILTER (WHERE deadline_uncut_seconds"
            " IS NOT NULL), count(DISTINCT created_at) FROM konduit_tasks"
            " WHERE execution_id = %s AND step = 'item'", (handle.id,)).fetchone()  # type: ignore[misc]
    assert created > 1, "every chunk was made at the fan-in: nothing checked"
    assert uncut == n, "the window did not cut the items' budget"
    assert moments == 1, "the chunks made later moved the items' deadline"
