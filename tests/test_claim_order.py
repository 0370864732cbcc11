"""Claim order: within a priority the oldest execution's tasks come first, so a backlog drains
execution by execution (an old execution's join beats new executions' roots); the queues a
worker serves take turns, so one queue's backlog cannot starve another queue's one execution;
a retry waiting out its backoff is not claimed early.

Each order is checked against the claim statement itself (direct ``transitions.claim`` calls),
next to a control that runs the order the claim used before (``priority, run_at, id`` across
all queues) on the same rows and shows it would have failed; then end to end with a worker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

import pytest

import konduit
from konduit.core.model import Command
from konduit.db.database import Database
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed
from tests.support.scenario import run_scenario
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]
T = TypeVar("T")
WORKER = "worker-claim-order"

# What the claim took first before: ready tasks across all queues by priority, run_at, id.
OLD_ORDER = """
SELECT execution_id, step FROM konduit_tasks
WHERE status = 'ready' AND queue = ANY(%s) AND run_at <= clock_timestamp()
ORDER BY priority, run_at, id LIMIT %s"""


def fan(name: str, *, queue: str = "default", priority: int = 0) -> konduit.Workflow:
    """Two branches and their join."""
    wf = konduit.Workflow(name, version=1)
    a = wf.step(name="a", queue=queue, priority=priority)(lambda ctx: 1)
    b = wf.step(name="b", queue=queue, priority=priority)(lambda ctx: 2)
    wf.step(name="join", after=[a, b], queue=queue, priority=priority)(lambda ctx: 3)
    return wf


def single(name: str, *, queue: str = "default", priority: int = 0,
           retry: konduit.Retry | None = None) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name="work", queue=queue, priority=priority, retry=retry)(lambda ctx: 1)
    return wf


def run(url: str, workflows: list[konduit.Workflow],
        scenario: Callable[[Database, Registry, Client], Awaitable[T]]) -> T:
    return run_scenario(url, workflows, scenario, worker_id=WORKER)


async def claim(db: Database, registry: Registry, limit: int, queues: list[str] | None = None,
                turn: int = 0) -> list[Claimed]:
    rows = await transitions.claim(db, queues=queues or ["default"], workflows=registry.keys(),
                                   limit=limit, lease_seconds=15.0, worker_id=WORKER, turn=turn)
    return [Claimed.from_row(r) for r in rows]


async def sql(db: Database, text: str, *params: Any) -> list[Any]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute(text.encode(), params)
        return await cur.fetchall() if cur.description else []


async def succeed(db: Database, registry: Registry, task: Claimed) -> None:
    outcome, _ = await record(db, registry, task.completion("succeeded", payload_json="1",
                                                            payload=1))
    assert outcome is Recorded.ENDED


async def start_many(client: Client, workflow: str, n: int) -> list[UUID]:
    ids = [await client.start(workflow) for _ in range(n)]
    assert ids == sorted(ids), "execution ids (UUIDv7) sort in start order"
    return ids


def names(tasks: list[Claimed]) -> set[tuple[UUID, str]]:
    """Which tasks a claim took (it returns them in no particular order)."""
    return {(t.execution_id, t.step) for t in tasks}


# -- oldest execution first ----------------------------------------------------------------------


def test_the_first_executions_join_is_claimed_before_later_executions_roots(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        first, second, *later = await start_many(client, "fan", 20)
        branches = await claim(db, registry, limit=2)
        assert names(branches) == {(first, "a"), (first, "b")}
        for task in branches:
            await succeed(db, registry, task)  # the join of `first` is ready now
        # Control: the order the claim used before takes the 19 later executions' roots first.
        (old,) = await sql(db, OLD_ORDER, ["default"], 1)
        assert (old["execution_id"], old["step"]) == (second, "a")
        assert names(await claim(db, registry, limit=1)) == {(first, "join")}
        # ... then the next execution, whole, before the one after it.
        assert names(await claim(db, registry, limit=3)) == {
            (second, "a"), (second, "b"), (later[0], "a")}

    run(db_url, [fan("fan")], scenario)


def test_priority_comes_before_age(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        old = await start_many(client, "normal", 5)
        urgent = await client.start("urgent")  # the newest, at a lower priority number
        assert names(await claim(db, registry, limit=2)) == {(urgent, "work"), (old[0], "work")}

    run(db_url, [single("normal"), single("urgent", priority=-1)], scenario)


def test_a_retry_waiting_out_its_backoff_is_not_claimed_early_and_does_not_block(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        first, second = await start_many(client, "flaky", 2)
        (task,) = await claim(db, registry, limit=1)
        assert task.execution_id == first
        outcome, _ = await record(db, registry, task.completion(Command.RETRY, retry_delay=3600.0,
                                                                error="boom"))
        assert outcome is Recorded.RETRYING
        # The oldest execution's task is ready again but its backoff has not ended: the claim
        # passes over it (it is first in the index's order) to the next execution's.
        assert names(await claim(db, registry, limit=8)) == {(second, "work")}
        assert await claim(db, registry, limit=8) == []
        await sql(db, "UPDATE konduit_tasks SET run_at = now() - interval '1 second'"
                      " WHERE execution_id = %s", first)  # the backoff has ended
        (again,) = await claim(db, registry, limit=8)
        assert (again.execution_id, again.attempt) == (first, 2)

    run(db_url, [single("flaky", retry=konduit.Retry(max_attempts=3))], scenario)


def test_rows_another_claim_holds_are_skipped_not_waited_for(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        first, second, _ = await start_many(client, "fan", 3)
        async with db.transaction() as other:  # another worker's claim, not yet committed
            await other.conn.execute(
                b"SELECT id FROM konduit_tasks WHERE execution_id = %s FOR UPDATE", (first,))
            got = await asyncio.wait_for(claim(db, registry, limit=2), timeout=10)
            assert names(got) == {(second, "a"), (second, "b")}

    run(db_url, [fan("fan")], scenario)


def test_a_task_of_an_execution_that_stopped_is_not_claimed(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        first, second = await start_many(client, "fan", 2)
        # The instant between a cancel's execution write and its task writes, frozen.
        await sql(db, "UPDATE konduit_executions SET status = 'cancelled', finished_at = now()"
                      " WHERE id = %s", first)
        got = await claim(db, registry, limit=8)
        assert names(got) == {(second, "a"), (second, "b")}

    run(db_url, [fan("fan")], scenario)


# -- the queues take turns -----------------------------------------------------------------------


def test_a_queue_with_one_execution_is_served_beside_another_queues_backlog(db_url):
    queues = ["bulk", "tenant"]

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        bulk = await start_many(client, "bulk", 500)
        tenant = await client.start("tenant")
        # Control: the order the claim used before serves 500 bulk tasks first.
        old = await sql(db, OLD_ORDER, queues, 8)
        assert all(r["execution_id"] in bulk for r in old)
        # Each queue's first task, then each queue's second...; the tenant's share it has no
        # work for goes to the bulk queue.
        got = names(await claim(db, registry, limit=8, queues=queues))
        assert got == {(tenant, "work")} | {(e, "work") for e in bulk[:7]}

    wfs = [single("bulk", queue="bulk"), single("tenant", queue="tenant")]
    run(db_url, wfs, scenario)


def test_claims_of_one_task_serve_the_queues_in_turn(db_url):
    queues = ["bulk", "tenant"]

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        bulk = await start_many(client, "bulk", 20)
        tenant = await start_many(client, "tenant", 2)
        got = [names(await claim(db, registry, limit=1, queues=queues, turn=turn)).pop()
               for turn in range(5)]
        assert got == [(bulk[0], "work"), (tenant[0], "work"), (bulk[1], "work"),
                       (tenant[1], "work"), (bulk[2], "work")]

    wfs = [single("bulk", queue="bulk"), single("tenant", queue="tenant")]
    run(db_url, wfs, scenario)


# -- end to end, with a worker -------------------------------------------------------------------


class Log:
    """The order handlers ran in, across the worker's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[tuple[UUID, str]] = []

    def handler(self, result: int) -> Callable[[konduit.Context], int]:
        def run(ctx: konduit.Context) -> int:
            with self.lock:
                self.ran.append((ctx.execution_id, ctx.step))
            return result

        return run


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_worker_finishes_the_first_execution_before_starting_most_of_the_backlog(make_app):
    log = Log()
    wf = konduit.Workflow("backlog", version=1)
    a = wf.step(name="a")(log.handler(1))
    b = wf.step(name="b")(log.handler(2))
    wf.step(name="join", after=[a, b])(log.handler(3))
    app = make_app(wf)
    n = 200
    ids = [app.start("backlog").id for _ in range(n)]
    with running_worker(app, concurrency=4):
        wait_for(lambda: (ids[0], "join") in log.ran)
    before = log.ran[: log.ran.index((ids[0], "join"))]
    started = {execution for execution, _ in before}
    # First in, first out would run all 400 roots before any join. The join waits only for its
    # branches' outcomes to be recorded, while the worker keeps claiming: a few executions' worth.
    assert len(started) < n // 4, f"{len(started)} executions started before the first finished"


def test_a_worker_serves_a_queue_with_one_execution_among_its_first_tasks(make_app):
    log = Log()
    bulk = konduit.Workflow("bulk", version=1)
    bulk.step(name="work", queue="bulk")(log.handler(1))
    tenant = konduit.Workflow("tenant", version=1)
    tenant.step(name="work", queue="tenant")(log.handler(2))
    app = make_app(bulk, tenant)
    for _ in range(300):
        app.start("bulk")
    only = app.start("tenant").id
    with running_worker(app, concurrency=2, queues=("bulk", "tenant")):
        wait_for(lambda: (only, "work") in log.ran)
    assert log.ran.index((only, "work")) < 4, "the tenant's task waited behind the bulk queue"
