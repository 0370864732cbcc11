"""A child workflow's end wakes its parent's step at once (docs/durable-waits.md, "Child
workflows"), not at the workers' next maintenance pass: every test here runs its worker with a
maintenance interval of a minute, so a wake that waited for the pass would fail it. And the wake
stays exactly-once when the prompt wake and maintenance passes race for one parent step."""

from __future__ import annotations

import asyncio
import threading
import time
from uuid import UUID

import pytest

import konduit
from konduit.db.database import Database
from konduit.db.sealing import configured as configured_payloads
from konduit.engine import starts, waits
from konduit.engine.finish import ChildEnded
from konduit.engine.registry import Registry
from tests.support.db import rows
from tests.support.load import scaled
from tests.support.payloads import opened
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

SLOW_PASS = {"poll_interval": 0.1, "maintenance_interval": 60.0}
# Seconds from a child's end to its parent's step ending. The maintenance pass that would
# otherwise wake the parent comes only every 60 s (SLOW_PASS), so anything well under that shows
# the prompt wake; 5 s leaves a loaded machine's noise room (it takes ~20 ms when quiet).
PROMPT = 5.0


def lag(url: str, parent: UUID, step: str) -> float:
    """Seconds from the child execution's finish to its parent step's task's finish (the
    database's clock for both)."""
    [(seconds,)] = rows(
        url, "SELECT extract(epoch FROM t.finished_at - c.finished_at)::float8 "
        "FROM konduit_tasks t JOIN konduit_executions c ON c.id = t.wait_child "
        "WHERE t.execution_id = %s AND t.step = %s", parent, step)
    assert isinstance(seconds, float)
    return seconds


def nested() -> list[konduit.Workflow]:
    """Three levels: outer -> middle -> leaf."""
    leaf = konduit.Workflow("leaf", version=1)

    @leaf.step()
    def work(ctx):
        return {"leaf": ctx.input["n"]}

    middle = konduit.Workflow("middle", version=1)
    middle.subworkflow(name="inner", workflow="leaf", input=lambda ctx: ctx.input)

    @middle.step(after=["inner"])
    def wrap(ctx):
        return {"middle": ctx.upstream["inner"]}

    outer = konduit.Workflow("outer", version=1)
    outer.subworkflow(name="nest", workflow="middle", input=lambda ctx: ctx.input)

    @outer.step(after=["nest"])
    def done(ctx):
        return ctx.upstream["nest"]

    return [leaf, middle, outer]


def test_each_level_of_nesting_wakes_its_parent_at_once(make_app, db_url):
    app = make_app(*nested())
    with running_worker(app, **SLOW_PASS):
        began = time.monotonic()
        result = app.start("outer", input={"n": 7}).wait(timeout=30)
        took = time.monotonic() - began
    assert result.output == {"middle": {"leaf": 7}}
    [(middle_id,)] = rows(db_url, "SELECT id FROM konduit_executions WHERE workflow_name = "
                           "'middle'")
    assert isinstance(middle_id, UUID)
    assert lag(db_url, middle_id, "inner") < PROMPT
    assert lag(db_url, result_id(db_url, "outer"), "nest") < PROMPT
    # Two levels, each woken at once: nowhere near one maintenance interval (60 s). 5 s idle,
    # stretched by the measured overload up to 30 s.
    assert took < scaled(5, cap=30.0), took


def result_id(url: str, workflow: str) -> UUID:
    [(eid,)] = rows(url, "SELECT id FROM konduit_executions WHERE workflow_name = %s", workflow)
    assert isinstance(eid, UUID)
    return eid


def failing(fallback_on_failure: bool) -> list[konduit.Workflow]:
    child = konduit.Workflow("broken", version=1)

    @child.step(retry=konduit.Retry(max_attempts=1))
    def explode(ctx):
        raise RuntimeError("the child broke")

    parent = konduit.Workflow("caller", version=1)
    parent.subworkflow(name="call", workflow="broken", fallback_on_failure=fallback_on_failure,
                       fallback=lambda ctx: {"from": "fallback"} if fallback_on_failure else None)

    @parent.step(after=["call"])
    def after(ctx):
        return {"got": ctx.upstream["call"], "outcome": ctx.outcomes["call"]}

    return [child, parent]


def test_a_failed_child_fails_its_parent_step_at_once(make_app, db_url):
    app = make_app(*failing(fallback_on_failure=False))
    with running_worker(app, **SLOW_PASS), pytest.raises(konduit.ExecutionFailed) as failed:
        app.start("caller").wait(timeout=30)
    assert failed.value.result.outcomes["call"] == "failed"
    eid = result_id(db_url, "caller")
    [(error,)] = rows(db_url, "SELECT error FROM konduit_tasks WHERE execution_id = %s "
                       "AND step = 'call'", eid)
    error = opened(error)
    assert "ended failed" in str(error) and "the child broke" in str(error)
    assert lag(db_url, eid, "call") < PROMPT


def test_a_failed_child_degrades_its_parent_step_to_the_fallback_at_once(make_app, db_url):
    app = make_app(*failing(fallback_on_failure=True))
    with running_worker(app, **SLOW_PASS):
        result = app.start("caller").wait(timeout=30)
    assert result.output == {"got": {"from": "fallback"}, "outcome": "degraded"}
    assert lag(db_url, result_id(db_url, "caller"), "call") < PROMPT


def waiting_child() -> list[konduit.Workflow]:
    """A child that waits for an event nobody sends: it ends only when cancelled or timed out."""
    child = konduit.Workflow("approval", version=1)
    child.wait_for_event("approved", name="approve")
    parent = konduit.Workflow("asks", version=1)
    parent.subworkflow(name="ask", workflow="approval")

    @parent.step(after=["ask"])
    def after(ctx):
        return ctx.upstream["ask"]

    return [child, parent]


def child_of(url: str, parent: UUID, step: str) -> UUID:
    def armed() -> bool:
        return bool(rows(url, "SELECT 1 FROM konduit_tasks WHERE execution_id = %s AND "
                          "step = %s AND status = 'waiting'", parent, step))

    until(armed, 20, f"{step} to wait for its child")
    [(child,)] = rows(url, "SELECT wait_child FROM konduit_tasks WHERE execution_id = %s "
                       "AND step = %s", parent, step)
    assert isinstance(child, UUID)
    return child


def test_cancelling_a_child_fails_its_parent_step_before_cancel_returns(make_app, db_url):
    app = make_app(*waiting_child())
    with running_worker(app, **SLOW_PASS):
        handle = app.start("asks")
        child = child_of(db_url, handle.id, "ask")
        assert app.cancel(child) is True
        # The App that cancelled woke the parent's step itself, before answering.
        assert rows(db_url, "SELECT status FROM konduit_tasks WHERE execution_id = %s AND "
                     "step = 'ask'", handle.id) == [("failed",)]
        with pytest.raises(konduit.ExecutionFailed) as failed:
            handle.wait(timeout=20)
    assert failed.value.result.outcomes["ask"] == "failed"


def test_a_child_past_its_timeout_wakes_its_parent_in_the_same_pass(make_app, db_url):
    """The execution timeout is found by a pass; the parent's step is woken right after that
    pass ended the child, not by the next pass (which wakes due tasks before it ends timed-out
    executions, a full interval later)."""
    app = make_app(*waiting_child())
    with running_worker(app, poll_interval=0.1, maintenance_interval=1.0):
        handle = app.start("asks")
        child = child_of(db_url, handle.id, "ask")
        rows(db_url, "UPDATE konduit_executions SET timeout_at = clock_timestamp() "
              "WHERE id = %s RETURNING id", child)
        with pytest.raises(konduit.ExecutionFailed) as failed:
            handle.wait(timeout=20)
    assert failed.value.result.outcomes["ask"] == "failed"
    assert app.status(child).status == "timed_out"
    assert lag(db_url, handle.id, "ask") < PROMPT


def queued_apart() -> list[konduit.Workflow]:
    """middle -> leaf, the leaf's step on a queue of its own."""
    leaf = konduit.Workflow("leaf-apart", version=1)

    @leaf.step(queue="leaves")
    def work(ctx):
        return {"leaf": ctx.input["n"]}

    middle = konduit.Workflow("middle-apart", version=1)
    middle.subworkflow(name="inner", workflow="leaf-apart", input=lambda ctx: ctx.input)

    @middle.step(after=["inner"])
    def wrap(ctx):
        return {"middle": ctx.upstream["inner"]}

    return [leaf, middle]


def test_the_prompt_wake_and_racing_maintenance_passes_end_the_step_once(make_app, db_url):
    """Children that ended while nobody woke their parents (the worker that ended them does not
    serve the parents' workflow, and no pass runs); then, for each parent, two prompt wakes and
    two maintenance passes (each as if of its own process) read the task as waiting and write
    at one gate. Exactly one of the four changes it; the step after it runs once."""
    flows = queued_apart()
    trials = 12
    app = make_app(*flows)
    with running_worker(app, **SLOW_PASS, queues=["default"]):  # arms; runs no leaf
        handles = app.start_many([konduit.StartRequest("middle-apart", input={"n": n})
                                  for n in range(trials)])
        until(lambda: rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE step = 'inner' "
                           "AND status = 'waiting'")[0][0] == trials, 30, "every step to wait")
    with running_worker(make_app(flows[0]), **SLOW_PASS, queues=["leaves"]):
        until(lambda: rows(db_url, "SELECT count(*) FROM konduit_executions WHERE "
                           "workflow_name = 'leaf-apart' AND status = 'succeeded'")[0][0]
              == trials, 30, "every child to succeed")
    assert rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE step = 'inner' "
                 "AND status = 'waiting'") == [(trials,)]

    async def race() -> list[int]:
        dbs = [Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
               for _ in range(4)]
        for db in dbs:
            await db.open()
        registry = Registry(flows)
        changed = []
        try:
            due = await waits.list_due(dbs[0])
            assert len(due) == trials
            for task in due:
                ended = ChildEnded(task["wait_child"], task["id"])
                gate = asyncio.Event()

                async def prompt(db: Database, ended: ChildEnded = ended,
                                 gate: asyncio.Event = gate) -> bool:
                    row = await db.one("task_get_waiting_for_child_if_ended",
                                       id=ended.parent_task_id, child=ended.child_id)
                    assert row is not None  # every racer read it waiting before the gate
                    await gate.wait()
                    return await waits.wake_child_step(db, registry, row) is not None

                async def sweep(db: Database, ended: ChildEnded = ended,
                                gate: asyncio.Event = gate) -> bool:
                    [row] = [r for r in await waits.list_due(db)
                             if r["id"] == ended.parent_task_id]
                    await gate.wait()
                    return await waits.wake_child_step(db, registry, row) is not None

                racers = [asyncio.create_task(prompt(dbs[0])), asyncio.create_task(prompt(dbs[1])),
                          asyncio.create_task(sweep(dbs[2])), asyncio.create_task(sweep(dbs[3]))]
                await asyncio.sleep(0.1)
                gate.set()
                changed.append(sum(await asyncio.gather(*racers)))
        finally:
            for db in dbs:
                await db.close()
        return changed

    assert asyncio.run(race()) == [1] * trials
    with running_worker(app, **SLOW_PASS):
        results = [h.wait(timeout=30) for h in handles]
    assert [r.output for r in results] == [{"middle": {"leaf": n}} for n in range(trials)]
    assert rows(db_url, "SELECT count(*), count(DISTINCT execution_id) FROM konduit_outputs "
                 "WHERE step = 'inner'") == [(trials, trials)]
    assert rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE step = 'wrap'") == [(trials,)]


def test_a_child_whose_key_function_never_returns_fails_the_step_and_the_worker_runs_on(
        make_app, monkeypatch):
    """The child's start runs the child workflow's fair_by= (user code) when the parent's step
    arms: on the worker's loop, one that never returned held the worker for good."""
    monkeypatch.setattr(starts, "START_CODE_SECONDS", 0.5)
    release = threading.Event()

    def stuck_fair(value: dict[str, object]) -> str:
        if value.get("stuck"):
            release.wait(120)  # far beyond the test: only the time limit ends the wait here
        return "k"

    child = konduit.Workflow("stuck-child", version=1, fair_by=stuck_fair)
    child.step(name="work")(lambda ctx: ctx.input)
    parent = konduit.Workflow("stuck-parent", version=1)
    parent.subworkflow(name="sub", workflow="stuck-child", input=lambda ctx: ctx.input)
    app = make_app(child, parent)
    try:
        with running_worker(app, poll_interval=0.1):
            stuck = app.start("stuck-parent", input={"stuck": True})
            with pytest.raises(konduit.ExecutionFailed) as info:
                stuck.wait(timeout=30)
            good = app.start("stuck-parent", input={"n": 1})
            assert good.wait(timeout=30).status == "succeeded"
        assert not release.is_set()  # the stuck call still blocked: nothing waited for it
        assert "could not start child workflow 'stuck-child'" in info.value.result.error
        assert "did not return within 0.5 s" in info.value.result.error
    finally:
        release.set()
