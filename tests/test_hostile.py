"""User code is hostile: whatever a handler or fallback raises (BaseException included) and
however long it blocks, it ends only its own attempt — never the worker, never a slot for good.
Real worker threads on real PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from typing import Any

import psycopg
import pytest

import konduit
from tests.apps import sweep_app
from tests.support.load import scaled
from tests.support.workers import running_worker, spawn_worker

pytestmark = [pytest.mark.storage]


def tasks_of(db_url: str, execution_id: Any) -> dict[str, tuple[str, str | None]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT step, status, error FROM konduit_tasks WHERE execution_id = %s",
                            (execution_id,)).fetchall()
    return {step: (status, error) for step, status, error in rows}


def finished_within(handle: konduit.ExecutionHandle, seconds: float) -> float:
    began = time.monotonic()
    try:
        handle.wait(timeout=seconds)
    except konduit.ExecutionFailed:
        pass
    return time.monotonic() - began


def test_hung_sync_handlers_beyond_the_concurrency_all_degrade_on_time(make_app, db_url):
    """Before: the abandoned thread kept its pool slot, so with concurrency 1 the second hung
    handler waited behind the first for good (the lease stayed alive, nothing rescued it)."""
    hang = threading.Event()
    wf = konduit.Workflow("hung", version=1)

    @wf.step(deadline="1s", fallback=lambda ctx: {"image": "fallback.png"})
    def resize(ctx: konduit.Context) -> dict[str, str]:
        hang.wait(120)  # a blocking client call that never returns and ignores ctx.cancelled
        return {"image": "real.png"}

    quick = konduit.Workflow("quick", version=1)

    @quick.step()
    def ping(ctx: konduit.Context) -> str:
        return "pong"

    app = make_app(wf, quick)
    try:
        with running_worker(app, concurrency=1, heartbeat_interval=0.3):
            handles = [app.start("hung") for _ in range(3)]
            began = time.monotonic()
            results = [h.wait(timeout=20) for h in handles]
            took = time.monotonic() - began
            assert [r.output for r in results] == [{"image": "fallback.png"}] * 3
            assert [r.outcomes for r in results] == [{"resize": "degraded"}] * 3
            # One after the other on one slot, each ended at its own 1 s deadline.
            # 6 s idle, stretched by the measured overload up to 15 s: each waiting out its
            # hung handler (the bug) takes the 20 s wait's timeout.
            assert took < scaled(3 * 1.0 + 3.0, cap=15.0), took
            started = time.monotonic()
            assert app.start("quick").wait(timeout=5).output == "pong"
            # Its slot is free at once (1 s idle, stretched up to 4.5 s by the overload); behind
            # an abandoned hung thread (the bug) it would wait out the 5 s timeout above.
            assert time.monotonic() - started < scaled(1.0, cap=4.5)
            # The worker says how many threads it abandoned.
            def abandoned() -> int:
                with psycopg.connect(db_url) as conn:
                    return conn.execute("SELECT abandoned FROM konduit_workers").fetchone()[0]
            deadline = time.monotonic() + 5
            while abandoned() != 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert abandoned() == 3
    finally:
        hang.set()


def test_past_the_abandoned_limit_the_worker_stops_and_says_why(make_app):
    hang = threading.Event()
    wf = konduit.Workflow("hung-limit", version=1)

    @wf.step(deadline="300ms", retry=konduit.Retry(max_attempts=1))
    def stuck(ctx: konduit.Context) -> None:
        hang.wait(120)

    app = make_app(wf)
    try:
        with pytest.raises(konduit.WorkerUnhealthy, match="ignored their deadline"), \
                running_worker(app, concurrency=2, max_abandoned=1, shutdown_grace=1.0):
            handles = [app.start("hung-limit") for _ in range(2)]
            for h in handles:
                with pytest.raises(konduit.ExecutionFailed, match="timed_out"):
                    h.wait(timeout=10)
    finally:
        hang.set()


def test_a_retry_whose_backoff_crosses_the_deadline_degrades_at_once(make_app):
    """Before: with deadline 2 s and a 10 s backoff the join fired 8 s after the deadline."""
    wf = konduit.Workflow("amplified", version=1)

    @wf.step(deadline="2s", retry=konduit.Retry(max_attempts=5, backoff="fixed", base="10s",
                                                jitter=False),
             fallback=lambda ctx: {"caption": "machine translation"})
    def translate(ctx: konduit.Context) -> dict[str, str]:
        raise ConnectionError("translation API degraded")

    @wf.step(after=[translate])
    def publish(ctx: konduit.Context) -> Any:
        return ctx.upstream["translate"]

    app = make_app(wf)
    with running_worker(app, concurrency=2):
        handle = app.start("amplified")
        began = time.monotonic()
        result = handle.wait(timeout=15)
        # not 10 s of backoff, not even the 2 s budget (on an idle machine: the bound stretches
        # with the measured overload, up to 8 s, still short of the backoff)
        assert time.monotonic() - began < scaled(2.0, cap=8.0)
    assert result.output == {"caption": "machine translation"}
    assert result.outcomes["translate"] == "degraded"


def test_a_hanging_fallback_ends_its_task_timed_out_and_stalls_nothing_else(make_app, db_url):
    hang = threading.Event()
    wf = konduit.Workflow("hanging-fallback", version=1)

    def fallback(ctx: konduit.Context) -> None:
        hang.wait(120)

    @wf.step(deadline="300ms", fallback=fallback)
    def slow(ctx: konduit.Context) -> None:
        time.sleep(5)

    quick = konduit.Workflow("quick2", version=1)

    @quick.step()
    def ping(ctx: konduit.Context) -> str:
        return "pong"

    app = make_app(wf, quick)
    try:
        with running_worker(app, concurrency=1, fallback_timeout=0.5):
            handle = app.start("hanging-fallback")
            other = app.start("quick2")
            assert other.wait(timeout=10).output == "pong"
            assert finished_within(handle, 10) < 5
        status, error = tasks_of(db_url, handle.id)["slow"]
        assert status == "timed_out"
        assert "the fallback did not return within 0.5 s" in (error or "")
    finally:
        hang.set()


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit"])
def test_a_fallback_raising_a_base_exception_leaves_the_worker_running(make_app, db_url, kind):
    """Before: a fallback raising SystemExit killed the worker process; the task then ended
    'failed: lease expired' 23 s later instead of timed_out."""
    error = {"SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
             "GeneratorExit": GeneratorExit()}[kind]
    wf = konduit.Workflow(f"exit-fallback-{kind}", version=1)

    def fallback(ctx: konduit.Context) -> None:
        raise error

    @wf.step(deadline="200ms", fallback=fallback)
    async def slow(ctx: konduit.Context) -> None:
        await asyncio.sleep(5)

    quick = konduit.Workflow(f"after-exit-{kind}", version=1)

    @quick.step()
    def ping(ctx: konduit.Context) -> str:
        return "pong"

    app = make_app(wf, quick)
    with running_worker(app, concurrency=1):
        handle = app.start(wf.name)
        assert finished_within(handle, 10) < 3  # not a lease expiry later
        assert app.start(quick.name).wait(timeout=10).output == "pong"  # the worker lives
    status, err = tasks_of(db_url, handle.id)["slow"]
    assert status == "timed_out" and kind in (err or "")


@pytest.mark.parametrize("kind", ["sync-SystemExit", "async-SystemExit", "async-CancelledError",
                                  "sync-KeyboardInterrupt", "sync-GeneratorExit"])
def test_a_handler_raising_a_base_exception_ends_only_its_attempt(make_app, db_url, kind):
    """Before: a handler raising CancelledError left its attempt open until the lease expired."""
    how, name = kind.split("-")
    error: BaseException = {"SystemExit": SystemExit(1), "KeyboardInterrupt": KeyboardInterrupt(),
                            "CancelledError": asyncio.CancelledError(),
                            "GeneratorExit": GeneratorExit()}[name]
    wf = konduit.Workflow(f"raise-{kind}", version=1)
    if how == "sync":
        @wf.step(retry=konduit.Retry(max_attempts=2, base="10ms", jitter=False))
        def bad(ctx: konduit.Context) -> None:
            raise error
    else:
        @wf.step(retry=konduit.Retry(max_attempts=2, base="10ms", jitter=False))
        async def bad(ctx: konduit.Context) -> None:
            raise error

    quick = konduit.Workflow(f"after-{kind}", version=1)

    @quick.step()
    def ping(ctx: konduit.Context) -> str:
        return "pong"

    app = make_app(wf, quick)
    with running_worker(app, concurrency=1, lease_seconds=30):
        handle = app.start(wf.name)
        with pytest.raises(konduit.ExecutionFailed, match=name):
            handle.wait(timeout=5)  # both attempts ended at once: no lease (30 s) to wait out
        assert app.start(quick.name).wait(timeout=10).output == "pong"
    with psycopg.connect(db_url) as conn:
        outcomes = [r[0] for r in conn.execute(
            "SELECT a.outcome FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
            " WHERE t.execution_id = %s ORDER BY a.attempt", (handle.id,))]
    assert outcomes == ["retry", "failed"]


def test_cancelled_executions_never_start_a_handler_after_the_cancel_committed(make_app):
    """Before: of 395 executions cancelled while running, 34 still ran their join handler, 27
    of them starting it after the cancel was committed."""
    starts: dict[str, float] = {}
    lock = threading.Lock()
    wf = konduit.Workflow("cancel-storm", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> int:
        return 1

    branches = []
    for i in range(4):
        def branch(ctx: konduit.Context) -> int:
            time.sleep(0.01)
            return 1
        branches.append(wf.step(name=f"b{i}", after=[root])(branch))

    @wf.step(after=branches)
    async def join(ctx: konduit.Context) -> int:
        # Async: its first line runs in the very step the worker starts it in, so the time read
        # here is the handler's start. (A sync handler's first line waits for its thread to be
        # scheduled, which can come after the cancel although the handler was already started.)
        with lock:
            starts[str(ctx.execution_id)] = time.monotonic()
        return 1

    app = make_app(wf)
    cancelled_at: dict[str, float] = {}
    with running_worker(app, concurrency=8):
        for round_ in range(6):
            handles = [app.start("cancel-storm") for _ in range(20)]
            time.sleep(0.02 * (round_ % 3))
            for h in handles:
                if app.cancel(h.id):
                    cancelled_at[str(h.id)] = time.monotonic()  # the cancel has committed
        time.sleep(0.5)
    assert len(cancelled_at) >= 30, "the cancels should land while executions run"
    late = [eid for eid, at in cancelled_at.items() if eid in starts and starts[eid] > at]
    assert late == []


def test_a_worker_process_past_its_abandoned_limit_exits_non_zero_for_its_supervisor(db_url):
    app = konduit.App([sweep_app.wf], database_url=db_url)
    proc = spawn_worker(
        "tests.apps.sweep_app:app", db_url, "--max-abandoned", "0", "--shutdown-grace", "1",
        concurrency=None, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        handle = app.start("sweep")
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        proc.kill()
        app.close()
    assert proc.returncode == 3, err
    assert "ignored their deadline" in err
    assert tasks_of(db_url, handle.id)["slow"][0] == "degraded"  # its task ended on time first
