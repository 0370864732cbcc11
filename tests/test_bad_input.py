"""Bad input gets a clear konduit error, never a hang or a raw driver error.

Unknown workflows, payloads that are not JSON, outputs that cannot be stored, reused idempotency
keys, conflicting definitions, and a database that was never migrated.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

import konduit
from konduit.engine import maps
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

WAIT = 30.0
FAIL_WAIT = 10.0
"""For executions the engine ends within a second; a hang shows up as a TimeoutError."""


def one_step(name: str, handler: Any, **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name=options.pop("step", handler.__name__), **options)(handler)
    return wf


def noop(ctx):
    return ctx.input




def test_every_public_exception_derives_from_konduit_error():
    errors = [
        konduit.WorkflowNotFound,
        konduit.PayloadError,
        konduit.IdempotencyConflict,
        konduit.WorkflowVersionConflict,
        konduit.SchemaOutdated,
        konduit.ExecutionFailed,
        konduit.ExecutionNotFound,
        konduit.WorkflowDefinitionError,
        konduit.DatabaseError,
        konduit.DatabaseUnavailable,
        konduit.NonRetryableError,
    ]
    for exc in errors:
        assert issubclass(exc, konduit.KonduitError), exc
    exported = [getattr(konduit, n) for n in konduit.__all__]
    for obj in exported:
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, konduit.KonduitError), obj


def test_unknown_workflow_is_named(make_app):
    app = make_app(one_step("known", noop))
    with pytest.raises(konduit.WorkflowNotFound) as info:
        app.start("no-such-workflow", input=1)
    assert "no-such-workflow" in str(info.value)
    assert "known" in str(info.value)  # and what is registered instead
    with pytest.raises(konduit.WorkflowNotFound) as info:
        app.start("known", version=7)
    assert "known" in str(info.value) and "7" in str(info.value)
    assert app.list() == []


@pytest.mark.parametrize(
    "bad_input",
    [{1, 2}, object(), {"when": b"bytes"}, float("nan"), {"nested": [1, {"deep": {3}}]}],
    ids=["set", "object", "bytes", "nan", "nested-set"],
)
def test_non_json_input_is_refused_at_start(make_app, bad_input):
    app = make_app(one_step("takes-input", noop))
    with pytest.raises(konduit.PayloadError) as info:
        app.start("takes-input", input=bad_input)
    message = str(info.value)
    assert "input" in message and "takes-input" in message
    assert "not JSON-serializable" in message
    assert isinstance(info.value, konduit.KonduitError)
    assert app.list() == []


def test_input_that_postgres_cannot_store_is_a_payload_error(make_app):
    """JSON with a NUL character passes json.dumps, but jsonb refuses \\u0000: that must be a
    PayloadError at start, not a raw DatabaseError (a regression test)."""
    app = make_app(one_step("nul-input", noop))
    with pytest.raises(konduit.PayloadError) as info:
        app.start("nul-input", input={"text": "a\x00b"})
    assert "input" in str(info.value)


def test_non_json_output_dead_letters_the_task_at_once(make_app, db_url):
    calls: list[int] = []

    def returns_a_set(ctx):
        calls.append(ctx.attempt)
        return {"tags": {"a", "b"}}

    app = make_app(one_step("bad-output", returns_a_set, retry=konduit.Retry(max_attempts=3)))
    handle = app.start("bad-output")
    with running_worker(app, concurrency=1), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=WAIT)

    assert info.value.result.status == "failed"
    assert info.value.result.outcomes == {"returns_a_set": "failed"}
    assert calls == [1]  # not retried: the same code would return the same thing
    dead = app.dead_letters()
    assert [(d.execution_id, d.step, d.attempt) for d in dead] == [
        (handle.id, "returns_a_set", 1)
    ]
    assert "not JSON-serializable" in dead[0].error
    assert "returns_a_set" in dead[0].error
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT a.attempt, a.outcome, a.error FROM konduit_attempts a "
            "JOIN konduit_tasks t ON t.id = a.task_id WHERE t.execution_id = %s",
            (handle.id,),
        ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(1, "failed")]
    assert "not JSON-serializable" in rows[0][2]


def test_output_that_postgres_cannot_store_fails_the_task(make_app):
    """An output jsonb refuses used to leave the completion retrying forever while heartbeats
    kept the lease alive: the execution never ended (a regression test)."""
    def returns_nul(ctx):
        return {"text": "a\x00b"}

    app = make_app(one_step("nul-output", returns_nul, retry=konduit.Retry(max_attempts=3)))
    handle = app.start("nul-output")
    with running_worker(app, concurrency=1, shutdown_grace=0.5):
        with pytest.raises(konduit.ExecutionFailed) as info:
            handle.wait(timeout=FAIL_WAIT)
        assert info.value.result.outcomes == {"returns_nul": "failed"}


def test_map_over_that_fails_fails_the_execution_naming_the_map_step(make_app):
    wf = konduit.Workflow("bad-map", version=1)

    @wf.step()
    def source(ctx):
        return {"items": ctx.input}

    @wf.map(after=[source], over=lambda out: out["items"])
    def each(ctx):
        return ctx.item

    app = make_app(wf)
    not_iterable = app.start("bad-map", input=None)
    mixed_items = app.start("bad-map", input=[1, "x", 3.5])
    good = app.start("bad-map", input=[1, 2])
    with running_worker(app, concurrency=2):
        assert good.wait(timeout=WAIT).output == [1, 2]
        with pytest.raises(konduit.ExecutionFailed) as info:
            not_iterable.wait(timeout=WAIT)
        assert "'each'" in info.value.result.error
        assert "TypeError" in info.value.result.error
    # JSON-able items of any kind are fine: the items themselves are only stored, not typed.
    assert mixed_items.status().status == "succeeded"
    assert mixed_items.status().output == [1, "x", 3.5]


def test_map_over_that_never_returns_fails_its_execution_and_the_worker_runs_on(
        make_app, monkeypatch):
    """over() runs inside a completion round: unbounded, it held every later outcome of the
    worker (another execution's map did not finish in 50 s)."""
    monkeypatch.setattr(maps, "MAP_OVER_SECONDS", 0.5)
    release = threading.Event()
    wf = konduit.Workflow("stuck-map", version=1)

    @wf.step()
    def source(ctx):
        return ctx.input

    def over(out):
        if out.get("stuck"):
            release.wait(120)  # far beyond the test: only the time limit ends the wait here
        return out["items"]

    @wf.map(after=[source], over=over)
    def each(ctx):
        return ctx.item

    app = make_app(wf)
    try:
        stuck = app.start("stuck-map", input={"stuck": True, "items": [1]})
        with running_worker(app, concurrency=2):
            with pytest.raises(konduit.ExecutionFailed) as info:
                stuck.wait(timeout=WAIT)
            good = app.start("stuck-map", input={"items": [1, 2]})
            assert good.wait(timeout=WAIT).output == [1, 2]
        assert not release.is_set()  # the stuck call still blocked: nothing waited for it
        assert "map step 'each'" in info.value.result.error
        assert "did not return within 0.5 s" in info.value.result.error
    finally:
        release.set()


def test_map_items_that_are_not_json_fail_the_execution(make_app):
    wf = konduit.Workflow("map-non-json", version=1)

    @wf.step()
    def source(ctx):
        return None

    @wf.map(after=[source], over=lambda out: [1, {2, 3}])
    def each(ctx):
        return ctx.item

    app = make_app(wf)
    handle = app.start("map-non-json")
    with running_worker(app, concurrency=1), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=WAIT)
    error = info.value.result.error
    assert "'each'" in error and "item 1" in error and "not JSON-serializable" in error


def test_idempotency_key_reused_with_a_different_input(make_app):
    app = make_app(one_step("idem-conflict", noop))
    first = app.start("idem-conflict", input={"amount": 10}, idempotency_key="order-7")
    assert app.start("idem-conflict", input={"amount": 10}, idempotency_key="order-7").id == first.id
    with pytest.raises(konduit.IdempotencyConflict) as info:
        app.start("idem-conflict", input={"amount": 11}, idempotency_key="order-7")
    assert "order-7" in str(info.value)
    assert str(first.id) in str(info.value)
    assert isinstance(info.value, konduit.KonduitError)
    assert len(app.list()) == 1


def test_a_different_definition_under_the_same_version_is_refused(make_app):
    v1 = konduit.Workflow("pricing", version=1)

    @v1.step()
    def quote(ctx):
        return 1

    changed = konduit.Workflow("pricing", version=1)

    @changed.step(retry=konduit.Retry(max_attempts=9))
    def quote_again(ctx):
        return 2

    first = make_app(v1)
    first.start("pricing")
    second = make_app(changed)
    with pytest.raises(konduit.WorkflowVersionConflict) as info:
        second.start("pricing")
    assert "pricing" in str(info.value) and "version 1" in str(info.value)
    assert isinstance(info.value, konduit.KonduitError)
    # A worker of the conflicting deployment refuses to start, too.
    with pytest.raises(konduit.WorkflowVersionConflict):
        second.run_worker(concurrency=1, stop_after=10)
    # The registered definition is untouched, and a new version number is accepted.
    assert len(first.list()) == 1
    bumped = konduit.Workflow("pricing", version=2)
    bumped.step(name="quote")(quote_again)
    third = make_app(bumped)
    assert third.start("pricing").status().version == 2


def test_worker_refuses_an_unmigrated_database(empty_db_url):
    app = konduit.App([one_step("anything", noop)], database_url=empty_db_url)
    try:
        with pytest.raises(konduit.SchemaOutdated) as info:
            app.run_worker(concurrency=1, stop_after=10)
        assert "konduit db migrate" in str(info.value)
        assert isinstance(info.value, konduit.KonduitError)
        # A real URL is never migrated behind the operator's back: still no schema.
        with psycopg.connect(empty_db_url) as conn:
            (present,) = conn.execute(
                "SELECT to_regclass('konduit_schema_version') IS NOT NULL"
            ).fetchone()
        assert present is False
        # Starting an execution there is a konduit error too (not a raw driver error).
        with pytest.raises(konduit.KonduitError):
            app.start("anything")
    finally:
        app.close()


def test_unknown_execution_ids(make_app):
    app = make_app(one_step("ids", noop))
    missing = uuid.uuid4()
    for call in (app.status, app.cancel, lambda i: app.wait(i, timeout=1)):
        with pytest.raises(konduit.ExecutionNotFound):
            call(missing)
        with pytest.raises(konduit.ExecutionNotFound):
            call("not-a-uuid")


def test_handle_of_a_malformed_id_is_a_konduit_error(make_app):
    """App.handle once let uuid.UUID's ValueError escape (a regression test)."""
    app = make_app(one_step("handles", noop))
    with pytest.raises(konduit.ExecutionNotFound):
        app.handle("not-a-uuid")
