"""Resilience: cancellation, execution timeouts, graceful and ungraceful worker deaths, stale
workers and poison payloads — on real PostgreSQL, with real `konduit worker` processes where a
process has to die.

Every wait is a polling loop bounded by a timeout (:func:`wait_until`); no sleep decides an
assertion.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import konduit
from konduit.db.database import Database
from konduit.worker.maintenance import reclaim_expired_leases
from tests.apps import resilience_app
from tests.support.db import rows
from tests.support.waiting import until
from tests.support.workers import ROOT, reaped, running_worker, spawn_worker

pytestmark = [pytest.mark.storage]

T = TypeVar("T")

FAIL_WAIT = 3.0
"""How long an execution whose handler misbehaves may take to end. A working engine ends it in
well under a second; a regression (an abandoned task waiting for its lease, a completion retried
forever) would otherwise hang the test."""


# -- helpers ------------------------------------------------------------------------------------


def task_states(db_url: str, execution_id: Any) -> dict[str, tuple[str, int]]:
    """step -> (status, attempt) of every task of one execution."""
    return {
        step: (status, attempt)
        for step, status, attempt in rows(
            db_url,
            "SELECT step, status, attempt FROM konduit_tasks WHERE execution_id = %s",
            execution_id,
        )
    }


def attempts(db_url: str, execution_id: Any) -> dict[str, list[tuple[int, str | None, str]]]:
    """step -> [(attempt, outcome, worker_id), ...] in the order the attempts started."""
    found: dict[str, list[tuple[int, str | None, str]]] = {}
    for step, attempt, outcome, worker_id in rows(
        db_url,
        "SELECT t.step, a.attempt, a.outcome, a.worker_id FROM konduit_attempts a"
        " JOIN konduit_tasks t ON t.id = a.task_id WHERE t.execution_id = %s"
        " ORDER BY a.started_at, a.id",
        execution_id,
    ):
        found.setdefault(step, []).append((attempt, outcome, worker_id))
    return found


def snapshot(db_url: str, execution_id: Any) -> tuple[Any, ...]:
    """Everything a completion could change about one execution."""
    return (
        rows(db_url, "SELECT step, map_index, status, attempt, output_hash, error, finished_at,"
             " lease_token FROM konduit_tasks WHERE execution_id = %s ORDER BY id", execution_id),
        rows(db_url, "SELECT * FROM konduit_steps WHERE execution_id = %s ORDER BY step",
             execution_id),
        rows(db_url, "SELECT status, output, error, steps_pending, finished_at"
             " FROM konduit_executions WHERE id = %s", execution_id),
        rows(db_url, "SELECT a.* FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
             " WHERE t.execution_id = %s ORDER BY a.id", execution_id),
        rows(db_url, "SELECT step, map_index, content_hash, payload FROM konduit_outputs"
             " WHERE execution_id = %s ORDER BY 1, 2, 3", execution_id),
    )


def spawn(db_url: str, log: Path, *args: str, env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """A real ``konduit worker tests.apps.resilience_app:app`` process; its output goes to
    ``log``."""
    return spawn_worker("tests.apps.resilience_app:app", db_url, *args, concurrency=None,
                        log_level="INFO", log=log, env=env)


# -- 1. cancel during a fan-out -----------------------------------------------------------------

WIDTH = 20
BRANCH_SECONDS = 5.0
CANCEL_PROMPTNESS = 2.0
"""A running handler must be stopped this soon after the cancel. Shorter than the heartbeat
interval used below (3 s): only the worker's LISTEN on ``konduit_stopped`` can meet it."""


def cancel_fanout_workflow(
    kind: str, started: dict[str, float], stopped: dict[str, float]
) -> konduit.Workflow:
    """root -> b00..b19 (each runs BRANCH_SECONDS unless stopped) -> join."""
    wf = konduit.Workflow(f"cancel-fanout-{kind}", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> int:
        return 0

    branch: Callable[[konduit.Context], Any]
    if kind == "async":

        async def async_branch(ctx: konduit.Context) -> int:
            started[ctx.step] = time.monotonic()
            try:
                await asyncio.sleep(BRANCH_SECONDS)
            except asyncio.CancelledError:
                stopped[ctx.step] = time.monotonic()
                raise
            return 1

        branch = async_branch
    else:

        def sync_branch(ctx: konduit.Context) -> int:
            started[ctx.step] = time.monotonic()
            give_up = time.monotonic() + BRANCH_SECONDS
            while not ctx.cancelled and time.monotonic() < give_up:
                time.sleep(0.01)
            if ctx.cancelled:
                stopped[ctx.step] = time.monotonic()
            return 1

        branch = sync_branch

    names = [f"b{i:02d}" for i in range(WIDTH)]
    for name in names:
        wf.step(name=name, after=[root])(branch)

    @wf.step(after=names)
    def join(ctx: konduit.Context) -> int:
        return len(ctx.upstream)

    return wf


def sentinel_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("sentinel", version=1)

    @wf.step()
    def ping(ctx: konduit.Context) -> str:
        return "pong"

    return wf


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_cancel_during_fan_out_stops_running_branches_and_claims_nothing_more(
    make_app, db_url, kind
):
    started: dict[str, float] = {}
    stopped: dict[str, float] = {}
    wf = cancel_fanout_workflow(kind, started, stopped)
    app = make_app(wf, sentinel_workflow())
    handle = app.start(wf.name)
    with running_worker(app, concurrency=3, lease_seconds=15.0, heartbeat_interval=3.0):
        # Every slot busy with a branch (the other 17 are ready) before cancelling, so no
        # claimed task sits between its claim and its handler when the cancel lands.
        until(lambda: len(started) == 3, 15, "three branches running")
        cancel_at = time.monotonic()
        assert app.cancel(handle.id) is True
        until(lambda: set(stopped) == set(started), 5,
              "every running branch to be stopped")
        lag = {step: round(stopped[step] - cancel_at, 3) for step in stopped}
        assert max(lag.values()) < CANCEL_PROMPTNESS, lag

        with pytest.raises(konduit.ExecutionFailed) as failed:
            handle.wait(timeout=5)
        assert failed.value.result.status == "cancelled"
        # The worker keeps working after the cancel, and what it claims next is not the
        # cancelled execution's (its 17 ready branches would come first, by id).
        assert app.start("sentinel").wait(timeout=10).output == "pong"

    assert app.status(handle.id).status == "cancelled"
    assert app.cancel(handle.id) is False  # already finished
    (late,) = rows(
        db_url,
        "SELECT count(*) FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
        " JOIN konduit_executions e ON e.id = t.execution_id"
        " WHERE e.id = %s AND a.started_at > e.finished_at",
        handle.id,
    )
    assert late == (0,), "an attempt started after the cancel committed"
    tasks = task_states(db_url, handle.id)
    assert "join" not in tasks
    assert tasks.pop("root") == ("succeeded", 1)
    assert {status for status, _ in tasks.values()} == {"cancelled"}
    assert len(tasks) == WIDTH
    tried = attempts(db_url, handle.id)
    tried.pop("root")
    assert set(tried) == set(started)
    assert all(a == [(1, "cancelled", a[0][2])] for a in tried.values()), tried
    (closed,) = rows(
        db_url,
        "SELECT bool_and(a.finished_at <= e.finished_at + interval '2 seconds')"
        " FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id"
        " JOIN konduit_executions e ON e.id = t.execution_id"
        " WHERE e.id = %s AND t.step <> 'root'",
        handle.id,
    )
    assert closed == (True,)
    steps = {s.step: s.status for s in app.steps(handle.id)}
    assert steps["join"] == "cancelled"


# -- 2. execution timeout -----------------------------------------------------------------------


def test_execution_timeout_ends_it_timed_out_and_cancels_its_tasks(make_app, db_url):
    started: dict[str, float] = {}
    stopped: dict[str, float] = {}
    wf = konduit.Workflow("timeout", version=1)

    async def sleepy(ctx: konduit.Context) -> str:
        started[ctx.step] = time.monotonic()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            stopped[ctx.step] = time.monotonic()
            raise
        return "woke"

    wf.step(name="slow_a")(sleepy)
    wf.step(name="slow_b")(sleepy)

    @wf.step(after=["slow_a", "slow_b"])
    def done(ctx: konduit.Context) -> str:
        return "unreachable"

    app = make_app(wf)
    with running_worker(app, concurrency=1):  # one branch runs, the other waits ready
        t0 = time.monotonic()
        handle = app.start("timeout", timeout="1s")
        with pytest.raises(konduit.ExecutionFailed) as failed:
            handle.wait(timeout=8)
        elapsed = time.monotonic() - t0
        until(lambda: started and set(stopped) == set(started), 3,
              "the running branch to be stopped")
    result = failed.value.result
    assert result.status == "timed_out"
    assert "timeout" in (result.error or "")
    # 1 s timeout + at most one 2 s maintenance interval + slack.
    assert elapsed < 5.0, elapsed
    assert task_states(db_url, handle.id) == {
        "slow_a": ("cancelled", 1 if "slow_a" in started else 0),
        "slow_b": ("cancelled", 1 if "slow_b" in started else 0),
    }
    assert len(started) == 1
    tried = attempts(db_url, handle.id)
    assert [[(n, o) for n, o, _ in a] for a in tried.values()] == [[(1, "cancelled")]]
    assert result.outcomes == {"slow_a": "cancelled", "slow_b": "cancelled", "done": "cancelled"}


# -- 3. SIGTERM with work in flight -------------------------------------------------------------


@contextmanager
def sigterm_with_work_in_flight(
    make_app: Callable[..., konduit.App], db_url: str, tmp_path: Path
) -> Iterator[tuple[konduit.ExecutionHandle, subprocess.Popen[bytes], float, Path]]:
    """A ``konduit worker`` process (concurrency 4, 1 s grace) running ``resilience-sigterm``:
    SIGTERM is sent once the quick branches are recorded and both slow (30 s, sync) handlers
    run. Yields the execution, the process, when it was signalled and its log."""
    marks = tmp_path / "marks"
    marks.mkdir()
    log = tmp_path / "worker.log"
    app = make_app(resilience_app.sigterm_wf)
    handle = app.start("resilience-sigterm")
    with reaped([]) as procs:
        procs.append(spawn(
            db_url, log, "--concurrency", "4", "--shutdown-grace", "1",
            env={"KONDUIT_RESILIENCE_SLOW": "30", "KONDUIT_RESILIENCE_MARKS": str(marks)},
        ))

        def in_flight() -> bool:
            tasks = task_states(db_url, handle.id)
            return (
                all(tasks.get(s) == ("succeeded", 1) for s in resilience_app.SIGTERM_QUICK)
                and all(tasks.get(s) == ("running", 1) for s in resilience_app.SIGTERM_SLOW)
                and all((marks / f"{s}-1").exists() for s in resilience_app.SIGTERM_SLOW)
            )

        until(in_flight, 30, "quick branches recorded and slow handlers running")
        procs[0].send_signal(signal.SIGTERM)
        yield handle, procs[0], time.monotonic(), log


@pytest.mark.slow
def test_sigterm_releases_in_flight_work_for_another_worker(make_app, db_url, tmp_path):
    quick, slow = resilience_app.SIGTERM_QUICK, resilience_app.SIGTERM_SLOW
    with sigterm_with_work_in_flight(make_app, db_url, tmp_path) as (handle, worker, at, log):
        until(
            lambda: all(task_states(db_url, handle.id)[s] == ("ready", 0) for s in slow),
            1 + 5, "the slow branches to be released after the 1 s grace",
        )
        # The process leaves soon after its grace period although both slow handler threads
        # are still asleep (a sync handler cannot be interrupted; its late result is fenced off).
        try:
            code = worker.wait(timeout=max(0.1, at + 1 + 4 - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"exit code {code} 5 s after SIGTERM\n{log.read_text()}"

        tasks = task_states(db_url, handle.id)
        assert {s: tasks[s] for s in quick} == {s: ("succeeded", 1) for s in quick}
        assert "gather" not in tasks
        tried = attempts(db_url, handle.id)
        assert all([(n, o) for n, o, _ in tried[s]] == [(1, "succeeded")] for s in quick)
        assert all([(n, o) for n, o, _ in tried[s]] == [(1, "released")] for s in slow), (
            tried, log.read_text())

        # A second worker (in this process, where the slow handler is fast: no env variable).
        with running_worker(make_app(resilience_app.sigterm_wf), concurrency=4):
            result = handle.wait(timeout=20)
    assert result.output == sorted(f"{s} done" for s in (*quick, *slow))
    tried = attempts(db_url, handle.id)
    for s in slow:
        (n1, o1, w1), (n2, o2, w2) = tried[s]
        assert (n1, o1, n2, o2) == (1, "released", 1, "succeeded") and w1 != w2
    assert {s: task_states(db_url, handle.id)[s] for s in slow} == {
        s: ("succeeded", 1) for s in slow}
    assert [(n, o) for n, o, _ in tried["gather"]] == [(1, "succeeded")]


class HeldProxy:
    """A TCP front for the test server that holds every new connection until ``release`` is
    set: a database that is slow to answer a worker coming up. ``arrived`` is set when the
    first client connects."""

    def __init__(self, db_url: str):
        info = conninfo_to_dict(db_url)
        host, port = str(info.get("host") or "localhost"), int(info.get("port") or 5432)
        self.upstream: tuple[socket.AddressFamily, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = make_conninfo(db_url, host="127.0.0.1", port=self.listener.getsockname()[1])
        self.arrived, self.release = threading.Event(), threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self.arrived.set()
        self.release.wait(30)
        upstream = socket.socket(self.upstream[0], socket.SOCK_STREAM)
        upstream.connect(self.upstream[1])
        self.sockets += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.release.set()
        self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.mark.slow
def test_sigterm_while_the_worker_connects_still_stops_it(db_url, tmp_path):
    proxy = HeldProxy(db_url)
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c",
             "from tests.apps.resilience_app import app; app.run_worker(2, poll_interval=0.2)"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "KONDUIT_DATABASE_URL": proxy.url},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    with reaped([proc]):
        try:
            assert proxy.arrived.wait(30), "the worker never tried to connect"
            proc.send_signal(signal.SIGTERM)  # the worker process is inside App.run_worker now
            time.sleep(0.5)  # the slow connection completes a moment after the signal
            proxy.release.set()
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            proxy.close()
    assert code == 0, f"exit code {code} 5 s after SIGTERM (None: still running)\n{log.read_text()}"


# -- 4. a handler that kills its worker on every attempt ------------------------------------------


@pytest.mark.slow
def test_handler_killing_its_worker_is_dead_lettered_after_max_attempts(
    make_app, db_url, tmp_path
):
    marks = tmp_path / "marks"
    marks.mkdir()
    log = tmp_path / "workers.log"
    app = make_app(resilience_app.crash_wf)
    handle = app.start("resilience-crash")
    deadline = time.monotonic() + 60
    with reaped([]) as procs:

        def story() -> str:
            return (f"exit codes {[p.poll() for p in procs]}, tasks {task_states(db_url, handle.id)},"
                    f" marks {sorted(m.name for m in marks.iterdir())}\n{log.read_text()[-4000:]}")

        while not app.status(handle.id).finished:
            assert time.monotonic() < deadline, f"not finished after 60 s: {story()}"
            assert len(procs) <= 6, f"{len(procs)} worker processes, not finished: {story()}"
            if not procs or procs[-1].poll() is not None:
                procs.append(spawn(
                    db_url, log, "--concurrency", "1",
                    "--lease-seconds", "2", "--heartbeat-interval", "0.5",
                    env={"KONDUIT_RESILIENCE_CRASH": "1", "KONDUIT_RESILIENCE_MARKS": str(marks)},
                ))
            time.sleep(0.1)  # polling interval
        survivor = procs[-1]
        survivor.send_signal(signal.SIGTERM)
        try:
            survivor.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the last worker ignored SIGTERM: {story()}")
        # Three processes killed by the handler, one that reclaimed the last attempt and stopped.
        assert [p.returncode for p in procs] == [1, 1, 1, 0], story()
    assert sorted(m.name for m in marks.iterdir()) == ["crash-1", "crash-2", "crash-3"]

    with pytest.raises(konduit.ExecutionFailed) as failed:
        handle.wait(timeout=1)
    assert failed.value.result.status == "failed"
    tasks = task_states(db_url, handle.id)
    assert tasks == {"fine": ("succeeded", 1), "crash": ("failed", 3)}
    tried = attempts(db_url, handle.id)
    assert [(n, o) for n, o, _ in tried["crash"]] == [(1, "lost"), (2, "lost"), (3, "lost")]
    assert len({w for _, _, w in tried["crash"]}) == 3  # one dead worker process per attempt
    dead = [d for d in app.dead_letters() if str(d.execution_id) == str(handle.id)]
    assert [(d.step, d.attempt) for d in dead] == [("crash", 3)]
    assert "lease expired" in dead[0].error


# -- 5. a stale worker completing late ----------------------------------------------------------


async def _reclaim(db_url: str, registry: Any) -> int:
    db = Database(db_url, min_size=1, max_size=1)
    await db.open()
    try:
        return await reclaim_expired_leases(db, registry, lease_seconds=1.0)
    finally:
        await db.close()


def test_stale_worker_completing_after_its_task_was_redone_changes_nothing(
    make_app, db_url, caplog
):
    caplog.set_level(logging.WARNING, logger="konduit.worker")
    entered, release = threading.Event(), threading.Event()
    wf = konduit.Workflow("stale", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=3, base="10ms", cap="10ms", jitter=False))
    def work(ctx: konduit.Context) -> dict[str, int]:
        if ctx.attempt == 1:
            entered.set()
            release.wait(30)  # a hung handler: it ignores everything until released
        return {"attempt": ctx.attempt}

    first, second = make_app(wf), make_app(wf)
    handle = first.start("stale")
    # No heartbeat during the test (its first beat is 30 s away), so nothing re-extends the
    # lease this test expires by hand.
    with running_worker(first, concurrency=1, lease_seconds=60, heartbeat_interval=30):
        assert entered.wait(15)
        (task_id,) = rows(db_url, "SELECT id FROM konduit_tasks WHERE execution_id = %s",
                          handle.id)[0]
        with psycopg.connect(db_url, autocommit=True) as conn:
            # Stale: its lease ran out and its worker has not been heard from for longer than a
            # lease (rescue keys on the worker's liveness, not on one lease alone).
            conn.execute("UPDATE konduit_tasks SET lease_expires_at = now() - interval '1 second'"
                         " WHERE id = %s", (task_id,))
            conn.execute("UPDATE konduit_workers SET last_heartbeat_at = now() - interval '1 hour'")
        asyncio.run(_reclaim(db_url, first.registry))  # the first worker's sweep may win: fine
        until(lambda: attempts(db_url, handle.id)["work"][0][1] == "lost", 5,
              "the first attempt to be reclaimed")

        with running_worker(second, concurrency=1):
            result = handle.wait(timeout=15)
        assert result.output == {"attempt": 2}
        before = snapshot(db_url, handle.id)

        release.set()

        def dropped() -> list[logging.LogRecord]:
            return [r for r in caplog.records
                    if r.name.startswith("konduit.worker") and "no longer leased" in r.getMessage()]

        (record,) = until(dropped, 10, "the worker to log the dropped result")
    assert str(task_id) in record.getMessage() and "not used" in record.getMessage()
    assert record.levelno == logging.WARNING
    late = until(lambda: rows(db_url, "SELECT payload FROM konduit_outputs WHERE"
                 " execution_id = %s AND source = 'late'", handle.id), 5,
    "the stale worker's result to be kept as late")
    assert late == [({"attempt": 1},)]
    with psycopg.connect(db_url, autocommit=True) as conn:  # compare all but the late result
        conn.execute("DELETE FROM konduit_outputs WHERE source = 'late'")
    assert snapshot(db_url, handle.id) == before
    assert first.status(handle.id).output == {"attempt": 2}
    assert [(n, o) for n, o, _ in attempts(db_url, handle.id)["work"]] == [
        (1, "lost"), (2, "succeeded")]
    assert rows(db_url, "SELECT payload FROM konduit_outputs WHERE execution_id = %s",
                handle.id) == [({"attempt": 2},)]


# -- 6. poison input ----------------------------------------------------------------------------


def one_step(name: str, handler: Callable[[konduit.Context], Any], **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name=handler.__name__, **options)(handler)
    return wf


def test_oversized_input_is_refused_at_start_naming_the_limit(make_app, db_url):
    def echo(ctx: konduit.Context) -> Any:
        return len(ctx.input["blob"])

    app = make_app(one_step("big-input", echo), max_payload_bytes=1000)
    with pytest.raises(konduit.PayloadError, match=r"limit of 1000 bytes") as refused:
        app.start("big-input", input={"blob": "x" * 2000})
    assert isinstance(refused.value, konduit.KonduitError)
    assert "input" in str(refused.value)
    assert rows(db_url, "SELECT count(*) FROM konduit_executions") == [(0,)]
    # Just under the limit is fine.
    handle = app.start("big-input", input={"blob": "x" * 900})
    with running_worker(app, concurrency=1):
        assert handle.wait(timeout=10).output == 900


def test_oversized_output_fails_the_task_naming_the_limit(make_app, db_url):
    def big(ctx: konduit.Context) -> str:
        return "x" * 2000

    app = make_app(one_step("big-output", big), max_payload_bytes=1000)
    handle = app.start("big-output")
    with running_worker(app, concurrency=1), pytest.raises(konduit.ExecutionFailed) as failed:
        handle.wait(timeout=10)
    assert failed.value.result.outcomes == {"big": "failed"}
    # Not retried: the same handler would return the same payload.
    ((n, outcome, _),) = attempts(db_url, handle.id)["big"]
    assert (n, outcome) == (1, "failed")
    (task,) = app.tasks(handle.id)
    assert "limit of 1000 bytes" in task.error
    assert rows(db_url, "SELECT count(*) FROM konduit_outputs") == [(0,)]


class Unprintable(Exception):
    """An exception that cannot even be turned into text."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ exploded")


class UnprintableBase(BaseException):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ exploded")


def test_unprintable_exceptions_fail_their_task_and_the_worker_runs_on(make_app, db_url):
    def raise_unprintable(ctx: konduit.Context) -> None:
        raise Unprintable("nobody will ever read this")

    def raise_unprintable_base(ctx: konduit.Context) -> None:
        raise UnprintableBase()

    def fine(ctx: konduit.Context) -> str:
        return "still here"

    once = konduit.Retry(max_attempts=1)
    app = make_app(
        one_step("unprintable", raise_unprintable, retry=once),
        one_step("unprintable-base", raise_unprintable_base, retry=once),
        one_step("fine", fine),
    )
    bad = {"Unprintable": app.start("unprintable"),
           "UnprintableBase": app.start("unprintable-base")}
    good = app.start("fine")
    # One slot, so the good execution runs after the bad ones on the same worker. A short lease,
    # so that even a task the worker abandoned would end within the test.
    with running_worker(app, concurrency=1, lease_seconds=2, heartbeat_interval=0.5):
        assert good.wait(timeout=15).output == "still here"
        for h in bad.values():
            with pytest.raises(konduit.ExecutionFailed) as failed:
                h.wait(timeout=FAIL_WAIT)
            assert failed.value.result.status == "failed"
    for name, h in bad.items():
        (task,) = app.tasks(h.id)
        assert task.status == "failed"
        assert name in task.error, task.error  # the class name, at least
        ((n, outcome, _),) = next(iter(attempts(db_url, h.id).values()))
        assert (n, outcome) == (1, "failed")  # the handler's own failure, not a lost lease
    workers = {t.worker_id for h in [*bad.values(), good] for t in app.tasks(h.id)}
    assert len(workers) == 1


@pytest.mark.parametrize("kind", [ValueError, SystemExit], ids=["exception", "system-exit"])
def test_handler_error_text_with_nul_is_recorded(make_app, db_url, kind):
    """PostgreSQL text cannot hold NUL: the error is stored with it escaped, retries go on as
    usual, and the task ends failed instead of its completion failing for ever."""

    def error_with_nul(ctx: konduit.Context) -> None:
        raise kind("bad byte \x00 in the input")

    retry = konduit.Retry(max_attempts=2, base="10ms", cap="10ms", jitter=False)
    app = make_app(one_step("nul-error", error_with_nul, retry=retry))
    handle = app.start("nul-error")
    with (
        running_worker(app, concurrency=1, shutdown_grace=0.5),
        pytest.raises(konduit.ExecutionFailed) as failed,
    ):
        handle.wait(timeout=FAIL_WAIT)
    assert failed.value.result.outcomes == {"error_with_nul": "failed"}
    assert [(n, o) for n, o, _ in attempts(db_url, handle.id)["error_with_nul"]] == [
        (1, "retry"), (2, "failed")]
    (task,) = app.tasks(handle.id)
    assert "bad byte \\x00 in the input" in task.error
    assert "\x00" not in task.error
