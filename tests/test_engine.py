"""The engine end to end: real worker, real PostgreSQL, one fresh database per test.

Shapes (chain, diamond, map of 0/1/50 items), join policies with a dead-lettered branch, retries
and the attempts they leave behind, cancellation, idempotency, and what ``list``/``status`` show.
Every wait is ``handle.wait(timeout=...)``; nothing synchronizes on sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import uuid4

import psycopg
import pytest

import konduit
from konduit.records import TaskRecord
from tests.support.payloads import opened
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

WAIT = 30.0
"""Timeout for executions expected to finish: only reached when something is broken."""

FAIL_WAIT = 10.0
"""Timeout for executions whose handlers raise. The engine ends them in well under a second; a
regression of the handler-exception path (a task abandoned until its 15 s lease expires) shows up
as a TimeoutError here instead of a slow pass."""


def quick(max_attempts: int = 1, **kwargs: Any) -> konduit.Retry:
    """A retry policy that keeps tests fast: 10 ms fixed-ish backoff, no jitter."""
    return konduit.Retry(max_attempts=max_attempts, base="10ms", cap="50ms", jitter=False, **kwargs)


def attempts_of(db_url: str, execution_id: Any) -> list[tuple[str, int, int, str | None, str | None]]:
    """(step, map_index, attempt, outcome, error) of every attempt of one execution (the error
    opened: under a codec it is sealed, docs/payload-codecs.md)."""
    with psycopg.connect(db_url) as conn:
        return [(*r[:4], opened(r[4])) for r in conn.execute(
            """
            SELECT t.step, t.map_index, a.attempt, a.outcome, a.error
            FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id
            WHERE t.execution_id = %s
            ORDER BY t.step, t.map_index, a.attempt
            """,
            (execution_id,),
        ).fetchall()]


def tasks_by_step(app: konduit.App, execution_id: Any) -> dict[str, list[TaskRecord]]:
    found: dict[str, list[TaskRecord]] = {}
    for row in app.tasks(execution_id):
        found.setdefault(row.step, []).append(row)
    return found


# -- shapes -------------------------------------------------------------------------------------


def test_linear_chain_passes_each_output_downstream(make_app):
    wf = konduit.Workflow("chain", version=1)
    seen: list[tuple[str, int, int, Any]] = []

    @wf.step()
    def first(ctx):
        seen.append((ctx.step, ctx.map_index, ctx.attempt, ctx.upstream))
        return ctx.input["n"] + 1

    @wf.step(after=[first])
    def second(ctx):
        seen.append((ctx.step, ctx.map_index, ctx.attempt, ctx.upstream))
        return ctx.upstream["first"] * 10

    @wf.step(after=[second])
    def third(ctx):
        seen.append((ctx.step, ctx.map_index, ctx.attempt, ctx.upstream))
        return {"total": ctx.upstream["second"], "outcomes": ctx.outcomes, "input": ctx.input}

    app = make_app(wf)
    handle = app.start("chain", input={"n": 4})
    with running_worker(app, concurrency=2):
        result = handle.wait(timeout=WAIT)

    assert result.status == "succeeded"
    assert result.id == handle.id
    assert result.output == {"total": 50, "outcomes": {"second": "succeeded"}, "input": {"n": 4}}
    assert result.outcomes == {"first": "succeeded", "second": "succeeded", "third": "succeeded"}
    assert result.error is None
    assert seen == [
        ("first", 0, 1, {}),
        ("second", 0, 1, {"first": 5}),
        ("third", 0, 1, {"second": 50}),
    ]
    tasks = app.tasks(handle.id)
    assert [(t.step, t.status, t.attempt) for t in tasks] == [
        ("first", "succeeded", 1),
        ("second", "succeeded", 1),
        ("third", "succeeded", 1),
    ]


def test_diamond_join_fires_once_with_both_branches(make_app):
    wf = konduit.Workflow("diamond", version=1)
    join_calls: list[dict[str, Any]] = []

    @wf.step()
    def top(ctx):
        return 3

    @wf.step(after=[top])
    def left(ctx):
        return ctx.upstream["top"] + 1

    @wf.step(after=[top])
    async def right(ctx):
        await asyncio.sleep(0.05)  # let the two branches finish at different moments
        return ctx.upstream["top"] * 2

    @wf.step(after=[left, right])
    def bottom(ctx):
        join_calls.append(dict(ctx.upstream))
        return {"sum": ctx.upstream["left"] + ctx.upstream["right"], "outcomes": ctx.outcomes}

    app = make_app(wf)
    handle = app.start("diamond", input=None)
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=WAIT)

    assert result.output == {"sum": 10, "outcomes": {"left": "succeeded", "right": "succeeded"}}
    assert join_calls == [{"left": 4, "right": 6}]
    tasks = tasks_by_step(app, handle.id)
    assert {s: len(rows) for s, rows in tasks.items()} == {"top": 1, "left": 1, "right": 1,
                                                            "bottom": 1}
    steps = {s.step: s for s in app.steps(handle.id)}
    assert steps["bottom"].status == "succeeded"
    assert steps["bottom"].up_pending == 0 and steps["bottom"].up_ok == 2
    assert steps["bottom"].straggler in {"left", "right"}


def test_several_final_steps_give_a_dict_keyed_by_step(make_app):
    wf = konduit.Workflow("two-sinks", version=1)

    @wf.step()
    def source(ctx):
        return "s"

    @wf.step(after=[source])
    def upper(ctx):
        return ctx.upstream["source"].upper()

    @wf.step(after=[source])
    def doubled(ctx):
        return ctx.upstream["source"] * 2

    @wf.step(after=[source])
    def nothing(ctx):
        return None

    app = make_app(wf)
    handle = app.start("two-sinks")
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=WAIT)
    assert result.output == {"upper": "S", "doubled": "ss", "nothing": None}


def test_sync_and_async_handlers_both_run(make_app):
    wf = konduit.Workflow("sync-async", version=1)
    threads: dict[str, str] = {}

    @wf.step()
    async def fetch(ctx):
        await asyncio.sleep(0.01)
        threads["fetch"] = threading.current_thread().name
        return {"from": "async", "input": ctx.input}

    @wf.step(after=[fetch])
    def transform(ctx):
        threads["transform"] = threading.current_thread().name
        return {"from": "sync", "got": ctx.upstream["fetch"]}

    @wf.step(after=[transform])
    async def finish(ctx):
        return [ctx.upstream["transform"]["from"], ctx.upstream["transform"]["got"]["from"]]

    app = make_app(wf)
    handle = app.start("sync-async", input=[1, 2])
    with running_worker(app, concurrency=2):
        result = handle.wait(timeout=WAIT)
    assert result.output == ["sync", "async"]
    assert result.outcomes == {"fetch": "succeeded", "transform": "succeeded",
                               "finish": "succeeded"}
    # A sync handler runs off the event loop, so it cannot block the other tasks.
    assert threads["transform"] != threads["fetch"]


@pytest.mark.parametrize("count", [0, 1, 50])
def test_map_step_fans_out_and_collects_in_item_order(make_app, count):
    wf = konduit.Workflow(f"map-{count}", version=1)
    join_calls: list[tuple[Any, Any]] = []

    @wf.step()
    def produce(ctx):
        return {"items": list(range(ctx.input))}

    @wf.step(after=[produce])
    def side(ctx):
        return "side"

    @wf.map(after=[produce], over=lambda out: out["items"])
    async def square(ctx):
        if ctx.item % 7 == 3:
            await asyncio.sleep(0.01)  # finish out of order
        return {"i": ctx.map_index, "sq": ctx.item * ctx.item}

    @wf.step(after=[square, side])
    def collect(ctx):
        join_calls.append((ctx.upstream["square"], ctx.outcomes))
        return [x["sq"] for x in ctx.upstream["square"]]

    app = make_app(wf)
    handle = app.start(wf.name, input=count)
    with running_worker(app, concurrency=8):
        result = handle.wait(timeout=WAIT)

    assert result.output == [i * i for i in range(count)]
    assert len(join_calls) == 1
    upstream, outcomes = join_calls[0]
    assert upstream == [{"i": i, "sq": i * i} for i in range(count)]
    assert outcomes == {"square": "succeeded", "side": "succeeded"}
    tasks = tasks_by_step(app, handle.id)
    assert sorted(t.map_index for t in tasks.get("square", [])) == list(range(count))
    assert len(tasks["collect"]) == 1
    steps = {s.step: s for s in app.steps(handle.id)}
    assert steps["square"].status == "succeeded"
    assert steps["square"].tasks_total == count
    assert steps["square"].tasks_ok == count


def test_join_waits_while_its_branches_have_not_run(make_app, db_url):
    """The empty group is not complete: with no worker, the join is 'waiting' and has no task."""
    wf = konduit.Workflow("not-yet", version=1)

    @wf.step()
    def a(ctx):
        return 1

    @wf.step()
    def b(ctx):
        return 2

    @wf.step(after=[a, b], join=konduit.Join.all_done())
    def join(ctx):
        return 3

    app = make_app(wf)
    handle = app.start("not-yet")
    result = app.status(handle.id)
    assert result.status == "running"
    assert result.outcomes == {"a": "active", "b": "active", "join": "waiting"}
    steps = {s.step: s for s in app.steps(handle.id)}
    assert steps["join"].up_pending == 2
    assert steps["join"].fired_at is None
    assert sorted(t.step for t in app.tasks(handle.id)) == ["a", "b"]
    with psycopg.connect(db_url) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s AND step = 'join'",
            (handle.id,),
        ).fetchone()
    assert n == 0
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0.2)


# -- failures and join policies -----------------------------------------------------------------


def _fan_with_bad_branch(name: str, join: konduit.Join | None, calls: list[Any]) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def start(ctx):
        return 10

    @wf.step(after=[start])
    def good(ctx):
        return ctx.upstream["start"] + 1

    @wf.step(after=[start])
    async def also_good(ctx):
        return ctx.upstream["start"] + 2

    @wf.step(after=[start], retry=quick(2))
    def bad(ctx):
        raise RuntimeError(f"bad branch exploded on attempt {ctx.attempt}")

    @wf.step(after=[good, also_good, bad], join=join)
    def gather(ctx):
        calls.append((dict(ctx.upstream), dict(ctx.outcomes)))
        return {"upstream": ctx.upstream, "outcomes": ctx.outcomes}

    return wf


def test_handler_exception_fails_the_attempt_with_its_error(make_app, db_url):
    """One step that raises, no retries: the attempt fails with the handler's own error (a
    regression once made every handler exception an internal error, lost until lease expiry)."""
    wf = konduit.Workflow("raises", version=1)

    @wf.step(retry=quick(1))
    def boom(ctx):
        raise ValueError("boom 42")

    app = make_app(wf)
    handle = app.start("raises")
    with running_worker(app, concurrency=1), pytest.raises(konduit.ExecutionFailed):
        handle.wait(timeout=FAIL_WAIT)
    assert attempts_of(db_url, handle.id)[0][3] == "failed"
    assert "ValueError: boom 42" in (attempts_of(db_url, handle.id)[0][4] or "")


def test_all_done_join_fires_with_the_successful_branches(make_app, db_url):
    calls: list[Any] = []
    wf = _fan_with_bad_branch("all-done", konduit.Join.all_done(), calls)
    app = make_app(wf)
    handle = app.start("all-done")
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=FAIL_WAIT)

    assert result.status == "succeeded"
    upstream, outcomes = calls[0]
    assert len(calls) == 1
    assert upstream == {"good": 11, "also_good": 12}
    assert outcomes == {"good": "succeeded", "also_good": "succeeded", "bad": "failed"}
    assert result.output == {"upstream": upstream, "outcomes": outcomes}
    assert result.outcomes["bad"] == "failed"
    assert result.outcomes["gather"] == "succeeded"

    dead = [d for d in app.dead_letters() if d.execution_id == handle.id]
    assert [(d.step, d.attempt, d.workflow_name) for d in dead] == [("bad", 2, "all-done")]
    assert "RuntimeError: bad branch exploded on attempt 2" in dead[0].error
    bad_attempts = [(a[2], a[3]) for a in attempts_of(db_url, handle.id) if a[0] == "bad"]
    assert bad_attempts == [(1, "retry"), (2, "failed")]


def test_all_succeeded_join_fails_the_execution_naming_the_branch(make_app):
    calls: list[Any] = []
    wf = _fan_with_bad_branch("all-succeeded", None, calls)  # the default join policy
    app = make_app(wf)
    handle = app.start("all-succeeded")
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=FAIL_WAIT)

    result = info.value.result
    assert result.status == "failed"
    assert result.id == handle.id
    assert "'bad'" in result.error
    assert "'bad'" in str(info.value)
    assert calls == []  # the join never ran
    assert result.outcomes["bad"] == "failed"
    assert result.outcomes["gather"] == "cancelled"
    assert "gather" not in tasks_by_step(app, handle.id)
    assert app.status(handle.id).status == "failed"


def test_retries_until_success_with_stable_idempotency_key(make_app, db_url):
    wf = konduit.Workflow("flaky", version=1)
    seen: list[tuple[int, str]] = []

    @wf.step(retry=quick(3))
    def flaky(ctx):
        seen.append((ctx.attempt, ctx.idempotency_key))
        if ctx.attempt < 3:
            raise ConnectionError(f"flaky attempt {ctx.attempt}")
        return {"attempt": ctx.attempt, "key": ctx.idempotency_key}

    @wf.step(after=[flaky])
    def after(ctx):
        return ctx.idempotency_key

    app = make_app(wf)
    handle = app.start("flaky")
    with running_worker(app, concurrency=2):
        result = handle.wait(timeout=FAIL_WAIT)

    assert result.status == "succeeded"
    assert [a for a, _ in seen] == [1, 2, 3]
    keys = {k for _, k in seen}
    assert len(keys) == 1, f"idempotency key changed across attempts: {seen}"
    (key,) = keys
    assert isinstance(result.output, str) and result.output != key  # each task has its own
    rows = [a for a in attempts_of(db_url, handle.id) if a[0] == "flaky"]
    assert [(a[2], a[3]) for a in rows] == [(1, "retry"), (2, "retry"), (3, "succeeded")]
    assert "ConnectionError: flaky attempt 1" in rows[0][4]
    assert "ConnectionError: flaky attempt 2" in rows[1][4]
    assert rows[2][4] is None
    assert tasks_by_step(app, handle.id)["flaky"][0].attempt == 3
    assert not [d for d in app.dead_letters() if d.execution_id == handle.id]


class PermanentError(konduit.NonRetryableError):
    pass


def test_non_retryable_errors_fail_at_the_first_attempt(make_app, db_url):
    calls: list[str] = []
    wf1 = konduit.Workflow("non-retryable-error", version=1)

    @wf1.step(retry=quick(5))
    def declined(ctx):
        calls.append("declined")
        raise PermanentError("card declined")

    wf2 = konduit.Workflow("non-retryable-type", version=1)

    @wf2.step(retry=quick(5, non_retryable=(ValueError,)))
    def parse(ctx):
        calls.append("parse")
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")  # a ValueError subclass

    app = make_app(wf1, wf2)
    h1 = app.start("non-retryable-error")
    h2 = app.start("non-retryable-type")
    with running_worker(app, concurrency=2):
        for handle, step, text in ((h1, "declined", "card declined"), (h2, "parse", "bad byte")):
            with pytest.raises(konduit.ExecutionFailed) as info:
                handle.wait(timeout=FAIL_WAIT)
            assert info.value.result.status == "failed"
            assert f"'{step}'" in info.value.result.error
            rows = attempts_of(db_url, handle.id)
            assert [(r[0], r[2], r[3]) for r in rows] == [(step, 1, "failed")]
            assert text in rows[0][4]
    assert sorted(calls) == ["declined", "parse"]


def test_a_raising_handler_never_takes_the_worker_down(make_app, db_url):
    """Handlers raising ordinary errors, SystemExit and KeyboardInterrupt run first on a
    one-slot worker; the execution started after them still succeeds on that same worker."""
    ran: list[str] = []
    workflows = []
    for name, exc in (
        ("raise-value", ValueError("plain error")),
        ("raise-system-exit", SystemExit(3)),
        ("raise-keyboard", KeyboardInterrupt()),
    ):
        wf = konduit.Workflow(name, version=1)

        def make(exc: BaseException, name: str):  # bind the loop variables
            if name == "raise-keyboard":
                async def explode(ctx):
                    ran.append(name)
                    raise exc
            else:
                def explode(ctx):
                    ran.append(name)
                    raise exc
            return explode

        wf.step(name="explode", retry=quick(1))(make(exc, name))
        workflows.append(wf)

    ok = konduit.Workflow("after-the-explosions", version=1)

    @ok.step()
    def fine(ctx):
        ran.append("fine")
        return "still here"

    app = make_app(*workflows, ok)
    bad = [app.start(wf.name) for wf in workflows]
    good = app.start("after-the-explosions")
    with running_worker(app, concurrency=1):
        assert good.wait(timeout=WAIT).output == "still here"
    assert ran == ["raise-value", "raise-system-exit", "raise-keyboard", "fine"]
    workers = {t.worker_id for h in [*bad, good] for t in app.tasks(h.id)}
    assert len(workers) == 1


# -- idempotency, cancel, list/status -----------------------------------------------------------


def test_same_idempotency_key_returns_the_same_execution(make_app, db_url):
    wf = konduit.Workflow("idem", version=1)

    @wf.step()
    def once(ctx):
        return ctx.input

    app = make_app(wf)
    first = app.start("idem", input={"a": 1, "b": [1, 2]}, idempotency_key="nightly-1")
    again = app.start("idem", input={"b": [1, 2], "a": 1}, idempotency_key="nightly-1")
    other = app.start("idem", input={"a": 1, "b": [1, 2]}, idempotency_key="nightly-2")
    unkeyed = [app.start("idem", input=1), app.start("idem", input=1)]
    assert again.id == first.id
    assert other.id != first.id
    assert unkeyed[0].id != unkeyed[1].id
    with psycopg.connect(db_url) as conn:
        (n,) = conn.execute("SELECT count(*) FROM konduit_executions").fetchone()
        (tasks,) = conn.execute(
            "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s", (first.id,)
        ).fetchone()
    assert n == 4
    assert tasks == 1


def test_concurrent_starts_with_one_idempotency_key_make_one_execution(make_app, db_url):
    wf = konduit.Workflow("idem-race", version=1)

    @wf.step()
    def once(ctx):
        return 1

    threads = 8
    apps = [make_app(wf) for _ in range(threads)]
    for app in apps:
        app.list(limit=1)  # open every pool first, so the barrier releases the starts together
    barrier = threading.Barrier(threads)
    ids: list[Any] = []
    errors: list[BaseException] = []

    def start(app: konduit.App) -> None:
        try:
            barrier.wait(timeout=10)
            ids.append(app.start("idem-race", input={"x": 1}, idempotency_key="same").id)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=start, args=(a,)) for a in apps]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    assert not errors, errors
    assert len(ids) == threads and len(set(ids)) == 1
    with psycopg.connect(db_url) as conn:
        (n,) = conn.execute("SELECT count(*) FROM konduit_executions").fetchone()
        (t,) = conn.execute("SELECT count(*) FROM konduit_tasks").fetchone()
    assert (n, t) == (1, 1)


def test_cancel_before_any_worker_claims_nothing_later(make_app, db_url):
    wf = konduit.Workflow("cancel-me", version=1)
    ran: list[Any] = []

    @wf.step()
    def root(ctx):
        ran.append(ctx.execution_id)
        return 1

    @wf.step(after=[root])
    def child(ctx):
        ran.append(ctx.execution_id)
        return 2

    app = make_app(wf)
    handle = app.start("cancel-me")
    assert app.status(handle.id).outcomes == {"root": "active", "child": "waiting"}
    assert app.cancel(handle.id) is True
    assert handle.cancel() is False  # already finished

    result = app.status(handle.id)
    assert result.status == "cancelled"
    assert result.finished_at is not None
    assert result.outcomes == {"root": "cancelled", "child": "cancelled"}
    with pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=WAIT)
    assert info.value.result.status == "cancelled"
    assert [(t.step, t.status, t.attempt) for t in app.tasks(handle.id)] == [
        ("root", "cancelled", 0)
    ]

    # A worker started afterwards: the later execution finishing proves it has been claiming
    # (ready tasks are claimed oldest first), and still nothing of the cancelled one ran.
    later = app.start("cancel-me")
    with running_worker(app, concurrency=2):
        assert later.wait(timeout=WAIT).status == "succeeded"
    assert ran == [later.id, later.id]
    assert [(t.step, t.status, t.attempt) for t in app.tasks(handle.id)] == [
        ("root", "cancelled", 0)
    ]
    assert attempts_of(db_url, handle.id) == []
    assert app.status(handle.id).status == "cancelled"


def test_list_and_status_show_what_happened(make_app):
    alpha = konduit.Workflow("alpha", version=2)

    @alpha.step()
    def a1(ctx):
        return {"alpha": ctx.input}

    beta = konduit.Workflow("beta", version=1)

    @beta.step()
    def b1(ctx):
        return "beta"

    @beta.step(after=[b1])
    def b2(ctx):
        return ctx.upstream["b1"] + "!"

    app = make_app(alpha, beta)
    e1 = app.start("alpha", input=1, idempotency_key="k1")
    e2 = app.start("beta")
    with running_worker(app, concurrency=2):
        e1.wait(timeout=WAIT)
        e2.wait(timeout=WAIT)
    e3 = app.start("alpha", input=3)
    app.cancel(e3.id)

    status = app.status(e1.id)
    assert status.id == e1.id
    assert (status.workflow, status.version, status.status) == ("alpha", 2, "succeeded")
    assert status.output == {"alpha": 1}
    assert status.outcomes == {"a1": "succeeded"}
    assert status.error is None
    assert status.finished
    assert status.created_at is not None and status.finished_at >= status.created_at
    assert e2.status().outcomes == {"b1": "succeeded", "b2": "succeeded"}
    assert e2.status().output == "beta!"

    listed = app.list()
    assert [r.id for r in listed] == [e3.id, e2.id, e1.id]  # newest first
    assert [(r.workflow, r.version, r.status) for r in listed] == [
        ("alpha", 2, "cancelled"), ("beta", 1, "succeeded"), ("alpha", 2, "succeeded")
    ]
    assert all(r.created_at is not None for r in listed)
    assert [r.id for r in app.list(workflow="alpha")] == [e3.id, e1.id]
    assert [r.id for r in app.list(status="succeeded")] == [e2.id, e1.id]
    assert [r.id for r in app.list(status="cancelled", workflow="alpha")] == [e3.id]
    assert app.list(status="failed") == []
    assert app.list(workflow="nope") == []
    assert [r.id for r in app.list(limit=1)] == [e3.id]

    with pytest.raises(konduit.ExecutionNotFound):
        app.status(uuid4())
