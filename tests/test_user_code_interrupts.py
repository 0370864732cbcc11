"""User code cannot stop the engine: whatever a start-time function, a handler, a fallback, an
input or output model's validator, a map's ``over()`` or a trigger's ``input=``/``key=``
raises (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` included) ends only its own
operation: the start is refused naming the function, the attempt fails, the event is recorded
failed. The App, the HTTP API and real worker processes serve on.

Each test waits on what it expects (a result, a row, a log line) with bounds far above the
machine's noise: a bound here only turns a wedged process into a failure instead of a hang."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

import konduit
import konduit.engine.starts as starts
from konduit.loop_thread import LoopThread
from konduit.threads import HandlerThreads, call_within
from konduit.web import create_app, database_client
from tests.apps import interrupts_app
from tests.support.browser import serving
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import running_worker, spawn_worker, stop_workers

pytestmark = [pytest.mark.storage]

T = TypeVar("T")

BOUND = 60.0
"""Seconds a call may take before the test calls the process wedged: far above any noise."""


def returns(call: Callable[[], T], what: str = "the call") -> T:
    """``call()`` on a thread of its own: its result, or what it raised (BaseException
    included); an AssertionError if it does not return within :data:`BOUND` (a wedged App
    blocks every caller for good)."""
    out: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # what the caller gets is the point
            out["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(BOUND), f"{what} did not return within {BOUND:g} s: the process is wedged"
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


def refused(call: Callable[[], object], error: type[BaseException]) -> BaseException:
    """What ``call()`` raised: it must be ``error`` (a KonduitError), not the interrupt."""
    try:
        returns(call, "the refused start")
    except BaseException as exc:  # checked below
        assert isinstance(exc, error), f"{type(exc).__name__}: {exc}"
        assert isinstance(exc, konduit.KonduitError)
        return exc
    raise AssertionError("the start was not refused")


@pytest.fixture
def apps(db_url: str) -> Iterator[Callable[..., konduit.App]]:
    """Apps on this test's database (the interrupts app's workflows unless given others),
    closed at the end, each within :data:`BOUND`: a wedged App never closes."""
    made: list[konduit.App] = []

    def make(*workflows: konduit.Workflow) -> konduit.App:
        app = konduit.App(list(workflows or interrupts_app.WORKFLOWS), database_url=db_url)
        made.append(app)
        return app

    yield make
    for app in made:
        returns(app.close, "closing the App")


# -- in the App: starts and events applied by the sender ---------------------------------------


def test_a_fair_by_raising_keyboard_interrupt_refuses_its_start_and_the_app_serves_on(apps):
    """Before: the App's loop thread died of it and every later call blocked for good."""
    app = apps()
    exc = refused(lambda: app.start("ki-fair", {"boom": True}), konduit.FairKeyError)
    assert "fair_by of workflow 'ki-fair'" in str(exc) and "KeyboardInterrupt" in str(exc)
    assert "fair_by gave up" in str(exc) and exc.field == "input"
    many = refused(lambda: app.start_many([{"workflow": "ki-fair", "input": {"who": "a"}},
                                                 {"workflow": "ki-fair", "input": {"boom": True}}]),
                   konduit.FairKeyError)
    assert many.index == 1 and "KeyboardInterrupt" in str(many)
    # The same App serves on, from this thread and from others.
    handle = returns(lambda: app.start("ki-fair", {"who": "a"}), "a later start")
    assert returns(lambda: app.status(handle.id)).status in ("pending", "running")
    assert len(returns(lambda: app.start_many(
        [{"workflow": "ki-fair", "input": {"who": w}} for w in "bc"]))) == 2


def test_a_limit_key_function_raising_keyboard_interrupt_refuses_its_start(apps):
    app = apps()
    exc = refused(lambda: app.start("ki-limit", {"boom": True}), konduit.LimitKeyError)
    assert "limit_key" in str(exc) and "KeyboardInterrupt" in str(exc)
    exc = refused(lambda: app.start("ki-capped", {"boom": True}), konduit.LimitKeyError)
    assert "running_key" in str(exc) and "SystemExit" in str(exc)
    assert returns(lambda: app.start("ki-limit", {})).id
    assert returns(lambda: app.start("ki-capped", {})).id


def test_an_input_model_validator_raising_keyboard_interrupt_refuses_its_start(apps):
    """The input model is built for the start's key functions: its validators run then.
    Before: the interrupt left the thread as it was and killed the App's loop thread."""
    app = apps()
    exc = refused(lambda: app.start("ki-typed-keyed", {"boom": True}),
                  konduit.InputValidationError)
    assert "Order" in str(exc) and "KeyboardInterrupt" in str(exc) and exc.field == "input"
    assert returns(lambda: app.start("ki-typed-keyed", {"who": "a"})).id


def test_an_event_whose_code_raises_keyboard_interrupt_fails_that_event_only(apps, db_url):
    """The sender has the code, so it applies the event: the trigger's ``input=``/``key=`` and
    the workflow's ``fair_by``. Before: ``fair_by``'s interrupt killed the App's loop thread."""
    app = apps()
    for payload, words in (({"boom": True, "id": 1}, "input= raised KeyboardInterrupt"),
                           ({"key_boom": True, "id": 2}, "key= raised KeyboardInterrupt")):
        exc = refused(lambda p=payload: app.send_event("ki.event", payload=p),  # type: ignore[misc]
                      konduit.KonduitError)
        assert words in str(exc), exc
    exc = refused(lambda: app.send_event("ki.fair", payload={"boom": True}),
                  konduit.KonduitError)
    assert "fair_by" in str(exc) and "KeyboardInterrupt" in str(exc)
    failed = rows(db_url, "SELECT event, error FROM konduit_trigger_events "
                          "WHERE status = 'failed' ORDER BY id")
    assert [e for e, _ in failed] == ["ki.event", "ki.event", "ki.fair"]
    assert all("KeyboardInterrupt" in err for _, err in failed)
    assert returns(lambda: app.send_event("ki.event", payload={"id": 3})) == "started"
    assert returns(lambda: app.send_event("ki.fair", payload={"who": "a"})) == "started"


def test_a_coroutine_raising_keyboard_interrupt_on_a_loop_thread_comes_back_as_an_error():
    """The loop thread that every sync call of an App (or a Client) goes through: what a
    coroutine (or a task it left behind) raises never ends the thread."""
    loop = LoopThread("test-interrupts")
    try:
        async def interrupted() -> None:
            raise KeyboardInterrupt("on the loop")

        async def leaves_a_task() -> str:
            asyncio.get_running_loop().create_task(interrupted())
            await asyncio.sleep(0)
            return "left"

        with pytest.raises(konduit.KonduitError, match="KeyboardInterrupt: on the loop"):
            returns(lambda: loop.run(interrupted()), "the loop thread")
        assert returns(lambda: loop.run(leaves_a_task())) == "left"
        assert returns(lambda: loop.run(asyncio.sleep(0, "served"))) == "served"
        assert loop.thread.is_alive()
    finally:
        loop.close()


def test_a_thread_of_user_code_turns_every_base_exception_into_an_error():
    """What user code raises on a HandlerThreads thread is awaited on a loop: a
    KeyboardInterrupt or SystemExit set on that future would end the loop's run."""
    threads = HandlerThreads(name="test-interrupts")

    def raises(error: BaseException) -> Callable[[], None]:
        def call() -> None:
            raise error
        return call

    async def main() -> list[str]:
        out = []
        for error in (KeyboardInterrupt("k"), SystemExit(3), GeneratorExit("g"),
                      asyncio.CancelledError("c")):
            try:
                await call_within(threads, raises(error), BOUND)
            except konduit.KonduitError as exc:
                assert exc.__cause__ is error
                out.append(str(exc))
        return out

    messages = returns(lambda: asyncio.run(main()), "the loop")
    assert [m.split(":")[0] for m in messages] == [
        "user code raised KeyboardInterrupt", "user code raised SystemExit",
        "user code raised GeneratorExit", "user code raised CancelledError"]


def test_hung_start_code_is_bounded_and_past_the_bound_starts_are_refused(apps, monkeypatch):
    """Before: every start whose fair_by hung left one more thread behind (a schedule: one
    every 10 s, for good)."""
    release = threading.Event()
    entered: list[int] = []

    def hanging(value: Any) -> str:
        if isinstance(value, dict) and value.get("hang"):
            entered.append(1)
            release.wait(BOUND * 2)
        return "k"

    wf = konduit.Workflow("ki-hung-fair", version=1, fair_by=hanging)

    @wf.step()
    def step(ctx: konduit.Context) -> str:
        return "ok"

    plain = konduit.Workflow("ki-plain", version=1)

    @plain.step()
    def plain_step(ctx: konduit.Context) -> str:
        return "ok"

    monkeypatch.setattr(starts, "START_CODE_SECONDS", 0.5)
    monkeypatch.setattr(starts._start_threads, "max_abandoned", 2)
    app = apps(wf, plain)
    try:
        for _ in range(2):
            exc = refused(lambda: app.start("ki-hung-fair", {"hang": True}), konduit.KonduitError)
            assert "did not return within 0.5 s" in str(exc)
        threads = starts._start_threads.threads
        stuck = refused(lambda: app.start("ki-hung-fair", {"hang": True}), konduit.UserCodeStuck)
        assert "2 calls" in str(stuck) and "still running" in str(stuck)
        assert starts._start_threads.threads == threads  # no thread for a refused start
        assert len(entered) == 2
        refused(lambda: app.start("ki-hung-fair", {}), konduit.UserCodeStuck)
        # A start that runs no user code is not held up by others' hung code.
        assert returns(lambda: app.start("ki-plain", {})).id
    finally:
        release.set()
    until(lambda: starts._start_threads.abandoned == 0, what="the hung calls to return")
    assert returns(lambda: app.start("ki-hung-fair", {})).id


def test_hung_start_code_counts_toward_a_workers_abandoned_limit(apps, monkeypatch):
    """A schedule's tick whose fair_by never returns leaves its thread behind like a hung
    handler does: the worker counts it, and past its limit stops for a fresh process. Before:
    only handler threads counted, and such ticks left a thread each for good."""
    release = threading.Event()

    def hanging(value: Any) -> str:
        release.wait(BOUND * 2)
        return "k"

    wf = konduit.Workflow("ki-hung-tick", version=1, fair_by=hanging)

    @wf.step()
    def step(ctx: konduit.Context) -> str:
        return "ok"

    wf.schedule(every="1s", name="ki-hung-tick")
    monkeypatch.setattr(starts, "START_CODE_SECONDS", 0.5)
    app = apps(wf)
    try:
        with pytest.raises(konduit.WorkerUnhealthy, match="threads of user code"), \
                running_worker(app, concurrency=1, max_abandoned=0, shutdown_grace=1.0) as worker:
            until(lambda: worker.worker().unhealthy, timeout=BOUND,
                  what="the worker to count the hung tick")
    finally:
        release.set()
    until(lambda: starts._start_threads.abandoned == 0, what="the hung calls to return")


def test_the_api_answers_422_for_a_start_whose_fair_by_raises_keyboard_interrupt(apps,
                                                                                 db_url):
    """Before: 500, from the server's loop."""
    app = apps()
    with serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=BOUND) as http:
        answer = http.post("/api/v1/executions", json={"workflow": "ki-fair",
                                                       "input": {"boom": True}})
        assert answer.status_code == 422, answer.text
        body = answer.json()
        assert body["code"] == "fair_key_error" and "KeyboardInterrupt" in body["detail"]
        assert body["field"] == "body.input"
        batch = http.post("/api/v1/executions:batch", json={"requests": [
            {"workflow": "ki-fair", "input": {"who": "a"}},
            {"workflow": "ki-fair", "input": {"boom": True}}]})
        assert batch.status_code == 422 and batch.json()["field"] == "body.requests.1.input"
        later = http.post("/api/v1/executions", json={"workflow": "ki-fair",
                                                      "input": {"who": "a"}})
        assert later.status_code == 201, later.text


# -- in real worker processes ------------------------------------------------------------------


@contextmanager
def worker_process(db_url: str, tmp_path: Path,
                   app: str = "tests.apps.interrupts_app:app") -> Iterator[WorkerLog]:
    """A real ``konduit worker`` of ``app``; at the end it must still be running, and stop
    cleanly (exit 0) on SIGTERM."""
    log = tmp_path / "worker.log"
    proc = spawn_worker(app, db_url, env={"KONDUIT_MAINTENANCE_INTERVAL": "0.2"}, log=log,
                        log_level="INFO")
    try:
        yield WorkerLog(proc, log)
        assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{log.read_text()}"
    finally:
        stop_workers([proc])
    assert proc.returncode == 0, log.read_text()


class WorkerLog:
    def __init__(self, proc: subprocess.Popen[bytes], path: Path):
        self.proc = proc
        self.path = path

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the worker exited ({self.proc.returncode}):\n" \
                                         f"{self.text()}"


def serves_on(app: konduit.App, worker: WorkerLog) -> None:
    """The worker is alive and completes another execution."""
    worker.alive()
    assert app.start("ki-handler", {}).wait(timeout=BOUND).output == "handled"
    worker.alive()


def failed_with(handle: konduit.ExecutionHandle) -> str:
    with pytest.raises(konduit.ExecutionFailed) as failed:
        handle.wait(timeout=BOUND)
    return str(failed.value.result.error)


def test_a_worker_survives_a_handler_raising_keyboard_interrupt(apps, db_url, tmp_path):
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        error = failed_with(app.start("ki-handler", {"boom": True}))
        assert "KeyboardInterrupt: the handler gave up" in error
        serves_on(app, worker)


def test_a_worker_survives_a_fallback_raising_keyboard_interrupt(apps, db_url, tmp_path):
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        error = failed_with(app.start("ki-fallback", {}))
        assert "timed_out" in error and "KeyboardInterrupt: the fallback gave up" in error
        serves_on(app, worker)


def test_a_worker_survives_wait_functions_raising_keyboard_interrupt(apps, db_url, tmp_path):
    """A wait step's ``key=`` and a timer's ``until=`` run in its arming attempt."""
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        error = failed_with(app.start("ki-wait", {"boom": True}))
        assert "KeyboardInterrupt: the wait's key= gave up" in error
        error = failed_with(app.start("ki-timer", {}))
        assert "KeyboardInterrupt: the timer's until= gave up" in error
        serves_on(app, worker)


def test_a_worker_survives_a_map_over_raising_keyboard_interrupt(apps, db_url, tmp_path):
    """Before: the interrupt came out of over()'s thread into the completion round and ended
    the worker process; the execution waited for the next worker, which died the same way."""
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        error = failed_with(app.start("ki-map", {"boom": True}))
        assert "over()" in error and "items" in error and "KeyboardInterrupt" in error
        assert app.start("ki-map", {}).wait(timeout=BOUND).output == [2, 4, 6]
        serves_on(app, worker)


def test_a_worker_survives_an_output_validator_raising_keyboard_interrupt(apps, db_url,
                                                                          tmp_path):
    """Before: the validator ran on the worker's loop and its interrupt ended the process."""
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        error = failed_with(app.start("ki-output", {"boom": True}))
        assert "checked_step" in error and "KeyboardInterrupt" in error, error
        assert app.start("ki-output", {}).wait(timeout=BOUND).output == {"boom": False}
        serves_on(app, worker)


def test_a_worker_survives_an_input_model_validator_raising_keyboard_interrupt(apps, db_url,
                                                                               tmp_path):
    """The start checks the input against the model's schema (no validator runs there); the
    worker builds the model for ``ctx.input`` and its validator raises. Before: that ended the
    worker process. Now the handler gets the input as stored, as with any model that does not
    build, and the worker says why."""
    app = apps()
    with worker_process(db_url, tmp_path) as worker:
        result = app.start("ki-typed", {"boom": True}).wait(timeout=BOUND)
        assert result.output == {"boom": True}
        assert "KeyboardInterrupt" in worker.text()
        serves_on(app, worker)


def test_a_worker_survives_trigger_code_raising_keyboard_interrupt(apps, db_url, tmp_path):
    """Events sent without the code (a Client) are applied by the worker: the trigger's
    ``input=``/``key=`` and the workflow's ``fair_by`` run there. Before: ``fair_by``'s
    interrupt ended the worker, and every worker after it, while the event stayed pending."""
    app = apps()
    with worker_process(db_url, tmp_path) as worker, konduit.Client(db_url) as client:
        until(lambda: value(db_url, "SELECT count(*) FROM konduit_event_triggers "
                                    "WHERE event IN ('ki.event', 'ki.fair')") == 2,
              timeout=BOUND, what="the worker to register the triggers")
        client.send_event("ki.event", payload={"boom": True, "id": 1})
        client.send_event("ki.event", payload={"key_boom": True, "id": 2})
        client.send_event("ki.fair", payload={"boom": True})
        until(lambda: value(db_url, "SELECT count(*) FROM konduit_trigger_events "
                                    "WHERE status = 'pending'") == 0,
              timeout=BOUND, what="the worker to apply the events")
        failed = dict(rows(db_url, "SELECT payload::text, error FROM konduit_trigger_events "
                                   "WHERE status = 'failed'"))
        assert len(failed) == 3, failed
        errors = sorted(failed.values())
        assert any("input= raised KeyboardInterrupt" in e for e in errors), errors
        assert any("key= raised KeyboardInterrupt" in e for e in errors), errors
        assert any("fair_by" in e and "KeyboardInterrupt" in e for e in errors), errors
        worker.alive()
        client.send_event("ki.fair", payload={"who": "a"})
        until(lambda: value(db_url, "SELECT count(*) FROM konduit_executions e "
                                    "WHERE e.workflow_name = 'ki-fair' "
                                    "AND e.status = 'succeeded'") == 1,
              timeout=BOUND, what="the good event's execution to succeed")
        serves_on(app, worker)


def test_a_worker_survives_a_schedule_whose_fair_by_raises_keyboard_interrupt(apps, db_url,
                                                                              tmp_path):
    """Before: each tick's interrupt ended the worker process (a crash loop under a
    supervisor)."""
    app = apps()
    with worker_process(db_url, tmp_path, "tests.apps.interrupts_app:ticking") as worker:
        until(lambda: worker.text().count("fair_by gave up") >= 2, timeout=BOUND,
              what="two ticks refused")
        assert "schedule 'ki-tick'" in worker.text() and "KeyboardInterrupt" in worker.text()
        serves_on(app, worker)
        assert value(db_url, "SELECT count(*) FROM konduit_executions "
                             "WHERE workflow_name = 'ki-tick'") == 0
