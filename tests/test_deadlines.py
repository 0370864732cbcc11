"""Seed 004: deadlines on every branch, fallbacks, optional branches, joins that fire on time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import psycopg
import pydantic
import pytest

import konduit
from konduit.engine.deadlines import MIN_SAMPLES, adaptive_budget
from tests.support.db import rows
from tests.support.load import scaled
from tests.support.payloads import opened
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

FAST = konduit.Retry(max_attempts=1)


def deadline_workflow(kind: str, sleep: float = 30.0) -> konduit.Workflow:
    wf = konduit.Workflow(f"deadline-{kind}", version=1)

    @wf.step()
    def start(ctx):
        return {"t0": time.time()}

    if kind == "async":

        @wf.step(after=[start], deadline="1s", retry=FAST,
                 fallback=lambda ctx: {"image": "fallback.png"})
        async def slow(ctx):
            await asyncio.sleep(sleep)
            return {"image": "real.png"}
    else:

        @wf.step(after=[start], deadline="1s", retry=FAST,
                 fallback=lambda ctx: {"image": "fallback.png"})
        def slow(ctx):
            time.sleep(sleep)
            return {"image": "real.png"}

    @wf.step(after=[start])
    def fast(ctx):
        return "ok"

    @wf.step(after=[slow, fast], join=konduit.Join.all_done())
    def publish(ctx):
        return {"image": ctx.upstream["slow"], "outcomes": ctx.outcomes, "at": time.time()}

    return wf


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_branch_past_its_deadline_degrades_and_the_join_fires_on_time(make_app, kind):
    wf = deadline_workflow(kind, sleep=30.0)
    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=20)
    out = result.output
    assert out["image"] == {"image": "fallback.png"}
    assert out["outcomes"]["slow"] == "degraded"
    assert result.outcomes["slow"] == "degraded"
    steps = {s.step: s for s in app.steps(handle.id)}
    waited = (steps["publish"].fired_at - steps["slow"].fired_at).total_seconds()
    # At the 1 s deadline: under 3 s idle, stretched by the measured overload up to 15 s; the
    # bug (waiting for the branch's 30 s sleep) is past both.
    bound = scaled(3.0, cap=15.0)
    assert 0.9 <= waited < bound, f"join fired {waited:.2f} s after the slow branch started"
    (error,) = rows(app.database_url,
                    "SELECT error FROM konduit_tasks WHERE execution_id = %s AND step = 'slow'",
                    handle.id)[0]
    assert "deadline exceeded" in str(opened(error))
    sources = rows(app.database_url,
                   "SELECT source FROM konduit_outputs WHERE execution_id = %s AND step = 'slow'",
                   handle.id)
    assert sources == [("fallback",)]


def test_without_fallback_the_branch_times_out(make_app):
    wf = konduit.Workflow("deadline-nofallback", version=1)

    @wf.step(deadline="500ms", retry=FAST)
    async def slow(ctx):
        await asyncio.sleep(30)

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=15)
    assert info.value.result.outcomes["slow"] == "timed_out"
    assert "timed_out" in (info.value.result.error or "")


def test_late_result_of_an_abandoned_sync_handler_is_kept_but_never_fires_again(make_app):
    release = threading.Event()
    wf = konduit.Workflow("late-result", version=1)

    @wf.step(deadline="500ms", retry=FAST, fallback=lambda ctx: "fallback", required=False)
    def optional(ctx):
        release.wait(30)
        return "late real result"

    @wf.step()
    def required(ctx):
        return "ok"

    @wf.step(after=[optional, required], join=konduit.Join.required())
    def publish(ctx):
        return ctx.upstream

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=15)
        assert result.output == {"optional": "fallback", "required": "ok"}
        release.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            late = [p.payload for p in app.payloads(handle.id) if p.source == "late"]
            if late:
                break
            time.sleep(0.1)
    assert late == ["late real result"]
    joins = rows(app.database_url,
                 "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s AND step = 'publish'",
                 handle.id)
    assert joins == [(1,)]
    assert app.status(handle.id).output == {"optional": "fallback", "required": "ok"}
    shown = {(p.step, p.source): p for p in app.payloads(handle.id)}
    assert shown[("optional", "late")].current is False
    assert shown[("optional", "fallback")].current is True
    status = subprocess.run(
        [sys.executable, "-m", "konduit.cli", "status", str(handle.id), "--json",
         "--database-url", app.database_url],
        capture_output=True, text=True, timeout=60, check=True,
    )
    late_shown = json.loads(status.stdout)["late_results"]
    assert [p["payload"] for p in late_shown] == ["late real result"]


def test_required_join_does_not_wait_for_a_slow_optional_branch_past_its_deadline(make_app):
    wf = konduit.Workflow("required-join", version=1)

    @wf.step(required=False, deadline="700ms", retry=FAST)
    async def optional_slow(ctx):
        await asyncio.sleep(30)

    @wf.step(required=False, retry=FAST)
    def optional_broken(ctx):
        raise RuntimeError("flaky API")

    @wf.step()
    def needed(ctx):
        return 1

    @wf.step(after=[optional_slow, optional_broken, needed], join=konduit.Join.required())
    def publish(ctx):
        return {"have": sorted(ctx.upstream), "outcomes": ctx.outcomes}

    app = make_app(wf)
    handle = app.start(wf.name)
    t0 = time.monotonic()
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=15)
    assert time.monotonic() - t0 < 8
    assert result.output["have"] == ["needed"]
    assert result.output["outcomes"] == {
        "optional_slow": "timed_out", "optional_broken": "failed", "needed": "succeeded"
    }


def test_failed_required_branch_fails_the_execution_and_cancels_running_branches(make_app):
    wf = konduit.Workflow("required-fails", version=1)
    started = threading.Event()

    @wf.step(retry=FAST)
    def needed(ctx):
        started.wait(10)
        raise RuntimeError("payment API down")

    @wf.step(required=False)
    async def slow_optional(ctx):
        started.set()
        await asyncio.sleep(30)

    @wf.step(after=[needed, slow_optional], join=konduit.Join.required())
    def publish(ctx):
        return "never"

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=4), pytest.raises(konduit.ExecutionFailed) as info:
        handle.wait(timeout=15)
    assert "needed" in (info.value.result.error or "")
    statuses = dict(rows(app.database_url,
                         "SELECT step, status FROM konduit_tasks WHERE execution_id = %s",
                         handle.id))
    assert statuses == {"needed": "failed", "slow_optional": "cancelled"}


def test_fallback_on_failure_degrades_after_retries(make_app):
    wf = konduit.Workflow("fallback-on-failure", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, base="10ms", jitter=False),
             fallback=lambda ctx: {"translation": "machine"}, fallback_on_failure=True)
    def translate(ctx):
        raise RuntimeError("human review queue unavailable")

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2):
        result = handle.wait(timeout=15)
    assert result.output == {"translation": "machine"}
    assert result.outcomes == {"translate": "degraded"}


class Caption(pydantic.BaseModel):
    text: str
    language: str


@pytest.mark.parametrize("declared", ["pydantic", "json-schema"])
def test_malformed_payload_fails_the_attempt_at_once(make_app, declared):
    wf = konduit.Workflow(f"malformed-{declared}", version=1)
    calls = []
    schema = Caption if declared == "pydantic" else {
        "type": "object", "required": ["text", "language"],
        "properties": {"text": {"type": "string"}, "language": {"type": "string"}},
    }

    @wf.step(output=schema, retry=konduit.Retry(max_attempts=5, base="10ms"))
    def captions(ctx):
        calls.append(1)
        return {"text": "hello"}  # no language

    app = make_app(wf)
    handle = app.start(wf.name)
    t0 = time.monotonic()
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed):
        handle.wait(timeout=15)
    assert time.monotonic() - t0 < 5
    assert calls == [1]  # non-retryable: one attempt only
    (error,) = rows(app.database_url,
                    "SELECT error FROM konduit_tasks WHERE execution_id = %s", handle.id)[0]
    assert "captions" in str(opened(error)) and "language" in str(opened(error))


def test_declared_output_is_stored_in_its_json_form(make_app):
    wf = konduit.Workflow("typed", version=1)

    @wf.step(output=Caption)
    def captions(ctx):
        return Caption(text="hi", language="en")

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=2):
        assert handle.wait(timeout=15).output == {"text": "hi", "language": "en"}


def test_invalid_declared_output_is_a_definition_error():
    wf = konduit.Workflow("bad-schema", version=1)
    with pytest.raises(konduit.WorkflowDefinitionError, match="s1"):
        wf.step(name="s1", output={"type": "no-such-type"})(lambda ctx: None)


def test_adaptive_deadline_is_factor_times_quantile_clamped():
    d = konduit.Deadline.adaptive(factor=1.5, quantile=0.99, window="7d", floor="10s",
                                  ceiling="45s", default="30s")
    assert adaptive_budget(d, 20.0, MIN_SAMPLES) == 30.0
    assert adaptive_budget(d, 2.0, MIN_SAMPLES) == 10.0  # floor
    assert adaptive_budget(d, 100.0, MIN_SAMPLES) == 45.0  # ceiling
    assert adaptive_budget(d, 20.0, MIN_SAMPLES - 1) == 30.0  # thin history: the default
    assert adaptive_budget(d, None, 0) == 30.0


def test_adaptive_deadline_from_real_history(make_app):
    """After a history of known durations, the deadline a new task gets equals factor x the
    quantile of those durations, clamped."""
    wf = konduit.Workflow("adaptive", version=1)

    @wf.step(deadline=konduit.Deadline.adaptive(factor=2.0, quantile=0.5, window="1d",
                                                floor="100ms", ceiling="60s", default="5s"))
    def step(ctx):
        return 1

    app = make_app(wf)
    handle = app.start(wf.name)
    with running_worker(app, concurrency=1):
        handle.wait(timeout=15)
    # Write a history of known durations: 1..40 seconds (median 20.5 s).
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        (task_id,) = conn.execute("SELECT id FROM konduit_tasks LIMIT 1").fetchone()
        for i in range(1, 41):
            conn.execute(
                "INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,"
                " started_at, finished_at, outcome) VALUES (%s, 1, 'history', gen_random_uuid(),"
                " now() - make_interval(secs => %s), now(), 'succeeded')",
                (task_id, float(i)),
            )
    from konduit.engine.deadlines import budgets

    budgets._cache.clear()
    second = app.start(wf.name)
    (budget,) = rows(app.database_url,
                     "SELECT deadline_seconds FROM konduit_tasks WHERE execution_id = %s",
                     second.id)[0]
    # 41 successful samples: the real run (~0 s) and 1..40 s; median 20 s, times 2.
    assert budget == pytest.approx(40.0, abs=0.5)


def test_routing_skips_the_branches_not_chosen(make_app):
    wf = konduit.Workflow("routing", version=1)

    @wf.step()
    def classify(ctx):
        return konduit.Route({"kind": ctx.input}, to=[ctx.input])

    @wf.step(after=[classify])
    def video(ctx):
        return "transcoded"

    @wf.step(after=[classify])
    def text(ctx):
        return "spellchecked"

    @wf.step(after=[video])
    def thumbnail(ctx):
        return "thumb"

    @wf.step(after=[thumbnail, text], join=konduit.Join.all_done())
    def publish(ctx):
        return {"have": ctx.upstream, "outcomes": ctx.outcomes}

    app = make_app(wf)
    h = app.start(wf.name, input="text")
    with running_worker(app, concurrency=2):
        result = h.wait(timeout=15)
    assert result.output == {"have": {"text": "spellchecked"},
                             "outcomes": {"thumbnail": "skipped", "text": "succeeded"}}
    assert result.outcomes["video"] == "skipped" and result.outcomes["thumbnail"] == "skipped"


def test_routing_to_a_step_that_is_not_downstream_fails_clearly(make_app):
    wf = konduit.Workflow("bad-route", version=1)

    @wf.step(retry=FAST)
    def classify(ctx):
        return konduit.Route(1, to=["nowhere"])

    @wf.step(after=[classify])
    def after(ctx):
        return 1

    app = make_app(wf)
    h = app.start(wf.name)
    with running_worker(app, concurrency=2), pytest.raises(konduit.ExecutionFailed):
        h.wait(timeout=15)
    (error,) = rows(app.database_url,
                    "SELECT error FROM konduit_tasks WHERE step = 'classify'")[0]
    assert "nowhere" in str(opened(error))


@pytest.mark.parametrize("items", [0, 1, 10_000])
def test_map_fan_out_of_many_items_joins_in_item_order(make_app, items):
    wf = konduit.Workflow(f"map-{items}", version=1)

    @wf.step()
    def source(ctx):
        return {"n": ctx.input}

    @wf.map(after=[source], over=lambda out: range(out["n"]))
    async def double(ctx):
        return ctx.item * 2

    @wf.step(after=[double])
    def total(ctx):
        values = ctx.upstream["double"]
        assert values == [i * 2 for i in range(len(values))]  # item order
        return {"count": len(values), "sum": sum(values)}

    app = make_app(wf)
    h = app.start(wf.name, input=items)
    with running_worker(app, concurrency=32):
        result = h.wait(timeout=240)
    assert result.output == {"count": items, "sum": items * (items - 1)}


def test_repair_replaces_a_degraded_output_and_keeps_the_first_version(make_app):
    wf = konduit.Workflow("repairable", version=1)
    slow = {"on": True}

    @wf.step()
    def transcribe(ctx):
        return "words"

    @wf.step(after=[transcribe], deadline="500ms", retry=FAST,
             fallback=lambda ctx: "fallback.png")
    async def cover_image(ctx):
        if slow["on"]:
            await asyncio.sleep(30)
        return "real.png"

    @wf.step(after=[transcribe])
    def captions(ctx):
        return "captions"

    @wf.step(after=[cover_image, captions])
    def publish(ctx):
        return {"image": ctx.upstream["cover_image"], "captions": ctx.upstream["captions"]}

    app = make_app(wf)
    h = app.start(wf.name)
    with running_worker(app, concurrency=4):
        first = h.wait(timeout=15)
        assert first.output == {"image": "fallback.png", "captions": "captions"}
        slow["on"] = False
        rerun = app.repair(h.id)
        assert rerun == ["cover_image", "publish"]
        second = h.wait(timeout=15)
    assert second.output == {"image": "real.png", "captions": "captions"}
    assert second.outcomes["cover_image"] == "succeeded"
    versions = app.outputs(h.id)
    assert [v.version for v in versions] == [1, 2]
    assert versions[0].output["image"] == "fallback.png"
    assert versions[0].degraded == ["cover_image"]
    assert versions[1].degraded == []
    # Only the degraded branch and its downstream ran again: one generation-2 task each.
    gens = rows(app.database_url,
                "SELECT step, generation FROM konduit_tasks WHERE execution_id = %s"
                " ORDER BY step, generation", h.id)
    assert gens == [("captions", 1), ("cover_image", 1), ("cover_image", 2), ("publish", 1),
                    ("publish", 2), ("transcribe", 1)]


def test_repair_of_a_healthy_execution_is_refused(make_app):
    wf = konduit.Workflow("healthy", version=1)

    @wf.step()
    def only(ctx):
        return 1

    app = make_app(wf)
    h = app.start(wf.name)
    with running_worker(app, concurrency=1):
        h.wait(timeout=15)
    with pytest.raises(konduit.KonduitError, match="nothing to repair"):
        app.repair(h.id)
