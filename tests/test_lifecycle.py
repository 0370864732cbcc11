"""The task lifecycle's transitions under races, made deterministic: each test stops one side
between its read and its write, lets the other side act, then lets the first write — the
interleavings that broke before (River #1302: a rescuer overwrote a job that completed after
the rescuer's read)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

import pytest

import konduit
from konduit.core.model import Command
from konduit.core.requests import CancelRequest
from konduit.db.database import Database
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record, record_late_result
from konduit.engine.registry import Registry
from konduit.worker.config import WorkerConfig
from konduit.worker.executor import Claimed, Executor
from konduit.worker.maintenance import Maintenance
from konduit.worker.worker import Worker
from tests.support.scenario import run_scenario

pytestmark = [pytest.mark.storage]
T = TypeVar("T")
LIVE = "worker-live"

# The statement reclaim used before: fenced on token and status only, its expiry check was an
# earlier read. Kept here as the control that shows the race is real.
OLD_RECLAIM_WRITE = """
UPDATE konduit_tasks SET status = 'ready', run_at = clock_timestamp(), lease_token = NULL,
       lease_expires_at = NULL
WHERE id = %s AND lease_token = %s AND status = 'running' RETURNING id"""


def run(url: str, workflows: list[konduit.Workflow],
        scenario: Callable[[Database, Registry, Client], Awaitable[T]]) -> T:
    return run_scenario(url, workflows, scenario, worker_id=LIVE)


async def claim_one(db: Database, registry: Registry, lease_seconds: float = 15.0) -> Claimed:
    rows = await transitions.claim(db, queues=["default"], workflows=registry.keys(), limit=1,
                                   lease_seconds=lease_seconds, worker_id=LIVE)
    assert len(rows) == 1
    return Claimed.from_row(rows[0])


async def sql(db: Database, text: str, *params: Any) -> list[Any]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute(text.encode(), params)
        return await cur.fetchall() if cur.description else []


async def worker_died(db: Database, task: Claimed) -> None:
    """The lease ran out and its worker has not been heard from for longer than a lease."""
    await sql(db, "UPDATE konduit_tasks SET lease_expires_at = now() - interval '1 second'"
                  " WHERE id = %s", task.id)
    await sql(db, "UPDATE konduit_workers SET last_heartbeat_at = now() - interval '1 hour'")


async def status_of(db: Database, execution_id: UUID) -> tuple[str, dict[str, str]]:
    (ex,) = await sql(db, "SELECT status FROM konduit_executions WHERE id = %s", execution_id)
    tasks = await sql(db, "SELECT step, status FROM konduit_tasks WHERE execution_id = %s",
                      execution_id)
    return ex["status"], {t["step"]: t["status"] for t in tasks}


def maintenance(db: Database, registry: Registry) -> Maintenance:
    # lease_seconds=0: the server's uptime guard is not what these tests are about.
    return Maintenance(db, registry, Executor(db), lease_seconds=0.0, deadline_grace=0.0)


def single(name: str, **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step(**options)
    def work(ctx: konduit.Context) -> dict[str, str]:
        return {"from": "handler"}

    return wf


def test_reclaim_racing_a_live_heartbeat_keeps_the_workers_success(db_url):
    wf = single("rescue-race", retry=konduit.Retry(max_attempts=1))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("rescue-race")
        task = await claim_one(db, registry)
        await worker_died(db, task)
        (row,) = await db.all("task_list_rescuable", limit=10)  # the reclaimer's read
        # ... and before its write, the worker (only slow, not dead) is heard from again.
        held = await db.all("task_extend_leases_if_held", ids=[task.id],
                            lease_tokens=[task.lease_token], lease_seconds=15.0)
        assert [r["id"] for r in held] == [task.id]
        await db.run("worker_heartbeat", id=LIVE, running=1, abandoned=0, leader=None)
        # Control: the old write, fenced on the token alone, would take the task now.
        async with db.transaction() as tx:
            cur = await tx.conn.execute(OLD_RECLAIM_WRITE.encode(), (task.id, task.lease_token))
            assert await cur.fetchone() is not None, "the control should show the race"
            await tx.conn.execute(b"ROLLBACK")
        await maintenance(db, registry)._rescue(row)  # the reclaimer's write changes nothing
        outcome, _ = await record(db, registry, task.completion(
            "succeeded", payload_json='{"from":"handler"}', payload={"from": "handler"}))
        assert outcome is Recorded.ENDED
        assert await status_of(db, execution_id) == ("succeeded", {"work": "succeeded"})
        attempts = await sql(db, "SELECT outcome FROM konduit_attempts")
        assert [a["outcome"] for a in attempts] == ["succeeded"]

    run(db_url, [wf], scenario)


def test_reclaim_of_a_dead_workers_task_uses_the_steps_backoff_and_fallback(db_url):
    wf = konduit.Workflow("rescue-policy", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="30s", jitter=False),
             fallback=lambda ctx: {"from": "fallback"}, fallback_on_failure=True)
    def work(ctx: konduit.Context) -> dict[str, str]:
        return {"from": "handler"}

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("rescue-policy")
        task = await claim_one(db, registry)
        await worker_died(db, task)
        m = maintenance(db, registry)
        assert await m.rescue() == 1
        await asyncio.gather(*m.jobs.values())
        (row,) = await sql(db, "SELECT status, extract(epoch FROM run_at - now()) AS wait"
                               " FROM konduit_tasks")
        assert row["status"] == "ready" and 25 < row["wait"] <= 30  # backoff, not "retry now"
        await sql(db, "UPDATE konduit_tasks SET run_at = now()")
        second = await claim_one(db, registry)
        await worker_died(db, second)
        assert await m.rescue() == 1
        await asyncio.gather(*m.jobs.values())
        # Attempts exhausted: the fallback degrades it instead of failing the execution.
        assert await status_of(db, execution_id) == ("succeeded", {"work": "degraded"})
        ex = await client.get(execution_id)
        assert ex.output == {"from": "fallback"}
        attempts = await sql(db, "SELECT outcome FROM konduit_attempts ORDER BY attempt")
        assert [a["outcome"] for a in attempts] == ["lost", "lost"]

    run(db_url, [wf], scenario)


def test_a_live_workers_expired_lease_is_not_rescued_until_it_stays_expired_a_full_lease(db_url):
    wf = single("rescue-live")

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        await client.start("rescue-live")
        task = await claim_one(db, registry)
        await sql(db, "UPDATE konduit_tasks SET lease_expires_at = now() - interval '1 second'"
                      " WHERE id = %s", task.id)
        assert await db.all("task_list_rescuable", limit=10) == []  # its worker is alive
        # A worker that is alive but has not extended this lease for a whole lease has lost
        # track of the task: it is rescued after all.
        await sql(db, "UPDATE konduit_tasks SET lease_expires_at = now() - interval '16 seconds'"
                      " WHERE id = %s", task.id)
        assert [r["id"] for r in await db.all("task_list_rescuable", limit=10)] == [task.id]

    run(db_url, [wf], scenario)


@pytest.mark.parametrize("first", ["sweep", "worker"])
def test_deadline_sweep_racing_a_late_completion_ends_the_task_once(db_url, first):
    wf = single("sweep-race", deadline="30s", fallback=lambda ctx: {"from": "fallback"})

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("sweep-race")
        task = await claim_one(db, registry)
        await sql(db, "UPDATE konduit_tasks SET deadline_at = now() - interval '5 seconds'")
        (row,) = await db.all("task_list_past_deadline", grace_seconds=0.0, limit=10)
        late = task.completion("succeeded", payload_json='{"from":"handler"}',
                               payload={"from": "handler"})
        m = maintenance(db, registry)
        if first == "worker":
            assert (await record(db, registry, late))[0] is Recorded.ENDED
            await m._expire(row)  # read before the completion, written after: changes nothing
            assert await status_of(db, execution_id) == ("succeeded", {"work": "succeeded"})
            assert (await client.get(execution_id)).output == {"from": "handler"}
        else:
            await m._expire(row)
            assert (await record(db, registry, late))[0] is Recorded.LEASE_LOST
            assert await record_late_result(db, task.lease_token, late.payload_json, late.payload)
            assert await status_of(db, execution_id) == ("succeeded", {"work": "degraded"})
            assert (await client.get(execution_id)).output == {"from": "fallback"}
            sources = await sql(db, "SELECT source, payload FROM konduit_outputs ORDER BY source")
            assert [(s["source"], s["payload"]["from"]) for s in sources] == [
                ("fallback", "fallback"), ("late", "handler")]

    run(db_url, [wf], scenario)


def test_the_sweep_ends_a_retry_waiting_out_its_backoff_past_the_deadline(db_url):
    wf = single("sweep-ready", deadline="30s", retry=konduit.Retry(max_attempts=3))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("sweep-ready")
        task = await claim_one(db, registry)
        outcome, _ = await record(db, registry, task.completion(Command.RETRY, retry_delay=20.0,
                                                                error="boom"))
        assert outcome is Recorded.RETRYING
        await sql(db, "UPDATE konduit_tasks SET deadline_at = now() - interval '1 second'")
        m = maintenance(db, registry)
        assert await m.sweep_deadlines(set()) == 1
        await asyncio.gather(*m.jobs.values())
        assert await status_of(db, execution_id) == ("failed", {"work": "timed_out"})

    run(db_url, [wf], scenario)


def test_a_retry_whose_backoff_crosses_the_deadline_is_refused_by_its_statement(db_url):
    wf = single("retry-late", deadline="30s", retry=konduit.Retry(max_attempts=3))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        await client.start("retry-late")
        task = await claim_one(db, registry)
        outcome, _ = await record(db, registry, task.completion(Command.RETRY, retry_delay=60.0))
        assert outcome is Recorded.TOO_LATE  # the lease holds: the caller ends the task instead
        (row,) = await sql(db, "SELECT status FROM konduit_tasks")
        assert row["status"] == "running"

    run(db_url, [wf], scenario)


@pytest.mark.parametrize("first", ["cancel", "completion"])
def test_cancel_racing_a_completion(db_url, first):
    wf = konduit.Workflow("cancel-race", version=1)

    @wf.step()
    def a(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[a])
    def b(ctx: konduit.Context) -> int:
        return 2

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        execution_id = await client.start("cancel-race")
        task = await claim_one(db, registry)
        done = task.completion("succeeded", payload_json="1", payload=1)
        if first == "cancel":
            assert await client.cancel(CancelRequest(execution_id))
            assert (await record(db, registry, done))[0] is Recorded.LEASE_LOST
            assert await status_of(db, execution_id) == ("cancelled", {"a": "cancelled"})
        else:
            assert (await record(db, registry, done))[0] is Recorded.ENDED
            assert await client.cancel(CancelRequest(execution_id))
            assert await status_of(db, execution_id) == (
                "cancelled", {"a": "succeeded", "b": "cancelled"})
            # The claim re-checks the execution: nothing of it is claimed any more.
            assert await transitions.claim(db, queues=["default"], workflows=registry.keys(),
                                           limit=5, lease_seconds=15, worker_id=LIVE) == []

    run(db_url, [wf], scenario)


def test_a_handler_never_starts_after_its_executions_cancel_committed(db_url):
    started: list[float] = []
    wf = konduit.Workflow("cancel-start", version=1)

    @wf.step()
    async def work(ctx: konduit.Context) -> int:
        started.append(time.monotonic())
        return 1

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        worker = Worker(db, registry, WorkerConfig(concurrency=1))
        spec = registry.get("cancel-start")
        # Claimed, then cancelled before the handler starts: it never starts.
        first = await client.start("cancel-start")
        task = await claim_one(db, registry)
        assert await client.cancel(CancelRequest(first))
        assert await worker._start(spec, task) is None and started == []
        # The other order: the worker holds the task while it starts the handler; a cancel
        # arriving meanwhile waits until the handler has started, never the reverse.
        second = await client.start("cancel-start")
        task = await claim_one(db, registry)
        async with db.transaction() as tx:
            assert await transitions.hold(tx, task.id, task.lease_token)
            cancel = asyncio.create_task(client.cancel(CancelRequest(second)))
            done, _ = await asyncio.wait([cancel], timeout=0.5)
            assert not done, "the cancel must wait for the share lock"
            started.append(time.monotonic())  # the handler starts while the row is held
        assert await cancel
        assert await status_of(db, second) == ("cancelled", {"work": "cancelled"})

    run(db_url, [wf], scenario)


def test_two_reclaimers_and_the_owner_end_a_task_exactly_once(db_url):
    wf = single("rescue-many", retry=konduit.Retry(max_attempts=1))

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        for trial in range(20):
            execution_id = await client.start("rescue-many", idempotency_key=str(trial))
            task = await claim_one(db, registry)
            await worker_died(db, task)
            rows = await db.all("task_list_rescuable", limit=10)
            ms = [maintenance(db, registry) for _ in range(2)]
            late = task.completion("succeeded", payload_json="{}", payload={})
            results = await asyncio.gather(
                ms[0]._rescue(rows[0]), ms[1]._rescue(rows[0]), record(db, registry, late))
            ended = results[2][0] is Recorded.ENDED
            status, tasks = await status_of(db, execution_id)
            assert (status, tasks["work"]) == (("succeeded", "succeeded") if ended
                                               else ("failed", "failed"))
            n = await sql(db, "SELECT count(*) AS n FROM konduit_attempts a JOIN konduit_tasks t"
                              " ON t.id = a.task_id WHERE t.execution_id = %s", execution_id)
            assert n[0]["n"] == 1

    run(db_url, [wf], scenario)
