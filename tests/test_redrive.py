"""Redrive (``app.redrive``): a failed, timed-out or cancelled execution runs again from the
steps that did not succeed, keeping every succeeded (and degraded) output, as a new generation
of the re-run steps' tasks, on the repair's one path; and where it differs from a repair."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import konduit
from tests.support.db import rows
from tests.support.workers import running_worker

FAST = konduit.Retry(max_attempts=1)


def _pipeline(calls: dict[str, int], broken: dict[str, bool]) -> konduit.Workflow:
    """transcribe -> cover (degrades: 300 ms deadline, a fallback) -> translate (fails while
    ``broken``) -> publish; ``calls`` counts each handler's calls."""
    wf = konduit.Workflow("redrivable", version=1)

    def called(name: str) -> None:
        calls[name] = calls.get(name, 0) + 1

    @wf.step()
    def transcribe(ctx: konduit.Context) -> str:
        called("transcribe")
        return "words"

    @wf.step(after=[transcribe], deadline="300ms", retry=FAST,
             fallback=lambda ctx: "fallback.png")
    def cover(ctx: konduit.Context) -> str:
        called("cover")
        if broken["cover"]:
            time.sleep(2)
        return "real.png"

    @wf.step(after=[transcribe, cover], retry=FAST)
    def translate(ctx: konduit.Context) -> str:
        called("translate")
        if broken["translate"]:
            raise konduit.NonRetryableError("the translation service is down")
        return "mots"

    @wf.step(after=[translate, cover])
    def publish(ctx: konduit.Context) -> dict[str, Any]:
        called("publish")
        return {"image": ctx.upstream["cover"], "text": ctx.upstream["translate"]}

    return wf


def _generations(url: str, eid: object) -> list[tuple[str, int, str]]:
    return [(s, g, st) for s, g, st in rows(
        url, "SELECT step, generation, status FROM konduit_tasks WHERE execution_id = %s "
        "ORDER BY step, generation", eid)]


def test_redrive_reruns_what_failed_and_keeps_succeeded_and_degraded_outputs(
        make_app: Callable[..., konduit.App]) -> None:
    calls: dict[str, int] = {}
    broken = {"cover": True, "translate": True}
    app = make_app(_pipeline(calls, broken))
    h = app.start("redrivable")
    with running_worker(app, concurrency=4):
        with pytest.raises(konduit.ExecutionFailed) as failed:
            h.wait(timeout=30)
        assert failed.value.result.outcomes == {
            "transcribe": "succeeded", "cover": "degraded", "translate": "failed",
            "publish": "cancelled"}
        broken.update(cover=False, translate=False)
        rerun = app.redrive(h.id)
        assert rerun == ["translate", "publish"]  # not cover: degraded is kept
        result = h.wait(timeout=30)
    # The degraded cover's fallback payload is what the re-run steps got.
    assert result.output == {"image": "fallback.png", "text": "mots"}
    assert calls == {"transcribe": 1, "cover": 1, "translate": 2, "publish": 1}
    assert _generations(app.database_url, h.id) == [
        ("cover", 1, "degraded"), ("publish", 2, "succeeded"),
        ("transcribe", 1, "succeeded"), ("translate", 1, "failed"),
        ("translate", 2, "succeeded")]
    [(generation,)] = rows(app.database_url,
                           "SELECT generation FROM konduit_executions WHERE id = %s", h.id)
    assert generation == 2
    # A succeeded execution is not redriven: that is a repair's job, and the error says so.
    with pytest.raises(konduit.NotRedrivable, match=r"succeeded: only a failed, timed-out or "
                       r"cancelled execution can be redriven \(repair re-runs"):
        app.redrive(h.id)
    # ... and a repair of it re-runs the degraded cover (and what depends on it).
    assert app.repair(h.id) == ["cover", "translate", "publish"]


def test_a_cancelled_execution_is_redriven_and_a_repair_refuses_it(
        make_app: Callable[..., konduit.App]) -> None:
    gate = threading.Event()
    wf = konduit.Workflow("cancel-then-redrive", version=1)
    seen: list[str] = []

    @wf.step()
    def first(ctx: konduit.Context) -> int:
        seen.append("first")
        return 1

    @wf.step(after=[first])
    def slow(ctx: konduit.Context) -> int:
        seen.append("slow")
        while not gate.is_set() and not ctx.cancelled:
            time.sleep(0.02)
        return ctx.upstream["first"] + 1

    @wf.step(after=[slow])
    def last(ctx: konduit.Context) -> int:
        seen.append("last")
        return ctx.upstream["slow"] + 1

    app = make_app(wf)
    h = app.start(wf.name)
    with running_worker(app, concurrency=2):
        until_seen = time.monotonic() + 20
        while "slow" not in seen and time.monotonic() < until_seen:
            time.sleep(0.02)
        assert app.cancel(h.id, "operator stop")
        stopped = app.status(h.id)
        assert stopped.status == "cancelled"
        assert stopped.outcomes["slow"] == "cancelled" and stopped.outcomes["first"] == "succeeded"
        with pytest.raises(konduit.KonduitError, match="redrive runs a cancelled one again"):
            app.repair(h.id)
        gate.set()
        assert app.redrive(h.id) == ["slow", "last"]
        result = h.wait(timeout=30)
    assert result.output == 3 and result.error is None
    assert seen.count("first") == 1 and seen.count("last") == 1


def test_redrive_refuses_a_running_execution_and_names_it(
        make_app: Callable[..., konduit.App]) -> None:
    wf = konduit.Workflow("still-running", version=1)
    wf.step(name="only")(lambda ctx: 1)
    app = make_app(wf)
    h = app.start(wf.name)  # no worker: it stays running
    with pytest.raises(konduit.NotRedrivable, match=f"execution {h.id} is running"):
        app.redrive(h.id)
    with pytest.raises(konduit.ExecutionNotFound):
        app.redrive("00000000-0000-7000-8000-000000000000")


def test_a_redrive_racing_a_late_completion_of_the_old_generation(
        make_app: Callable[..., konduit.App]) -> None:
    """The failed execution's other branch is still in its handler when the execution fails
    (its task is cancelled). Its late completion and the redrive are released together: the
    stale completion is fenced whatever the order, the join fires exactly once, in the new
    generation, with the new generation's outputs."""
    for n in range(3):  # a few rounds: both orders of the two transactions get their turn
        _late_completion_round(make_app, n)


def _late_completion_round(make_app: Callable[..., konduit.App], n: int) -> None:
    release = threading.Barrier(2)
    started = threading.Event()
    calls: dict[str, int] = {}
    lock = threading.Lock()
    wf = konduit.Workflow(f"late-vs-redrive-{n}", version=1)

    def count(name: str) -> int:
        with lock:
            calls[name] = calls.get(name, 0) + 1
            return calls[name]

    @wf.step(retry=FAST)
    def a(ctx: konduit.Context) -> str:
        if count("a") == 1:
            raise konduit.NonRetryableError("a fails once")
        return "a2"

    @wf.step()
    def b(ctx: konduit.Context) -> str:
        if count("b") == 1:
            started.set()
            release.wait(timeout=30)  # the late completion, released with the redrive
            return "b-late"
        return "b2"

    @wf.step(after=[a, b])
    def join(ctx: konduit.Context) -> dict[str, str]:
        count("join")
        return dict(ctx.upstream)

    app = make_app(wf)
    h = app.start(wf.name)
    with running_worker(app, concurrency=4):
        assert started.wait(30)
        with pytest.raises(konduit.ExecutionFailed):
            h.wait(timeout=30)
        release.wait(timeout=30)  # both go at once
        rerun = app.redrive(h.id)
        result = h.wait(timeout=30)
    assert set(rerun) == {"a", "b", "join"}
    assert result.output == {"a": "a2", "b": "b2"}
    assert calls["join"] == 1
    tasks = _generations(app.database_url, h.id)
    assert [t for t in tasks if t[0] == "join"] == [("join", 2, "succeeded")]
    # The old b stayed cancelled: its late result changed no status.
    assert ("b", 1, "cancelled") in tasks and ("b", 2, "succeeded") in tasks


def test_a_code_less_client_and_async_client_redrive_and_bulk(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """konduit.Client and konduit.AsyncClient redrive from the registered definition, and a
    bulk dry run through either counts without changing anything."""
    import asyncio

    from tests.test_bulk import payments, start_failed

    app = make_app(payments())
    ids = start_failed(app, 3, {"face": "clients"})
    where = konduit.ExecutionFilter(tags={"face": "clients"}, status="failed")
    with konduit.Client(db_url) as client:
        assert client.redrive(ids[0]) == ["charge", "notify"]
        assert client.bulk("redrive", where, dry_run=True).done == 2

    async def by_async() -> list[str]:
        async with konduit.AsyncClient(db_url) as client:
            dry = await client.bulk("cancel", where, dry_run=True)
            assert (dry.matched, dry.done, dry.skipped) == (2, 0, {"failed": 2})
            return await client.redrive(ids[1])

    assert asyncio.run(by_async()) == ["charge", "notify"]
    assert [app.status(e).status for e in ids] == ["running", "running", "failed"]
