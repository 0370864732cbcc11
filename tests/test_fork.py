"""Fork (``app.fork``): a new execution that copies the outputs of the steps ``from_step``
depends on from its origin and runs the rest, each join firing exactly once; and what it
refuses, naming the thing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import konduit
from konduit.core.repair import ancestors, plan_fork
from tests.support.db import rows
from tests.support.workers import running_worker

FAST = konduit.Retry(max_attempts=1)


def _diamond(calls: dict[str, int], broken: dict[str, bool] | None = None) -> konduit.Workflow:
    """root -> a, b -> join; ``calls`` counts each handler's calls (under a lock: a worker runs
    a and b at once)."""
    wf = konduit.Workflow("forkable", version=1)
    lock = threading.Lock()
    broken = broken if broken is not None else {}

    def called(name: str) -> None:
        with lock:
            calls[name] = calls.get(name, 0) + 1

    @wf.step()
    def root(ctx: konduit.Context) -> dict[str, Any]:
        called("root")
        return {"n": ctx.input["n"]}

    @wf.step(after=[root], retry=FAST)
    def a(ctx: konduit.Context) -> int:
        called("a")
        if broken.get("a"):
            raise konduit.NonRetryableError("a is broken")
        return ctx.upstream["root"]["n"] + ctx.input["n"] * 10

    @wf.step(after=[root])
    def b(ctx: konduit.Context) -> int:
        called("b")
        return ctx.upstream["root"]["n"] * 2

    @wf.step(after=[a, b])
    def join(ctx: konduit.Context) -> dict[str, int]:
        called("join")
        return {"a": ctx.upstream["a"], "b": ctx.upstream["b"]}

    return wf


def _link(url: str, eid: object) -> tuple[Any, Any]:
    [(origin, step)] = rows(url, "SELECT forked_from, forked_at_step FROM konduit_executions "
                            "WHERE id = %s", eid)
    return origin, step


def _finished_origin(app: konduit.App, calls: dict[str, int]) -> konduit.ExecutionHandle:
    h = app.start("forkable", input={"n": 1})
    assert h.wait(timeout=30).output == {"a": 11, "b": 2}
    calls.clear()
    return h


def test_fork_from_a_branch_copies_its_ancestors_and_runs_the_rest_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    app = make_app(_diamond(calls))
    with running_worker(app, concurrency=4):
        origin = _finished_origin(app, calls)
        forked = app.fork(origin.id, from_step="a")
        result = forked.wait(timeout=30)
    assert forked.id != origin.id
    assert result.output == {"a": 11, "b": 2}
    # root is copied (not run); a, b (not an ancestor of a) and the join run once each.
    assert calls == {"a": 1, "b": 1, "join": 1}
    assert result.outcomes == {"root": "succeeded", "a": "succeeded", "b": "succeeded",
                               "join": "succeeded"}
    assert _link(db_url, forked.id) == (origin.id, "a")
    assert _link(db_url, origin.id) == (None, None)
    [(version,)] = rows(db_url, "SELECT workflow_version FROM konduit_executions WHERE id = %s",
                        forked.id)
    assert version == 1
    # One task per step, the join's included: it fired exactly once.
    assert sorted(rows(db_url, "SELECT step, count(*) FROM konduit_tasks WHERE execution_id = %s "
                       "GROUP BY step", forked.id)) == [("a", 1), ("b", 1), ("join", 1),
                                                        ("root", 1)]
    # The origin is untouched.
    assert app.status(origin.id).output == {"a": 11, "b": 2}


def test_fork_from_the_join_runs_only_the_join_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    app = make_app(_diamond(calls))
    with running_worker(app, concurrency=4):
        origin = _finished_origin(app, calls)
        forked = app.fork(origin.id, from_step="join")
        assert forked.wait(timeout=30).output == {"a": 11, "b": 2}
    assert calls == {"join": 1}
    [(pending, fired_once)] = rows(
        db_url, "SELECT e.steps_pending, (SELECT count(*) FROM konduit_tasks t "
        "WHERE t.execution_id = e.id AND t.step = 'join') FROM konduit_executions e "
        "WHERE e.id = %s", forked.id)
    assert (pending, fired_once) == (0, 1)
    # The copied outputs are the origin's, under the same content hashes.
    assert rows(db_url, "SELECT step, content_hash FROM konduit_outputs WHERE execution_id = %s "
                "AND step <> 'join' ORDER BY step", forked.id) == rows(
        db_url, "SELECT step, content_hash FROM konduit_outputs WHERE execution_id = %s "
        "AND step <> 'join' ORDER BY step", origin.id)


def test_fork_with_a_new_input_keeps_the_copied_outputs_made_from_the_old_one(
        make_app: Callable[..., konduit.App]) -> None:
    calls: dict[str, int] = {}
    app = make_app(_diamond(calls))
    with running_worker(app, concurrency=4):
        origin = _finished_origin(app, calls)
        from_a = app.fork(origin.id, from_step="a", input={"n": 5})
        # root's output ({"n": 1}) is copied: a reads it, and the new input.
        assert from_a.wait(timeout=30).output == {"a": 51, "b": 2}
        from_root = app.fork(origin.id, from_step="root", input={"n": 5})
        assert from_root.wait(timeout=30).output == {"a": 55, "b": 10}
    assert app.status(from_a.id).output == {"a": 51, "b": 2}
    assert calls == {"a": 2, "b": 2, "join": 2, "root": 1}


def test_fork_of_a_failed_execution_from_the_failed_step(
        make_app: Callable[..., konduit.App]) -> None:
    calls: dict[str, int] = {}
    broken = {"a": True}
    app = make_app(_diamond(calls, broken))
    with running_worker(app, concurrency=4):
        origin = app.start("forkable", input={"n": 1})
        with pytest.raises(konduit.ExecutionFailed):
            origin.wait(timeout=30)
        # The join's upstream a failed: a fork from the join is refused, naming a.
        with pytest.raises(konduit.KonduitError, match="upstream step 'a' is failed") as refused:
            app.fork(origin.id, from_step="join")
        assert refused.value.field == "from_step"
        broken["a"] = False
        calls.clear()
        assert app.fork(origin.id, from_step="a").wait(timeout=30).output == {"a": 11, "b": 2}
    assert calls == {"a": 1, "b": 1, "join": 1}


def test_fork_refuses_an_unknown_step_and_an_unknown_execution_writing_nothing(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    app = make_app(_diamond(calls))
    origin = app.start("forkable", input={"n": 1})
    with pytest.raises(konduit.KonduitError, match="no step 'nope' to fork from") as refused:
        app.fork(origin.id, from_step="nope")
    assert refused.value.field == "from_step"
    with pytest.raises(konduit.ExecutionNotFound):
        app.fork("0190a000-0000-7000-8000-000000000000", from_step="a")
    with pytest.raises(konduit.KonduitError, match="from_step"):
        app.fork(origin.id, from_step="")
    # An origin still running may be forked from a root: nothing is copied then.
    assert rows(db_url, "SELECT count(*) FROM konduit_executions") == [(1,)]
    forked = app.fork(origin.id, from_step="root")
    assert _link(db_url, forked.id) == (origin.id, "root")


def _mapped(calls: dict[str, int]) -> konduit.Workflow:
    """root -> square (a map over root's items) -> total."""
    wf = konduit.Workflow("forkable-map", version=1)
    lock = threading.Lock()

    def called(name: str) -> None:
        with lock:
            calls[name] = calls.get(name, 0) + 1

    @wf.step()
    def root(ctx: konduit.Context) -> list[int]:
        called("root")
        return [1, 2, 3, 4]

    @wf.map(after=[root], over=lambda out: out)
    def square(ctx: konduit.Context) -> int:
        called("square")
        return int(ctx.item) ** 2

    @wf.step(after=[square])
    def total(ctx: konduit.Context) -> int:
        called("total")
        return sum(ctx.upstream["square"]) + ctx.input.get("bonus", 0)

    return wf


def test_fork_after_a_map_copies_every_item(make_app: Callable[..., konduit.App],
                                            db_url: str) -> None:
    calls: dict[str, int] = {}
    app = make_app(_mapped(calls))
    with running_worker(app, concurrency=4):
        origin = app.start("forkable-map", input={})
        assert origin.wait(timeout=30).output == 30
        calls.clear()
        forked = app.fork(origin.id, from_step="total", input={"bonus": 100})
        assert forked.wait(timeout=30).output == 130
        again = app.fork(origin.id, from_step="square")
        assert again.wait(timeout=30).output == 30
    assert calls == {"total": 2, "square": 4}
    assert rows(db_url, "SELECT count(*) FROM konduit_outputs WHERE execution_id = %s "
                "AND step = 'square'", forked.id) == [(4,)]
    assert rows(db_url, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                "AND step = 'total'", forked.id) == [(1,)]


def test_client_without_code_forks_from_the_registered_definition(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    calls: dict[str, int] = {}
    app = make_app(_diamond(calls))
    with running_worker(app, concurrency=4):
        origin = _finished_origin(app, calls)
        with konduit.Client(db_url) as client:
            forked = client.fork(origin.id, from_step="b")
            assert forked.wait(timeout=30).output == {"a": 11, "b": 2}
    assert calls == {"a": 1, "b": 1, "join": 1}  # only root is an ancestor of b
    assert _link(db_url, forked.id) == (origin.id, "b")


def test_plan_fork_copies_ancestors_not_earlier_steps() -> None:
    spec = _diamond({}).spec
    assert ancestors(spec, "join") == {"root", "a", "b"}
    assert ancestors(spec, "b") == {"root"}
    ok = {"root": "succeeded", "a": "succeeded", "b": "degraded", "join": "succeeded"}
    planned = plan_fork(spec, ok, {}, "b")
    assert planned.copied == ("root",)
    assert set(planned.plan.rerun) == {"a", "b", "join"}
    assert set(planned.plan.start) == {"a", "b"}
    assert planned.plan.states["join"].up_pending == 2
    planned = plan_fork(spec, ok, {}, "join")
    assert planned.plan.rerun == ("join",) and planned.plan.start == ("join",)
    assert planned.plan.states["join"].up_ok == 2
