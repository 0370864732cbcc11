"""A fallback runs at most once per task (its start is recorded, committed, before it is called),
made deterministic in one process: each test stops one side where it matters and lets the other
act. The worker deaths themselves are in tests/test_fallback_once.py (real processes)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import konduit
from konduit.core.model import Command
from konduit.db.database import Database
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed, Executor
from konduit.worker.maintenance import Maintenance
from tests.test_lifecycle import claim_one, run, single, sql, status_of, worker_died

pytestmark = [pytest.mark.storage]

FALLBACK_TIMEOUT = 2.0


def counted(calls: list[int], gate: threading.Event | None = None,
            entered: threading.Event | None = None) -> Any:
    def fallback(ctx: konduit.Context) -> dict[str, str]:
        calls.append(ctx.attempt)
        if entered is not None:
            entered.set()
        if gate is not None:
            gate.wait(10)
        return {"from": "fallback"}

    return fallback


def sweeps(db: Database, registry: Registry) -> Maintenance:
    # lease_seconds=0: the server's uptime guard is not what these tests are about.
    return Maintenance(db, registry, Executor(db, fallback_timeout=FALLBACK_TIMEOUT),
                       lease_seconds=0.0, deadline_grace=0.0)


@pytest.mark.parametrize("path", ["sweep", "rescue"])
def test_a_fallback_its_caller_died_in_is_left_for_its_time_limit_then_never_called(db_url, path):
    calls: list[int] = []
    wf = single("died-in-fallback", deadline="30s", retry=konduit.Retry(max_attempts=1),
                fallback=counted(calls))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("died-in-fallback")
        task = await claim_one(db, registry)
        await sql(db, "UPDATE konduit_tasks SET deadline_at = now() - interval '5 seconds'")
        # Its worker recorded that the fallback starts, called it, and died in it.
        assert await db.one("task_start_fallback_if_unstarted", id=task.id,
                            lease_token=task.lease_token, settle_seconds=0.0)
        assert await db.one("task_start_fallback_if_unstarted", id=task.id,  # once only
                            lease_token=task.lease_token, settle_seconds=0.0) is None
        await worker_died(db, task)
        m = sweeps(db, registry)

        async def one_pass() -> None:
            if path == "sweep":
                (row,) = await db.all("task_list_past_deadline", grace_seconds=0.0, limit=10)
                await m._expire(row)
            else:
                (row,) = await db.all("task_list_rescuable", limit=10)
                await m._rescue(row)
            assert row["fallback_age"] is not None

        # Within the fallback's time limit its caller may still record what it returned.
        await one_pass()
        assert await status_of(db, execution_id) == ("running", {"work": "running"})
        # The write re-checks it too (a caller that read the task before the fallback started).
        early = Claimed.from_row((await db.all("task_list_past_deadline", grace_seconds=0.0,
                                               limit=10))[0])
        guarded = early.completion("timed_out", error="x", transition="expire",
                                   fallback_settle=FALLBACK_TIMEOUT + 1)
        assert (await record(db, registry, guarded))[0] is Recorded.LEASE_LOST
        # A rescue that would retry it does not either: a task whose fallback started is ending.
        async with db.transaction() as tx:
            assert await transitions.lose(tx, early.completion(
                Command.RETRY, retry_delay=0.0, transition="lose")) is None

        await sql(db, "UPDATE konduit_tasks SET fallback_started_at = now() - interval '10 s'")
        await one_pass()
        assert await status_of(db, execution_id) == ("failed", {"work": "timed_out"})
        ((error, attempt_outcome),) = [(r["error"], r["outcome"]) for r in await sql(
            db, "SELECT t.error, a.outcome FROM konduit_tasks t JOIN konduit_attempts a"
                " ON a.task_id = t.id")]
        assert "never returned" in error
        assert attempt_outcome == ("timed_out" if path == "sweep" else "lost")
        assert calls == []  # never called again

    run(db_url, [wf], scenario)


def test_a_live_worker_late_to_its_deadline_yields_to_the_sweep_running_the_fallback(db_url):
    calls: list[int] = []
    gate, entered = threading.Event(), threading.Event()
    wf = single("late-worker", deadline="30s", retry=konduit.Retry(max_attempts=1),
                fallback=counted(calls, gate, entered))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("late-worker")
        task = await claim_one(db, registry)
        await sql(db, "UPDATE konduit_tasks SET deadline_at = now() - interval '5 seconds'")
        m = sweeps(db, registry)
        (row,) = await db.all("task_list_past_deadline", grace_seconds=0.0, limit=10)
        sweep = asyncio.ensure_future(m._expire(row))
        assert await asyncio.to_thread(entered.wait, 10), "the sweep never called the fallback"
        # The task's own worker reaches its deadline while the sweep's fallback runs: it does
        # not call the fallback a second time, and records nothing.
        live = await Executor(db, fallback_timeout=FALLBACK_TIMEOUT).deadline_passed(
            registry.get("late-worker", 1), task, None)
        assert live.command is Command.YIELD and live.outcome is None
        assert (await record(db, registry, live))[0] is Recorded.LEASE_LOST
        assert await status_of(db, execution_id) == ("running", {"work": "running"})
        gate.set()
        await sweep
        assert await status_of(db, execution_id) == ("succeeded", {"work": "degraded"})
        assert calls == [1]

    run(db_url, [wf], scenario)
