"""The virtual test clock (konduit.testing.run(..., clock="virtual"), docs/testing.md): a 45 s
adaptive deadline on a hung handler, a 10-minute approval timeout with its fallback and a week
of a daily schedule run in seconds, on real PostgreSQL with a real worker; the same workflows
with short durations pass on the real clock. No test here times itself: the clock's speed is
reported by running this file (pytest --durations)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Literal

import psycopg
import pydantic
import pytest

import konduit
import konduit.testing
from konduit.core import clock as core_clock
from konduit.db.arrays import with_array_literals
from konduit.db.queries import q
from konduit.engine.transitions import claim_params
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

FAST = {"maintenance_interval": 0.3}


# -- the three workflows, with their durations as parameters ------------------------------------

def hung_step_workflow(name: str, ceiling: str, released: threading.Event,
                       started: threading.Event) -> konduit.Workflow:
    """A step whose handler hangs (a sync thread that ignores its deadline) under an adaptive
    deadline; its history is thin, so the budget is the ceiling."""
    wf = konduit.Workflow(name, version=1)

    @wf.step(deadline=konduit.Deadline.adaptive(factor=1.5, quantile=0.99, window="7d",
                                                floor="0.1s", ceiling=ceiling),
             required=False, fallback=lambda ctx: {"image": "fallback.png"})
    def cover(ctx):
        started.set()
        released.wait(120)  # hung: only the end of the test lets the thread go
        return {"image": "late.png"}

    @wf.step(after=[cover])
    def publish(ctx):
        return {"cover": ctx.upstream.get("cover"), "outcome": ctx.outcomes["cover"]}

    return wf


class Approval(pydantic.BaseModel):
    """What a reviewer answers."""

    decision: Literal["approve", "reject"] = pydantic.Field(description="Approve or reject")


def approval_workflow(name: str, deadline: str) -> konduit.Workflow:
    """A wait for a person's answer, with a time limit and a fallback answer."""
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def submit(ctx):
        return {"claim": ctx.input["claim"]}

    approve = wf.wait_for_input("approve", model=Approval, after=[submit], deadline=deadline,
                                fallback=lambda ctx: {"decision": "reject", "by": "nobody"})

    @wf.step(after=[approve])
    def book(ctx):
        return {"answer": ctx.upstream["approve"], "outcome": ctx.outcomes["approve"]}

    return wf


def scheduled_workflow(name: str, every: str, ticks: list[datetime]) -> konduit.Workflow:
    """A schedule ``every``; its handler records each tick it runs for."""
    wf = konduit.Workflow(name, version=1)
    lock = threading.Lock()

    @wf.step()
    def report(ctx):
        with lock:
            ticks.append(ctx.scheduled_at)
        return {"tick": ctx.scheduled_at.isoformat()}

    wf.schedule(every=every, missed="all")
    return wf


def assert_each_tick_once(ticks: list[datetime], n: int, step: timedelta) -> None:
    """The first ``n`` ticks follow each other by ``step``, and no tick ran twice."""
    assert len(set(ticks)) == len(ticks), f"a tick ran twice: {sorted(ticks)}"
    first = sorted(ticks)[:n]
    assert len(first) == n
    assert [b - a for a, b in pairwise(first)] == [step] * (n - 1)


# -- on the virtual clock ----------------------------------------------------------------------

# The three long ones run on the suite's reused databases (konduit.testing.virtual_clock and a
# worker thread); the tests further down use the one-call form, run(..., clock="virtual").

def test_a_45_second_adaptive_deadline_fires_on_a_hung_handler_at_once(make_app):
    released, started = threading.Event(), threading.Event()
    app = make_app(hung_step_workflow("hung-virtual", "45s", released, started))
    try:
        with konduit.testing.virtual_clock(app), running_worker(app, **FAST):
            handle = app.start("hung-virtual", input={})
            assert started.wait(30), "the handler never started"
            # A running handler holds the clock: its deadline comes when the test moves it.
            assert konduit.testing.clock_of(app).offset == 0
            konduit.testing.advance(app, "45s")
            result = handle.wait(timeout=30)
            assert konduit.testing.clock_of(app).offset >= 45
        assert result.output["outcome"] == "degraded"
        assert result.output["cover"] == {"image": "fallback.png"}
    finally:
        released.set()


def test_a_10_minute_approval_timeout_falls_back_by_itself(make_app):
    app = make_app(approval_workflow("approve-virtual", "10m"))
    with konduit.testing.virtual_clock(app), running_worker(app, **FAST):
        began = konduit.testing.clock_of(app).now()
        result = app.start("approve-virtual", input={"claim": 1}).wait(timeout=30)
        moved = konduit.testing.clock_of(app).now() - began
    assert result.output == {"answer": {"decision": "reject", "by": "nobody"},
                             "outcome": "degraded"}
    assert moved >= timedelta(minutes=10)


def test_an_answer_before_the_time_limit_wins_while_the_clock_is_paused():
    wf = approval_workflow("approve-paused", "10m")
    with konduit.testing.run([wf], clock="virtual", **FAST) as app:
        clock = konduit.testing.clock_of(app)
        with clock.paused():
            handle = app.start("approve-paused", input={"claim": 2})
            until(lambda: [i for i in app.inbox() if i.execution_id == handle.id],
                  what="the inbox row")
            clock.advance("9m")
            app.answer(handle.id, "approve", {"decision": "approve"})
            result = handle.wait(timeout=30)
    assert result.output == {"answer": {"decision": "approve"}, "outcome": "succeeded"}


def test_a_week_of_a_daily_schedule_runs_each_tick_exactly_once(make_app):
    ticks: list[datetime] = []
    app = make_app(scheduled_workflow("daily-virtual", "1d", ticks))
    with konduit.testing.virtual_clock(app), running_worker(app, **FAST):
        clock = konduit.testing.clock_of(app)
        began = clock.now()
        until(lambda: len(ticks) >= 7, what="seven daily ticks", timeout=60)
        with clock.paused():
            until(lambda: not [e for e in app.list(workflow="daily-virtual")
                               if e.status not in ("succeeded",)],
                  what="the ticks' executions to end")
            executions = app.list(workflow="daily-virtual", limit=1000)
    assert_each_tick_once(ticks, 7, timedelta(days=1))
    assert sorted(ticks)[0] > began  # nothing from before the block
    assert len(executions) == len(ticks)


def test_a_back_off_is_skipped_and_the_retry_runs_once():
    wf = konduit.Workflow("backoff-virtual", version=1)
    calls: list[int] = []

    @wf.step(retry=konduit.Retry(max_attempts=3, backoff="fixed", base="1h", cap="1h",
                               jitter=False))
    def flaky(ctx):
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return "done"

    with konduit.testing.run([wf], clock="virtual", **FAST) as app:
        result = app.start("backoff-virtual", input={}).wait(timeout=30)
        offset = konduit.testing.clock_of(app).offset
    assert result.output == "done"
    assert calls == [1, 2, 3]
    assert offset >= 2 * 3600 - 1  # run_at counts from its transaction's start


def test_the_clock_reaches_the_database_and_python_alike_and_only_forward():
    wf = konduit.Workflow("noop-virtual", version=1)

    @wf.step()
    def noop(ctx):
        return None

    with konduit.testing.run([wf], clock="virtual", auto_skip=False, **FAST) as app:
        clock = konduit.testing.clock_of(app)
        assert core_clock.installed() is clock.python
        clock.advance(timedelta(days=2))
        with psycopg.connect(app.database_url) as conn:
            row = conn.execute("SELECT konduit_now() - now(), konduit_clock_timestamp()"
                               " - clock_timestamp()").fetchone()
        assert row[0] == timedelta(days=2)
        assert abs(row[1] - timedelta(days=2)) < timedelta(seconds=1)
        assert abs(core_clock.now() - datetime.now(UTC) - timedelta(days=2)) < timedelta(seconds=1)
        with pytest.raises(ValueError, match="only moves forward"):
            clock.advance(timedelta(seconds=-1))
    assert core_clock.installed() is None


def test_a_replaced_clock_function_reaches_statements_prepared_before(db_url):
    """PostgreSQL invalidates cached plans that inlined a function when it is replaced: a
    statement psycopg prepared on the real clock reads the virtual one after the install."""
    with psycopg.connect(db_url, autocommit=True, prepare_threshold=0) as conn:
        ask = "SELECT konduit_now() - now() AS shift WHERE %s::int = 1"
        for _ in range(7):  # prepared, and past the custom plans to the generic one
            assert conn.execute(ask, (1,), prepare=True).fetchone()[0] == timedelta(0)
        with psycopg.connect(db_url, autocommit=True) as other:
            other.execute(q("clock_virtual_install"))
            other.execute(q("clock_advance_by"), {"seconds": 3600})
        try:
            assert conn.execute(ask, (1,), prepare=True).fetchone()[0] == timedelta(hours=1)
        finally:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute(q("clock_virtual_remove"))
        assert conn.execute(ask, (1,), prepare=True).fetchone()[0] == timedelta(0)


def test_in_production_the_clock_functions_are_inlined_to_plain_now(db_url):
    """The claim's generic plan names now() and clock_timestamp(), never the konduit_*
    functions: outside a test they cost nothing (and the plan is the one of before)."""
    params = with_array_literals(claim_params(["default"], ["wf"], 8, 30.0, "w1", 0))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (VERBOSE, COSTS OFF) " + q("task_claim_batch"), params).fetchall())
    assert "konduit_now" in q("task_claim_batch") or "konduit_clock" in q("task_claim_batch")
    assert "konduit_now" not in plan and "konduit_clock_timestamp" not in plan
    assert "now()" in plan or "clock_timestamp()" in plan


# -- the same workflows on the real clock --------------------------------------------------------

def test_real_clock_a_short_adaptive_deadline_fires_on_a_hung_handler():
    released, started = threading.Event(), threading.Event()
    wf = hung_step_workflow("hung-real", "0.5s", released, started)
    try:
        with konduit.testing.run([wf], **FAST) as app:
            result = app.start("hung-real", input={}).wait(timeout=30)
        assert result.output["outcome"] == "degraded"
        assert result.output["cover"] == {"image": "fallback.png"}
    finally:
        released.set()


def test_real_clock_a_short_approval_timeout_falls_back():
    wf = approval_workflow("approve-real", "1s")
    with konduit.testing.run([wf], **FAST) as app:
        result = app.start("approve-real", input={"claim": 1}).wait(timeout=30)
    assert result.output == {"answer": {"decision": "reject", "by": "nobody"},
                             "outcome": "degraded"}


def test_real_clock_a_one_second_schedule_runs_each_tick_exactly_once():
    ticks: list[datetime] = []
    wf = scheduled_workflow("every-second-real", "1s", ticks)
    with konduit.testing.run([wf], **FAST):
        until(lambda: len(ticks) >= 3, what="three ticks", timeout=60)
    assert_each_tick_once(ticks, 3, timedelta(seconds=1))


def test_every_statement_reads_the_time_through_the_clock_functions():
    """A statement that read now() itself would not follow the virtual clock: every query file
    but the ones kept on the server's own clock (migrations, replicas, the clock's own) reads
    the time through konduit_now() and its siblings (comments aside)."""
    import re
    from importlib import resources

    real = re.compile(r"(?<![a-z_])(now|clock_timestamp|statement_timestamp|"
                      r"transaction_timestamp)\s*\(\)|\bcurrent_timestamp\b|\blocaltimestamp\b",
                      re.IGNORECASE)
    kept = {"migrations.sql", "replicas.sql", "schema.sql", "clock.sql"}
    found = []
    for path in resources.files("konduit.db").joinpath("sql").iterdir():
        if not path.name.endswith(".sql") or path.name in kept:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("--", 1)[0]
            if real.search(code):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "read the time through konduit_now() and its siblings:\n" + "\n".join(found)
