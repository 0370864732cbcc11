"""Lease-token fencing: a redelivered or stale completion changes nothing."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from konduit.engine.completer import Recorded, record
from konduit.worker.maintenance import reclaim_expired_leases
from tests.support.fanin import LoopThread, claim, completion_for, fan_in_workflow

pytestmark = pytest.mark.storage


def snapshot(url: str, execution_id: object) -> tuple[object, ...]:
    with psycopg.connect(url) as conn:
        tasks = conn.execute(
            "SELECT step, map_index, status, attempt, output_hash FROM konduit_tasks"
            " WHERE execution_id = %s ORDER BY step, map_index",
            (execution_id,),
        ).fetchall()
        steps = conn.execute(
            "SELECT step, status, up_pending, up_ok, up_failed, tasks_pending, tasks_ok,"
            " fired_at FROM konduit_steps WHERE execution_id = %s ORDER BY step",
            (execution_id,),
        ).fetchall()
        execution = conn.execute(
            "SELECT status, steps_pending FROM konduit_executions WHERE id = %s", (execution_id,)
        ).fetchone()
        attempts = conn.execute(
            "SELECT a.task_id, a.attempt, a.outcome FROM konduit_attempts a JOIN konduit_tasks t"
            " ON t.id = a.task_id WHERE t.execution_id = %s ORDER BY 1, 2",
            (execution_id,),
        ).fetchall()
    return (tuple(tasks), tuple(steps), execution, tuple(attempts))


@pytest.fixture
def loop_thread(make_app):
    wf = fan_in_workflow(3, "fence")
    app = make_app(wf)
    lt = LoopThread(app.database_url)
    yield app, lt
    lt.close()


def test_redelivered_completion_with_same_token_changes_nothing(loop_thread):
    app, lt = loop_thread
    handle = app.start("fence")
    (root,) = lt.submit(claim(lt.db, app.registry, 1)).result()
    first, _ = lt.submit(record(lt.db, app.registry, completion_for(root))).result()
    assert first is Recorded.ENDED
    before = snapshot(app.database_url, handle.id)
    again, advanced = lt.submit(record(lt.db, app.registry, completion_for(root))).result()
    assert again is Recorded.LEASE_LOST and advanced is None
    assert snapshot(app.database_url, handle.id) == before
    # A redelivered *failure* of the same attempt is refused just the same.
    failed, _ = lt.submit(record(lt.db, app.registry, completion_for(root, "failed"))).result()
    assert failed is Recorded.LEASE_LOST
    assert snapshot(app.database_url, handle.id) == before


def test_stale_worker_completing_after_reclaim_is_refused(loop_thread):
    app, lt = loop_thread
    handle = app.start("fence")
    (stale,) = lt.submit(claim(lt.db, app.registry, 1)).result()
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE konduit_tasks SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (stale.id,),
        )
    reclaimed = lt.submit(reclaim_expired_leases(lt.db, app.registry)).result()
    assert reclaimed == 1
    with psycopg.connect(app.database_url) as conn:
        conn.execute("UPDATE konduit_tasks SET run_at = now() WHERE id = %s", (stale.id,))
        conn.commit()
    (fresh,) = lt.submit(claim(lt.db, app.registry, 1)).result()
    assert fresh.id == stale.id and fresh.attempt == 2 and fresh.lease_token != stale.lease_token
    ok, _ = lt.submit(record(lt.db, app.registry, completion_for(fresh))).result()
    assert ok is Recorded.ENDED
    before = snapshot(app.database_url, handle.id)
    late, _ = lt.submit(record(lt.db, app.registry, completion_for(stale))).result()
    assert late is Recorded.LEASE_LOST
    assert snapshot(app.database_url, handle.id) == before
    attempts = before[3]
    assert [a[2] for a in attempts] == ["lost", "succeeded"]


def test_duplicate_completions_racing_record_exactly_once(loop_thread):
    """The same completion delivered by 8 connections at once: one records, seven are refused."""
    app, lt = loop_thread
    threads = [lt] + [LoopThread(app.database_url) for _ in range(7)]
    try:
        for _ in range(20):
            app.start("fence")
            (root,) = lt.submit(claim(lt.db, app.registry, 1)).result()
            barrier = threading.Barrier(len(threads))

            async def deliver(t: LoopThread, task=root, barrier=barrier) -> Recorded:
                barrier.wait(timeout=30)
                outcome, _ = await record(t.db, app.registry, completion_for(task))
                return outcome

            futures = [t.submit(deliver(t)) for t in threads]
            outcomes = [f.result(timeout=60) for f in futures]
            assert outcomes.count(Recorded.ENDED) == 1
            assert outcomes.count(Recorded.LEASE_LOST) == len(threads) - 1
            branches = lt.submit(claim(lt.db, app.registry, 10)).result()
            assert sorted(b.step for b in branches) == ["b0", "b1", "b2"]
            for b in branches:
                assert lt.submit(record(lt.db, app.registry, completion_for(b))).result()[0] \
                    is Recorded.ENDED
            (join,) = lt.submit(claim(lt.db, app.registry, 10)).result()
            lt.submit(record(lt.db, app.registry, completion_for(join))).result()
    finally:
        for t in threads[1:]:
            t.close()
    assert {e.status for e in app.list(limit=50)} == {"succeeded"}


__all__ = ["asyncio"]
