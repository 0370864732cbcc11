"""Hedged attempts (docs/hedging.md): a second attempt beside a straggler, the first to finish
counts, the other is fenced off and stopped.

Storage-level tests drive the transitions directly (two attempts of one task completing at the
same instant from two connections, many trials); worker-level tests run a real worker whose
straggling attempt is hedged. tests/test_hedging_processes.py runs real worker processes.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import konduit
from konduit.bench.harness import LoopThread
from konduit.core.hedging import MIN_SAMPLES, MIN_THRESHOLD, Hedge, parse_hedge, threshold
from konduit.core.model import Command
from konduit.engine import transitions
from konduit.engine.completer import Recorded, record, record_many
from konduit.engine.registry import workflow_key
from konduit.errors import KonduitError, WorkflowDefinitionError
from konduit.observe.metrics import metric_families
from konduit.observe.stats import load_stats, stats_renderables
from konduit.worker.config import WorkerConfig
from konduit.worker.executor import Claimed, Executor
from konduit.worker.hedging import Hedger
from konduit.worker.maintenance import Maintenance
from tests.support.fanin import claim, completion_for
from tests.support.waiting import until
from tests.support.workers import running_worker

# -- definition time ---------------------------------------------------------------------------


def _noop(ctx: Any) -> int:
    return 1


@pytest.mark.parametrize("value,expected", [
    ("2s", Hedge(seconds=2.0)), (0.5, Hedge(seconds=0.5)), ("250ms", Hedge(seconds=0.25)),
    ("p95", Hedge(quantile=0.95)), ("P99.9", Hedge(quantile=0.999)), ("p50", Hedge(quantile=0.5)),
])
def test_hedge_settings_that_are_read(value: Any, expected: Hedge) -> None:
    assert parse_hedge(value) == expected
    wf = konduit.Workflow("hedge-ok")
    wf.step(hedge=value)(_noop)
    assert wf.spec["_noop"].hedge == expected
    assert "hedge" in wf.spec.spec_json["steps"][0]


@pytest.mark.parametrize("value", ["0s", 0, -1, "p40", "p100", "p", "soon", True, [], "2 parsecs",
                                   float("inf"), float("nan")])
def test_bad_hedge_settings_fail_at_definition_naming_the_step(value: Any) -> None:
    wf = konduit.Workflow("hedge-bad")
    with pytest.raises(WorkflowDefinitionError) as err:
        wf.step(name="slowpoke", hedge=value)(_noop)
    assert err.value.step == "slowpoke" and "hedge" in str(err.value)


@pytest.mark.parametrize("limit", [{"concurrency": 2}, {"rate": "4/s"}])
def test_a_hedge_cannot_run_past_a_flow_limit(limit: dict[str, Any]) -> None:
    """A hedged attempt starts beside the claim, not through it: with a limit it would run a
    second handler past it, so the two do not combine."""
    wf = konduit.Workflow("hedge-flow")
    with pytest.raises(WorkflowDefinitionError) as err:
        wf.step(name="guarded", hedge="2s", **limit)(_noop)
    assert err.value.step == "guarded" and "flow limit" in str(err.value)


def test_unhedged_steps_keep_their_spec_hash() -> None:
    """A step without hedge= describes itself as before: deployed workflows keep their hash."""
    wf = konduit.Workflow("hedge-hash")
    wf.step()(_noop)
    assert "hedge" not in wf.spec.spec_json["steps"][0]


def test_map_steps_take_hedge_too() -> None:
    wf = konduit.Workflow("hedge-map")
    wf.step()(_noop)

    @wf.map(after=[_noop], over=lambda n: range(3), hedge="1s")
    def item(ctx: Any) -> int:
        return 1

    assert wf.spec["item"].hedge == Hedge(seconds=1.0)


@given(seconds=st.floats(min_value=1e-3, max_value=1e6), samples=st.integers(0, 10_000),
       q=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)))
def test_threshold_fixed_settings_ignore_history(seconds: float, samples: int, q: float | None) -> None:
    assert threshold(Hedge(seconds=seconds), samples=samples, quantile_seconds=q) == seconds


@given(samples=st.integers(0, 10_000), q=st.one_of(st.none(), st.floats(allow_nan=True)))
def test_threshold_from_history_needs_enough_samples(samples: int, q: float | None) -> None:
    got = threshold(Hedge(quantile=0.95), samples=samples, quantile_seconds=q)
    if samples < MIN_SAMPLES or q is None or q != q or q in (float("inf"), float("-inf")):
        assert got is None
    else:
        assert got == max(q, MIN_THRESHOLD) and got >= MIN_THRESHOLD


def test_parse_hedge_errors_are_konduit_errors() -> None:
    with pytest.raises(KonduitError, match=r"p50 to p99\.9"):
        parse_hedge("p20")


# -- storage level: two leases on one task -----------------------------------------------------

def hedged_fan_in(name: str) -> konduit.Workflow:
    """root -> (fast, slow) -> join; ``slow`` is hedged."""
    wf = konduit.Workflow(name)

    @wf.step()
    def root(ctx: Any) -> int:
        return 1

    @wf.step(after=[root])
    def fast(ctx: Any) -> int:
        return 1

    @wf.step(after=[root], hedge="1s")
    def slow(ctx: Any) -> int:
        return 1

    @wf.step(after=[fast, slow])
    def join(ctx: Any) -> int:
        return 1

    return wf


@pytest.fixture
def hedged(make_app: Any) -> Iterator[tuple[konduit.App, LoopThread]]:
    app = make_app(hedged_fan_in("hedged"))
    lt = LoopThread(app.database_url)
    yield app, lt
    lt.close()


async def hedge_now(db: Any, app: konduit.App, *, worker_id: str = "hedger") -> list[Claimed]:
    """Hedge every running ``slow`` task at once (threshold 0)."""
    rows = await transitions.hedge(db, hedged=[(workflow_key("hedged", 1), "slow", 0.0)],
                                   limit=10, lease_seconds=600, worker_id=worker_id)
    return [Claimed.from_row(r) for r in rows]


def bring_to_straggler(app: konduit.App, lt: LoopThread) -> tuple[uuid.UUID, Claimed, Claimed]:
    """Start an execution; run root and fast; lease slow and hedge it. Returns (execution id,
    the primary, the hedge)."""
    while leftovers := lt.run(claim(lt.db, app.registry, 10)):  # earlier executions' tasks
        for task in leftovers:
            lt.run(record(lt.db, app.registry, completion_for(task)))
    handle = app.start("hedged")
    (root,) = lt.run(claim(lt.db, app.registry, 1))
    assert lt.run(record(lt.db, app.registry, completion_for(root)))[0] is Recorded.ENDED
    branches = {t.step: t for t in lt.run(claim(lt.db, app.registry, 2))}
    assert lt.run(record(lt.db, app.registry, completion_for(branches["fast"])))[0] is Recorded.ENDED
    primary = branches["slow"]
    (hedge,) = [h for h in lt.run(hedge_now(lt.db, app)) if h.execution_id == handle.id]
    assert hedge.id == primary.id and hedge.hedged and not primary.hedged
    assert hedge.lease_token != primary.lease_token and hedge.attempt == primary.attempt
    return handle.id, primary, hedge


def task_row(url: str, task_id: int) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        cur = conn.execute(
            "SELECT status, attempt, lease_token, hedge_token, hedged_attempt, worker_id"
            " FROM konduit_tasks WHERE id = %s", (task_id,))
        row = cur.fetchone()
        assert row is not None
        return dict(zip([d.name for d in cur.description or ()], row, strict=True))


def attempts_of(url: str, task_id: int) -> list[tuple[bool, str | None]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT hedge, outcome FROM konduit_attempts WHERE task_id = %s ORDER BY id",
            (task_id,))]


def joins_of(url: str, execution_id: uuid.UUID) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                           " AND step = 'join'", (execution_id,)).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.storage
def test_hedge_claim_takes_one_hedge_per_attempt(hedged: Any) -> None:
    app, lt = hedged
    _, primary, hedge = bring_to_straggler(app, lt)
    row = task_row(app.database_url, primary.id)
    assert row["lease_token"] == primary.lease_token and row["hedge_token"] == hedge.lease_token
    assert row["hedged_attempt"] == primary.attempt
    assert lt.run(hedge_now(lt.db, app)) == []  # already hedged
    # The hedge ends alone (its attempt failed): the attempt is still never hedged again.
    out, _ = lt.run(record(lt.db, app.registry, hedge.completion(Command.RETRY, error="boom")))
    assert out is Recorded.DROPPED
    assert lt.run(hedge_now(lt.db, app)) == []
    assert attempts_of(app.database_url, primary.id) == [(False, None), (True, "dropped")]
    # A threshold not reached yet hedges nothing either.
    rows = lt.run(transitions.hedge(lt.db, hedged=[(workflow_key("hedged", 1), "slow", 3600.0)],
                                    limit=10, lease_seconds=60, worker_id="x"))
    assert rows == []


@pytest.mark.storage
def test_hedge_wins_primary_is_fenced_off(hedged: Any) -> None:
    app, lt = hedged
    execution_id, primary, hedge = bring_to_straggler(app, lt)
    won, advanced = lt.run(record(lt.db, app.registry, hedge.completion(
        "succeeded", payload_json='"hedge"', payload="hedge")))
    assert won is Recorded.ENDED and advanced is not None and advanced.fired
    late, _ = lt.run(record(lt.db, app.registry, primary.completion(
        "succeeded", payload_json='"primary"', payload="primary")))
    assert late is Recorded.LEASE_LOST
    row = task_row(app.database_url, primary.id)
    assert row["status"] == "succeeded" and row["lease_token"] is None and row["hedge_token"] is None
    assert attempts_of(app.database_url, primary.id) == [(False, "outrun"), (True, "succeeded")]
    assert joins_of(app.database_url, execution_id) == 1
    # Neither lease holds the task any more: the heartbeat tells both workers.
    held = lt.run(lt.db.all("task_extend_leases_if_held", ids=[primary.id, primary.id],
                            lease_tokens=[primary.lease_token, hedge.lease_token],
                            lease_seconds=60))
    assert held == []


@pytest.mark.storage
def test_a_failure_beside_a_running_attempt_only_drops_that_attempt(hedged: Any) -> None:
    app, lt = hedged
    # The primary raises for good while the hedge runs: the hedge takes the lease and decides.
    execution_id, primary, hedge = bring_to_straggler(app, lt)
    out, _ = lt.run(record(lt.db, app.registry, primary.completion("failed", error="boom")))
    assert out is Recorded.DROPPED
    row = task_row(app.database_url, primary.id)
    assert row["status"] == "running" and row["lease_token"] == hedge.lease_token
    assert row["hedge_token"] is None and row["worker_id"] == "hedger"
    assert lt.run(record(lt.db, app.registry, completion_for(hedge)))[0] is Recorded.ENDED
    assert attempts_of(app.database_url, primary.id) == [(False, "dropped"), (True, "succeeded")]
    assert joins_of(app.database_url, execution_id) == 1
    # A retry of the hedge while the primary runs drops the hedge; the primary then retries.
    execution_id, primary, hedge = bring_to_straggler(app, lt)
    assert lt.run(record(lt.db, app.registry, hedge.completion(Command.RETRY, retry_delay=0.0)))[0] \
        is Recorded.DROPPED
    assert lt.run(record(lt.db, app.registry, primary.completion(Command.RETRY, retry_delay=0.0)))[0] \
        is Recorded.RETRYING
    row = task_row(app.database_url, primary.id)
    assert row["status"] == "ready" and row["hedge_token"] is None
    assert attempts_of(app.database_url, primary.id) == [(False, "retry"), (True, "dropped")]
    # A graceful stop of the primary hands over to the hedge instead of releasing the task.
    execution_id, primary, hedge = bring_to_straggler(app, lt)
    assert lt.run(record(lt.db, app.registry, primary.completion(Command.RELEASE)))[0] \
        is Recorded.DROPPED
    assert task_row(app.database_url, primary.id)["lease_token"] == hedge.lease_token


@pytest.mark.storage
def test_heartbeat_extends_both_leases_of_one_task(hedged: Any) -> None:
    app, lt = hedged
    _, primary, hedge = bring_to_straggler(app, lt)
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_tasks SET lease_expires_at = now() + interval '1 second',"
                     " hedge_expires_at = now() + interval '1 second' WHERE id = %s", (primary.id,))
    held = lt.run(lt.db.all("task_extend_leases_if_held", ids=[primary.id, primary.id],
                            lease_tokens=[primary.lease_token, hedge.lease_token],
                            lease_seconds=600))
    assert {(r["id"], r["lease_token"]) for r in held} == {
        (primary.id, primary.lease_token), (primary.id, hedge.lease_token)}
    with psycopg.connect(app.database_url) as conn:
        row = conn.execute("SELECT lease_expires_at - now() > interval '500 seconds',"
                           " hedge_expires_at - now() > interval '500 seconds'"
                           " FROM konduit_tasks WHERE id = %s", (primary.id,)).fetchone()
    assert row == (True, True)


@pytest.mark.storage
def test_rescue_drops_a_dead_hedge_and_promotes_a_live_one(hedged: Any) -> None:
    app, lt = hedged
    rescuer = Maintenance(lt.db, app.registry, Executor(lt.db), lease_seconds=0.01,
                          deadline_grace=1.0)
    # The hedge's worker vanished: the hedge is dropped, the primary runs on.
    _, primary, hedge = bring_to_straggler(app, lt)
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_tasks SET hedge_expires_at = now() - interval '1 second'"
                     " WHERE id = %s", (primary.id,))
    assert lt.run(rescuer.rescue_hedges()) == 1
    row = task_row(app.database_url, primary.id)
    assert row["status"] == "running" and row["lease_token"] == primary.lease_token
    assert row["hedge_token"] is None
    assert attempts_of(app.database_url, primary.id) == [(False, None), (True, "lost")]
    assert lt.run(record(lt.db, app.registry, completion_for(hedge)))[0] is Recorded.LEASE_LOST
    assert lt.run(record(lt.db, app.registry, completion_for(primary)))[0] is Recorded.ENDED
    # The primary's worker vanished while the hedge lives: the hedge takes the task over (and a
    # plain rescue of the primary, racing it, changes nothing).
    _, primary, hedge = bring_to_straggler(app, lt)
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_tasks SET lease_expires_at = now() - interval '1 second'"
                     " WHERE id = %s", (primary.id,))
    rescued, _ = lt.run(record(lt.db, app.registry, primary.completion(
        Command.RETRY, transition="lose", guard_seconds=0.01, retry_delay=0.0)))
    assert rescued is Recorded.LEASE_LOST  # a live hedge: no plain rescue
    assert lt.run(rescuer.rescue_hedges()) == 1
    row = task_row(app.database_url, primary.id)
    assert row["status"] == "running" and row["lease_token"] == hedge.lease_token
    assert row["hedge_token"] is None
    assert lt.run(record(lt.db, app.registry, completion_for(hedge)))[0] is Recorded.ENDED
    assert attempts_of(app.database_url, primary.id) == [(False, "lost"), (True, "succeeded")]


@pytest.mark.storage
def test_both_attempts_finishing_at_once_record_exactly_one(hedged: Any) -> None:
    """Primary and hedge complete at the same instant from two connections: exactly one ends
    the task, the join is created once, and the loser is refused or dropped. Half the trials
    race a success against a failure (the failure must never retry or end the task)."""
    app, lt = hedged
    other = LoopThread(app.database_url)
    trials = 24
    try:
        for trial in range(trials):
            execution_id, primary, hedge = bring_to_straggler(app, lt)
            mixed = trial % 2 == 1
            barrier = threading.Barrier(2)

            async def finish(task: Claimed, outcome: str, db: Any,
                             barrier: threading.Barrier = barrier) -> Recorded:
                completion = task.completion(outcome, payload_json=f'"{task.hedged}"',
                                             payload=str(task.hedged)) \
                    if outcome == "succeeded" else task.completion(outcome, retry_delay=0.0,
                                                                   error="boom")
                await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
                ((out, _),) = await record_many(db, app.registry, [completion])
                return out

            # Alternate which attempt fails in the mixed trials.
            primary_outcome = Command.RETRY if mixed and trial % 4 == 1 else "succeeded"
            hedge_outcome = "failed" if mixed and trial % 4 == 3 else "succeeded"
            a = lt.submit(finish(primary, primary_outcome, lt.db))
            b = other.submit(finish(hedge, hedge_outcome, other.db))
            outs = [a.result(timeout=60), b.result(timeout=60)]
            ended = outs.count(Recorded.ENDED)
            assert ended == 1, (trial, outs)
            assert set(outs) <= {Recorded.ENDED, Recorded.LEASE_LOST, Recorded.DROPPED}, outs
            row = task_row(app.database_url, primary.id)
            assert row["status"] == "succeeded" and row["hedge_token"] is None, (trial, row)
            attempts = attempts_of(app.database_url, primary.id)
            assert sorted(o or "" for _, o in attempts) in (
                ["outrun", "succeeded"], ["dropped", "succeeded"]), (trial, attempts)
            assert joins_of(app.database_url, execution_id) == 1
            (join,) = lt.run(claim(lt.db, app.registry, 1))
            out, advanced = lt.run(record(lt.db, app.registry, completion_for(join)))
            assert out is Recorded.ENDED and advanced is not None and advanced.finished == "succeeded"
    finally:
        other.close()


@pytest.mark.storage
def test_p95_threshold_comes_from_the_steps_history(make_app: Any) -> None:
    wf = konduit.Workflow("p95-hist")

    @wf.step(hedge="p95")
    def work(ctx: Any) -> int:
        return 1

    app = make_app(wf)
    lt = LoopThread(app.database_url)
    try:
        app.start("p95-hist")
        (task,) = lt.run(claim(lt.db, app.registry, 1))
        hedger = Hedger(lt.db, app.registry, WorkerConfig(worker_id="h", poll_interval=1.0))

        def add_history(durations: list[float], outcome: str = "succeeded", hedge: bool = False
                        ) -> None:
            with psycopg.connect(app.database_url, autocommit=True) as conn:
                for d in durations:
                    conn.execute(
                        "INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,"
                        " started_at, finished_at, outcome, hedge) VALUES (%s, 1, 'w', %s,"
                        " now() - make_interval(secs => %s + 1), now() - interval '1 second',"
                        " %s, %s)", (task.id, uuid.uuid4(), d, outcome, hedge))

        # Too little history: the step is not hedged yet.
        add_history([1.0] * (MIN_SAMPLES - 1))
        assert lt.run(hedger.thresholds()) == []
        # Hedge attempts and failures are no primary durations; outrun primaries are.
        add_history([1000.0] * 50, outcome="succeeded", hedge=True)
        add_history([1000.0] * 50, outcome="failed")
        hedger._read_at.clear()
        assert lt.run(hedger.thresholds()) == []
        add_history([2.0] * 10 + [5.0] * 5, outcome="succeeded")
        add_history([9.0] * 5, outcome="outrun")
        hedger._read_at.clear()
        ((workflow, step, seconds),) = lt.run(hedger.thresholds())
        assert (workflow, step) == ("p95-hist@1", "work")
        # 39 samples: 19 x 1 s, 10 x 2 s, 5 x 5 s, 5 x 9 s -> the 95th percentile is 9 s.
        assert seconds == pytest.approx(9.0)
        assert hedger.poll == pytest.approx(1.0)  # a quarter of 9 s, capped by the poll interval
    finally:
        lt.close()


# -- a real worker -----------------------------------------------------------------------------

SEEN: list[tuple[str, bool, str]] = []  # (idempotency key, hedged, what happened)
SEEN_LOCK = threading.Lock()


def _seen(ctx: Any, what: str) -> None:
    with SEEN_LOCK:
        SEEN.append((ctx.idempotency_key, ctx.hedged, what))


def straggler_workflow(name: str, hedge: str, *, sync: bool) -> konduit.Workflow:
    wf = konduit.Workflow(name)

    @wf.step()
    def root(ctx: Any) -> int:
        return 1

    @wf.step(after=[root])
    def fast(ctx: Any) -> int:
        return 1

    if sync:
        @wf.step(after=[root], hedge=hedge, name="slow")
        def slow_sync(ctx: Any) -> str:
            _seen(ctx, "started")
            if not ctx.hedged:
                # The first attempt straggles; it notices the cancel, but returns anyway late.
                for _ in range(30):
                    if ctx.cancelled:
                        _seen(ctx, "cancel seen")
                        break
                    time.sleep(0.1)
                _seen(ctx, "returned")
                return "primary"
            return "hedge"
        slow: Any = slow_sync
    else:
        @wf.step(after=[root], hedge=hedge, name="slow")
        async def slow_async(ctx: Any) -> str:
            _seen(ctx, "started")
            if not ctx.hedged:
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    _seen(ctx, "cancelled")
                    raise
                return "primary"
            return "hedge"
        slow = slow_async

    @wf.step(after=[fast, slow])
    def join(ctx: Any) -> str:
        _seen(ctx, "join")
        return str(ctx.upstream["slow"])

    return wf


def run_straggler(app: konduit.App, name: str, *, wait_for: str) -> tuple[Any, list[Any]]:
    SEEN.clear()
    with running_worker(app, concurrency=4, poll_interval=0.2, heartbeat_interval=0.5,
                        lease_seconds=5.0):
        began = time.monotonic()
        result = app.start(name).wait(timeout=20)
        took = time.monotonic() - began
        until(lambda: any(w == wait_for for _, _, w in SEEN), 10, f"{wait_for!r} in the handlers")
    assert took < 10, f"the straggler was not hedged ({took:.1f} s)"
    return result, list(SEEN)


@pytest.mark.storage
def test_a_hedged_async_straggler_the_hedge_wins_the_loser_is_cancelled(make_app: Any) -> None:
    app = make_app(straggler_workflow("straggle-async", "0.5s", sync=False))
    result, seen = run_straggler(app, "straggle-async", wait_for="cancelled")
    assert result.status == "succeeded" and result.output == "hedge"
    slow = [(k, h, w) for k, h, w in seen if w != "join"]
    assert [(h, w) for _, h, w in slow] == [(False, "started"), (True, "started"),
                                            (False, "cancelled")]
    assert len({k for k, _, _ in slow}) == 1  # one idempotency key for both attempts
    assert [w for _, _, w in seen].count("join") == 1
    with psycopg.connect(app.database_url) as conn:
        rows = conn.execute(
            "SELECT a.hedge, a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
            " ON t.id = a.task_id WHERE t.step = 'slow' ORDER BY a.id").fetchall()
    assert rows == [(False, "outrun"), (True, "succeeded")]
    assert [p.payload for p in app.payloads(result.id) if p.step == "slow"] == ["hedge"]
    # konduit stats and the metrics count the hedge and its win.
    lt = LoopThread(app.database_url)
    try:
        stats = lt.run(load_stats(lt.db, "straggle-async"))
    finally:
        lt.close()
    by_step = {b.step: b for b in stats.branches}
    assert (by_step["slow"].hedges, by_step["slow"].hedges_won) == (1, 1)
    assert (by_step["fast"].hedges, by_step["fast"].hedges_won) == (0, 0)
    console = Console(record=True, width=200)
    for part in stats_renderables(stats):
        console.print(part)
    text = console.export_text()
    assert "won/started" in text and "1/1" in text
    samples = {(m.name, s.labels.get("step")): s.value for m in metric_families(stats, [])
               for s in m.samples}
    assert samples[("konduit_step_hedges_total", "slow")] == 1
    assert samples[("konduit_step_hedges_won_total", "slow")] == 1


@pytest.mark.storage
def test_a_hedged_sync_straggler_its_late_result_is_refused(make_app: Any) -> None:
    app = make_app(straggler_workflow("straggle-sync", "0.5s", sync=True))
    result, seen = run_straggler(app, "straggle-sync", wait_for="cancel seen")
    assert result.status == "succeeded" and result.output == "hedge"
    assert (False, "cancel seen") in [(h, w) for _, h, w in seen]
    assert {h for _, h, w in seen if w == "started"} == {False, True}
    assert [w for _, _, w in seen].count("join") == 1
    # The primary's thread returns after noticing the cancel: its late result is refused.
    until(lambda: any(h is False and w == "returned" for _, h, w in SEEN), 10,
          "the primary's thread to return")
    with psycopg.connect(app.database_url) as conn:
        rows = conn.execute(
            "SELECT a.hedge, a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
            " ON t.id = a.task_id WHERE t.step = 'slow' ORDER BY a.id").fetchall()
    assert rows == [(False, "outrun"), (True, "succeeded")]
    assert [p.payload for p in app.payloads(result.id) if p.step == "slow"] == ["hedge"]


@pytest.mark.storage
def test_hedge_p95_hedges_a_straggler_from_history(make_app: Any) -> None:
    app = make_app(straggler_workflow("straggle-p95", "p95", sync=False))
    # History: earlier primaries of the step took about 0.3 s.
    first = app.start("straggle-p95")
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_executions SET status = 'cancelled', finished_at = now()"
                     " WHERE id = %s", (first.id,))
        conn.execute("UPDATE konduit_tasks SET status = 'cancelled', finished_at = now()"
                     " WHERE execution_id = %s", (first.id,))
        (task_id,) = conn.execute("SELECT id FROM konduit_tasks WHERE execution_id = %s",
                                  (first.id,)).fetchone() or (None,)
        for _ in range(MIN_SAMPLES + 5):
            conn.execute(
                "INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,"
                " started_at, finished_at, outcome) SELECT %s, 1, 'w', %s, now() - interval"
                " '1.3 seconds', now() - interval '1 second', 'succeeded'",
                (task_id, uuid.uuid4()))
        conn.execute("UPDATE konduit_tasks SET step = 'slow' WHERE id = %s", (task_id,))
    result, seen = run_straggler(app, "straggle-p95", wait_for="cancelled")
    assert result.status == "succeeded" and result.output == "hedge"
    assert [h for _, h, w in seen if w == "started"] == [False, True]


def primary_decides_workflow(name: str) -> konduit.Workflow:
    """``slow``: the first attempt takes 1.5 s and returns; a hedge raises at once."""
    wf = konduit.Workflow(name)

    @wf.step(hedge="0.2s", retry=konduit.Retry(max_attempts=3))
    async def slow(ctx: Any) -> str:
        if ctx.hedged:
            raise RuntimeError("the hedge breaks")
        await asyncio.sleep(1.5)
        return "primary"

    return wf


def slow_attempts(url: str) -> list[tuple[int, bool, str | None]]:
    with psycopg.connect(url) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT a.attempt, a.hedge, a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
            " ON t.id = a.task_id WHERE t.step = 'slow' ORDER BY a.id")]


@pytest.mark.storage
def test_a_failing_hedge_leaves_the_decision_to_the_first_attempt(make_app: Any) -> None:
    app = make_app(primary_decides_workflow("hedge-fails"))
    with running_worker(app, concurrency=2, poll_interval=0.2):
        result = app.start("hedge-fails").wait(timeout=20)
    assert result.status == "succeeded" and result.output == "primary"
    # No retry: the hedge's failure ended only its own attempt.
    assert slow_attempts(app.database_url) == [(1, False, "succeeded"), (1, True, "dropped")]


@pytest.mark.storage
def test_no_free_slot_no_hedge(make_app: Any) -> None:
    """A hedge only takes a free slot: a worker whose one slot runs the straggler hedges nothing."""
    app = make_app(primary_decides_workflow("hedge-full"))
    with running_worker(app, concurrency=1, poll_interval=0.2):
        result = app.start("hedge-full").wait(timeout=20)
    assert result.status == "succeeded" and result.output == "primary"
    assert slow_attempts(app.database_url) == [(1, False, "succeeded")]
