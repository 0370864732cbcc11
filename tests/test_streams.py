"""Durable streams (docs/streams.md) on a real database with an in-process worker: order and
dense offsets under concurrent writers, the lease fence of a write (a stale attempt cannot
append, even while its reclaim is being committed), the bounds, live following, and pruning
with the execution."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import konduit
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]


def test_sync_and_async_handlers_write_in_order_and_readers_get_each_record_once(make_app):
    wf = konduit.Workflow("stream-basic", version=1)

    @wf.step()
    def first(ctx):
        return [ctx.stream.write({"i": i}) for i in range(5)]

    @wf.step(after=[first])
    async def second(ctx):
        for i in range(3):
            ctx.stream.write(f"x{i}")  # not awaited: stored anyway, in order
        return await ctx.stream.write("last")

    @wf.map(after=[first], over=lambda offsets: offsets[:2])
    def item(ctx):
        ctx.stream.write(ctx.item)
        return ctx.streams("extra").write("named") if ctx.map_index == 0 else 0

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("stream-basic")
        result = handle.wait(timeout=60)
    assert result.output == {"second": 3, "item": [0, 0]}
    assert [(c.offset, c.data) for c in app.stream(handle.id, "first", follow=False)] == [
        (i, {"i": i}) for i in range(5)]
    # Following a stream whose task ended stops at its end.
    assert [c.data for c in app.stream(handle.id, "second")] == ["x0", "x1", "x2", "last"]
    assert [c.data for c in app.stream(handle.id, "item[1]")] == [1]
    assert [c.data for c in app.stream(handle.id, "second", from_offset=2)] == ["x2", "last"]
    records = {s.name: (s.step, s.map_index, s.chunks, s.next_offset, s.restarts)
               for s in app.streams(handle.id)}
    assert records == {"first": ("first", 0, 5, 5, 0), "second": ("second", 0, 4, 4, 0),
                       "item[0]": ("item", 0, 1, 1, 0), "item[1]": ("item", 1, 1, 1, 0),
                       "extra": ("item", 0, 1, 1, 0)}
    # Several streams and no name: the reader is told to choose.
    with pytest.raises(konduit.StreamNotFound) as found:
        list(app.stream(handle.id))
    assert "first" in found.value.names
    with pytest.raises(konduit.KonduitError, match="from_offset"):
        list(app.stream(handle.id, "first", from_offset=-1))


def test_the_writes_of_an_attempt_that_raised_are_kept_before_the_restart(make_app):
    wf = konduit.Workflow("stream-raised", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="0.1s"))
    async def flaky(ctx):
        for i in range(3):
            ctx.stream.write(i)  # not awaited
        if ctx.attempt == 1:
            raise ValueError("the first attempt fails after writing")
        return "ok"

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("stream-raised")
        assert handle.wait(timeout=60).output == "ok"
    assert [(c.kind, c.attempt, c.data) for c in app.stream(handle.id)] == [
        ("data", 1, 0), ("data", 1, 1), ("data", 1, 2), ("restart", 2, None),
        ("data", 2, 0), ("data", 2, 1), ("data", 2, 2)]


def test_a_name_has_one_writer_task(make_app):
    """Map item 1 writes after item 0 took the name "shared": refused, naming the owner."""
    wf = konduit.Workflow("stream-owner", version=1)
    order = threading.Event()

    @wf.step()
    def root(ctx):
        return [0, 1]

    @wf.map(after=[root], over=lambda items: items)
    def item(ctx):
        if ctx.item == 1:
            order.wait(30)
        try:
            ctx.streams("shared").write(ctx.item)
        except konduit.StreamError as exc:
            return str(exc)
        finally:
            order.set()
        return "written"

    app = make_app(wf)
    with running_worker(app):
        result = app.start("stream-owner").wait(timeout=60)
    assert result.output[0] == "written"
    assert "belongs to step 'item' (map index 0)" in result.output[1]


def test_concurrent_writers_get_dense_offsets_each_chunk_once(make_app):
    """Eight threads of one handler write 40 chunks each at once: offsets 0..319, no gap, no
    double, each thread's chunks in its order."""
    wf = konduit.Workflow("stream-threads", version=1)
    threads, per = 8, 40

    @wf.step()
    def many(ctx):
        barrier = threading.Barrier(threads)
        offsets: list[list[int]] = [[] for _ in range(threads)]

        def write(n: int) -> None:
            barrier.wait()
            for j in range(per):
                offsets[n].append(ctx.stream.write([n, j]))

        workers = [threading.Thread(target=write, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return offsets

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("stream-threads")
        offsets = handle.wait(timeout=120).output
    chunks = list(app.stream(handle.id, follow=False))
    assert [c.offset for c in chunks] == list(range(threads * per))
    assert sorted(tuple(c.data) for c in chunks) == [(n, j) for n in range(threads)
                                                      for j in range(per)]
    for n in range(threads):
        mine = [c for c in chunks if c.data[0] == n]
        assert [c.data[1] for c in mine] == list(range(per))
        assert [c.offset for c in mine] == offsets[n]  # what write() returned


def test_a_stale_attempt_cannot_append_even_while_its_reclaim_commits(make_app, db_url):
    """The first attempt writes one chunk; then its task is reclaimed by a transaction the test
    holds open. The attempt's next write waits on that transaction (the write share-locks the
    task row in its own statement) and, once it commits, finds the lease gone: nothing is
    appended. A write that checked the lease in its snapshot, or in an earlier statement,
    would append. The next attempt's write follows a restart record."""
    wf = konduit.Workflow("stream-fence", version=1)
    wrote_first = threading.Event()
    go = threading.Event()
    refused: list[BaseException] = []

    @wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="0.1s"))
    def w(ctx):
        if ctx.attempt == 1:
            ctx.stream.write("one")
            wrote_first.set()
            assert go.wait(60)
            try:
                ctx.stream.write("two")
            except konduit.StreamError as exc:
                refused.append(exc)
            return "stale"
        ctx.stream.write("again")
        return "fresh"

    app = make_app(wf)
    # Heartbeats far apart: the attempt's write, not a heartbeat, meets the lost lease.
    with running_worker(app, heartbeat_interval=5, lease_seconds=60):
        handle = app.start("stream-fence")
        assert wrote_first.wait(60)
        with psycopg.connect(db_url) as reclaim:  # one transaction, committed below
            reclaim.execute("UPDATE konduit_tasks SET status = 'ready', run_at = now(), "
                            "lease_token = NULL, lease_expires_at = NULL, worker_id = NULL "
                            "WHERE execution_id = %s AND step = 'w'", (handle.id,))
            go.set()
            until(lambda: rows(db_url, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type "
                               "= 'Lock' AND query LIKE '%%konduit_stream_chunks%%'"),
                  60, "the stale attempt's write waiting on the reclaim")
            reclaim.commit()
        until(lambda: refused, 60, "the stale write's answer")
        assert handle.wait(timeout=60).output == "fresh"
    assert isinstance(refused[0], konduit.StreamLeaseLost), refused
    assert refused[0].step == "w" and refused[0].attempt == 1
    chunks = list(app.stream(handle.id, "w"))
    assert [(c.offset, c.kind, c.attempt, c.data) for c in chunks] == [
        (0, "data", 1, "one"), (1, "restart", 2, None), (2, "data", 2, "again")]
    assert chunks[1].previous_attempt == 1


def test_the_bounds_refuse_a_write_naming_the_step(make_app, monkeypatch):
    wf = konduit.Workflow("stream-bounds", version=1)

    @wf.step(required=False)
    async def unawaited(ctx):
        for i in range(5):
            ctx.stream.write(i)  # never awaited: the refused ones fail the attempt at its end
        return "returned"

    @wf.step(required=False)
    def sized(ctx):
        ctx.stream.write("x" * 10)  # 12 bytes of JSON
        try:
            ctx.stream.write("y" * 10)
        except konduit.StreamFull as exc:
            return {"limit": exc.limit, "maximum": exc.maximum, "step": exc.step,
                    "stream": exc.stream, "message": str(exc)}

    # Last, so that its failure (which fails the execution) cancels neither of the others.
    @wf.step(after=[unawaited, sized], join=konduit.Join.all_done())
    def chunks(ctx):
        for i in range(5):
            ctx.stream.write(i)  # the fourth is refused: the attempt fails for good

    app = make_app(wf)
    monkeypatch.setenv("KONDUIT_STREAM_MAX_CHUNKS", "3")
    monkeypatch.setenv("KONDUIT_STREAM_MAX_BYTES", "20")
    with running_worker(app):
        handle = app.start("stream-bounds")
        with pytest.raises(konduit.ExecutionFailed):
            handle.wait(timeout=60)
    tasks = {t.step: t for t in app.tasks(handle.id)}
    assert tasks["chunks"].status == "failed"
    assert tasks["chunks"].attempt == 1  # a full stream is not retried
    assert "StreamFull" in tasks["chunks"].error
    assert "stream 'chunks' of step 'chunks' is full: 3 chunks" in tasks["chunks"].error
    assert [c.data for c in app.stream(handle.id, "chunks")] == [0, 1, 2]
    assert tasks["unawaited"].status == "failed" and "StreamFull" in tasks["unawaited"].error
    assert [c.data for c in app.stream(handle.id, "unawaited")] == [0, 1, 2]
    sized = next(p for p in app.payloads(handle.id) if p.step == "sized").payload
    assert sized["limit"] == "bytes" and sized["maximum"] == 20 and sized["step"] == "sized"
    assert "KONDUIT_STREAM_MAX_BYTES" in sized["message"]
    assert [c.data for c in app.stream(handle.id, "sized")] == ["x" * 10]


def test_a_reader_follows_live_and_ends_with_the_stream(make_app):
    wf = konduit.Workflow("stream-live", version=1)
    release = threading.Event()

    @wf.step()
    async def talk(ctx):
        await ctx.stream.write("hello")
        while not release.is_set():
            import asyncio
            await asyncio.sleep(0.02)
        await ctx.stream.write("bye")
        return "done"

    app = make_app(wf)
    got: list[Any] = []
    first = threading.Event()
    with running_worker(app):
        handle = app.start("stream-live")

        def read() -> None:
            for chunk in app.stream(handle.id):  # no name: the only stream, once it exists
                got.append(chunk.data)
                first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(60)
        assert app.status(handle.id).status == "running"  # live: before the task ended
        assert got == ["hello"]
        release.set()
        reader.join(60)
        assert not reader.is_alive()
    assert got == ["hello", "bye"]


def test_streams_are_pruned_with_their_execution(make_app, db_url):
    wf = konduit.Workflow("stream-prune", version=1)

    @wf.step()
    def one(ctx):
        ctx.stream.write("kept until pruned")

    app = make_app(wf)
    with running_worker(app):
        handle = app.start("stream-prune")
        handle.wait(timeout=60)
    assert value(db_url, "SELECT count(*) FROM konduit_stream_chunks WHERE execution_id = %s",
                 handle.id) == 1
    assert app.prune(older_than=0) == 1
    assert value(db_url, "SELECT count(*) FROM konduit_streams WHERE execution_id = %s",
                 handle.id) == 0
    assert value(db_url, "SELECT count(*) FROM konduit_stream_chunks WHERE execution_id = %s",
                 handle.id) == 0


def test_a_handler_in_a_child_process_is_told_streams_are_not_there(make_app):
    wf = konduit.Workflow("stream-isolated", version=1)

    @wf.step()
    def isolated(ctx):
        try:
            ctx.stream.write("x")
        except konduit.StreamError as exc:
            return str(exc)

    app = make_app(wf)
    with running_worker(app, isolation="process"):
        output = app.start("stream-isolated").wait(timeout=60).output
    assert "step 'isolated'" in output and "--isolation process" in output
