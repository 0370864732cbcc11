"""Outcomes of many executions that finish together are recorded in one transaction.

The completer's batch (:func:`konduit.engine.completer.record_many`, fed by the worker's
:class:`~konduit.worker.batcher.CompletionBatcher` with ``max_executions``) locks every execution
of the batch in id order, writes all their tasks, outputs and attempts set-based, then makes one
fan-in decision per execution. These tests count the transactions (those the completer opened,
and on the server's side those that wrote the rows), check that every join fires exactly once (in
one process, and across processes finishing together), and that one completion the database
refuses, or one whose lease is gone, does not cost the others theirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import queue
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

import konduit
from konduit.bench.harness import claim
from konduit.core.model import Command, Outcome
from konduit.core.requests import CancelRequest
from konduit.db.database import Database
from konduit.engine.client import Client
from konduit.engine.completer import Completion, Recorded, record_many
from konduit.engine.registry import Registry
from konduit.errors import DatabaseError
from konduit.worker.batcher import CompletionBatcher, Result
from konduit.worker.executor import Claimed

pytestmark = [pytest.mark.storage]
T = TypeVar("T")
BOUND = 60.0  # no wait in these tests may take longer than this


def branches_and_join(width: int, name: str) -> konduit.Workflow:
    """``width`` root branches -> join (all_done, so a failed branch still lets it fire)."""
    wf = konduit.Workflow(name, version=1)
    branches = []
    for i in range(width):

        async def branch(ctx: konduit.Context) -> int:
            return 1

        branches.append(wf.step(name=f"b{i}")(branch))

    @wf.step(after=branches, join=konduit.Join.all_done())
    async def join(ctx: konduit.Context) -> int:
        return len(ctx.upstream)

    return wf


def done(task: Claimed) -> Completion:
    return task.completion("succeeded", payload_json="1", payload=1)


def run(url: str, workflows: list[konduit.Workflow],
        scenario: Callable[[Database, Registry, Client], Awaitable[T]], *, pool: int = 4) -> T:
    async def main() -> T:
        db = Database(url, min_size=1, max_size=pool)
        await db.open()
        registry = Registry(workflows)
        client = Client(db, registry)
        await client.register_all()
        try:
            return await asyncio.wait_for(scenario(db, registry, client), BOUND)
        finally:
            await db.close()

    return asyncio.run(main())


async def through_batcher(db: Database, registry: Registry, completions: list[Completion]
                          ) -> list[Result | BaseException]:
    """Queue every completion before the batching loop starts, as the worker's batcher sees
    outcomes that ended together, and return each submitter's result (or error)."""
    batcher = CompletionBatcher(lambda group: record_many(db, registry, group),
                                max_batch=500, max_executions=100)
    submitted = [asyncio.create_task(batcher.submit(c)) for c in completions]
    while batcher.queue.qsize() < len(completions):
        await asyncio.sleep(0)
    loop = asyncio.create_task(batcher.run())
    try:
        return list(await asyncio.gather(*submitted, return_exceptions=True))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def joins_per_execution(db: Database, execution_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute(
            "SELECT e.id, count(t.id) AS n FROM unnest(%s::uuid[]) AS e(id)"
            " LEFT JOIN konduit_tasks t ON t.execution_id = e.id AND t.step = 'join'"
            " GROUP BY e.id", (execution_ids,))
        return {r["id"]: r["n"] for r in await cur.fetchall()}


def test_outcomes_of_fifty_executions_are_recorded_in_two_transactions(db_url):
    executions, width = 50, 20
    wf = branches_and_join(width, "across-50")

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        ids = [await client.start(wf.name) for _ in range(executions)]
        tasks = await claim(db, registry, executions * width)
        assert len(tasks) == executions * width
        completions = [done(t) for t in tasks]
        transactions = 0
        original = db.transaction

        def counted(**options: Any) -> Any:
            nonlocal transactions
            transactions += 1
            return original(**options)

        db.transaction = counted  # type: ignore[method-assign]
        try:
            results = await through_batcher(db, registry, completions)
        finally:
            db.transaction = original  # type: ignore[method-assign]
        assert all(isinstance(r, tuple) and r[0] is Recorded.ENDED for r in results), results
        # 1,000 outcomes, 500 a round: two transactions.
        assert transactions == 2
        # Every join fired once, by exactly one decision.
        fired = [r for r in results if isinstance(r, tuple) and r[1] is not None
                 and "join" in r[1].fired]
        assert len({id(r[1]) for r in fired}) == executions
        assert await joins_per_execution(db, ids) == {e: 1 for e in ids}
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT count(DISTINCT xmin::text) AS n FROM konduit_tasks WHERE step <> 'join'")
            row = await cur.fetchone()
        # And on the server's side: every branch row and every join row was written by one of
        # two transactions (a row's xmin is the transaction that wrote it).
        assert row is not None and row["n"] == 2
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT count(*) AS n FROM konduit_tasks WHERE step = 'join' AND xmin::text NOT IN"
                " (SELECT xmin::text FROM konduit_tasks WHERE step <> 'join')")
            row = await cur.fetchone()
        assert row is not None and row["n"] == 0

    run(db_url, [wf], scenario, pool=1)


def test_a_fenced_out_and_a_refused_completion_do_not_cost_the_others_theirs(db_url):
    executions, width = 4, 3
    wf = branches_and_join(width, "across-bad")

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        ids = [await client.start(wf.name) for _ in range(executions)]
        tasks = await claim(db, registry, executions * width)
        by_execution: dict[uuid.UUID, list[Claimed]] = {}
        for t in tasks:
            by_execution.setdefault(t.execution_id, []).append(t)
        stale_task = by_execution[ids[0]][0]
        refused_task = by_execution[ids[1]][0]
        completions = []
        for t in tasks:
            if t is stale_task:
                # A worker whose lease was taken over: its token no longer holds the task.
                completions.append(dataclasses.replace(done(t), lease_token=uuid.uuid4()))
            elif t is refused_task:
                # An outcome the tasks table's CHECK refuses (none of Outcome's: forced past the
                # type): the whole statement fails.
                refused = t.completion(Outcome.FAILED)
                object.__setattr__(refused, "outcome", "exploded")
                completions.append(refused)
            else:
                completions.append(done(t))
        results = await through_batcher(db, registry, completions)
        outcome = dict(zip([c.task_id for c in completions], results, strict=True))
        assert outcome[stale_task.id] == (Recorded.LEASE_LOST, None)
        refused = outcome[refused_task.id]
        assert isinstance(refused, DatabaseError) and "23514" in str(refused), refused
        others = [r for tid, r in outcome.items() if tid not in (stale_task.id, refused_task.id)]
        assert len(others) == executions * width - 2
        assert all(isinstance(r, tuple) and r[0] is Recorded.ENDED for r in others), others
        # The executions with every branch recorded fired their join; the two others wait for
        # the branch still leased.
        assert await joins_per_execution(db, ids) == {ids[0]: 0, ids[1]: 0, ids[2]: 1, ids[3]: 1}
        # The stale one's real owner and the refused one's retry (as a failure) still record.
        (late,) = await record_many(db, registry, [done(stale_task)])
        assert late[0] is Recorded.ENDED and late[1] is not None and late[1].fired == ["join"]
        (failed,) = await record_many(db, registry, [refused_task.completion("failed")])
        assert failed[0] is Recorded.ENDED and failed[1] is not None and failed[1].fired == ["join"]
        assert await joins_per_execution(db, ids) == {e: 1 for e in ids}

    run(db_url, [wf], scenario)


def test_retries_ride_in_the_same_transaction_as_the_outcomes(db_url):
    executions, width = 3, 2
    wf = branches_and_join(width, "across-retry")

    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        ids = [await client.start(wf.name) for _ in range(executions)]
        tasks = await claim(db, registry, executions * width)
        retried = [t for t in tasks if t.step == "b0"]
        completions = [t.completion(Command.RETRY, error="boom", retry_delay=30.0) if t.step == "b0"
                       else done(t) for t in tasks]
        transactions = 0
        original = db.transaction

        def counted(**options: Any) -> Any:
            nonlocal transactions
            transactions += 1
            return original(**options)

        db.transaction = counted  # type: ignore[method-assign]
        try:
            results = await through_batcher(db, registry, completions)
        finally:
            db.transaction = original  # type: ignore[method-assign]
        assert transactions == 1
        assert all(isinstance(r, tuple) for r in results), results
        assert [r[0] for r in results] == [  # type: ignore[index]
            Recorded.RETRYING if c.command is Command.RETRY else Recorded.ENDED
            for c in completions]
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT status, count(*) AS n, bool_and(run_at > clock_timestamp()) AS later"
                " FROM konduit_tasks WHERE id = ANY(%s) GROUP BY status",
                ([t.id for t in retried],))
            rows = await cur.fetchall()
        assert [(r["status"], r["n"], r["later"]) for r in rows] == [("ready", executions, True)]
        assert await joins_per_execution(db, ids) == {e: 0 for e in ids}  # b0 has not ended
        # A retried task's lease is gone: its late outcome changes nothing.
        (late,) = await record_many(db, registry, [done(retried[0])])
        assert late == (Recorded.LEASE_LOST, None)

    run(db_url, [wf], scenario)


# -- the batcher's cross-execution rounds (its one dependency scripted, as in test_batcher) ----


def _pure(record_group: Callable[[list[Completion]], Awaitable[list[Result]]],
          completions: list[Completion], **options: Any) -> list[Result | BaseException]:
    async def go() -> list[Result | BaseException]:
        batcher = CompletionBatcher(record_group, **options)
        submitted = [asyncio.create_task(batcher.submit(c)) for c in completions]
        while batcher.queue.qsize() < len(completions):
            await asyncio.sleep(0)
        loop = asyncio.create_task(batcher.run())
        try:
            return list(await asyncio.wait_for(
                asyncio.gather(*submitted, return_exceptions=True), BOUND))
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)

    return asyncio.run(go())


def _fake(execution_id: uuid.UUID, task_id: int) -> Completion:
    return Completion(task_id=task_id, lease_token=uuid.uuid4(), execution_id=execution_id,
                      step=f"s{task_id}", map_index=0, attempt=1, outcome="succeeded")


def test_a_round_takes_at_most_max_executions_and_keeps_the_order():
    executions = [uuid.uuid4() for _ in range(5)]
    completions = [_fake(executions[i // 2], i) for i in range(10)]  # two per execution
    calls: list[list[int]] = []

    async def record_group(batch: list[Completion]) -> list[Result]:
        calls.append([c.task_id for c in batch])
        return [(Recorded.ENDED, None) for _ in batch]

    results = _pure(record_group, completions, max_batch=500, max_executions=2)
    assert results == [(Recorded.ENDED, None)] * 10
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    calls.clear()
    _pure(record_group, completions, max_batch=3, max_executions=100)
    assert calls == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_a_refused_round_is_split_per_execution_then_per_outcome():
    executions = [uuid.uuid4() for _ in range(3)]
    completions = [_fake(executions[i // 2], i) for i in range(6)]
    bad = 3  # the second completion of the second execution
    calls: list[list[int]] = []

    async def record_group(batch: list[Completion]) -> list[Result]:
        calls.append([c.task_id for c in batch])
        if any(c.task_id == bad for c in batch):
            raise DatabaseError("refused")
        return [(Recorded.ENDED, None) for _ in batch]

    results = _pure(record_group, completions, max_executions=100)
    assert calls == [[0, 1, 2, 3, 4, 5], [0, 1], [2, 3], [2], [3], [4, 5]]
    assert isinstance(results[bad], DatabaseError)
    assert [r for i, r in enumerate(results) if i != bad] == [(Recorded.ENDED, None)] * 5


# -- finishers in several processes, released together ------------------------------------------

ACROSS_PROCESSES = branches_and_join(4, "across-processes")


def _finisher(url: str, work: Any, answers: Any, barrier: Any) -> None:
    """A process that records the batches it is sent, each released by the barrier at the same
    moment as the other processes' batches of the same executions."""
    async def main() -> None:
        db = Database(url, min_size=1, max_size=2)
        await db.open()
        registry = Registry([ACROSS_PROCESSES])
        try:
            while True:
                batch = work.get(timeout=BOUND)
                if batch is None:
                    return
                async with db.connection():
                    pass  # a connection is open before the barrier: all leave it at once
                barrier.wait(timeout=BOUND)
                results = await record_many(db, registry, batch)
                fired = sorted({str(c.execution_id) for c, (_, adv) in zip(batch, results, strict=True)
                                if adv is not None and "join" in adv.fired})
                answers.put(([r.value for r, _ in results], fired))
        finally:
            await db.close()

    asyncio.run(main())


def test_simultaneous_finishers_in_several_processes_fire_each_join_once(db_url):
    processes, executions, trials = 4, 12, 5
    width = 4  # branch i of every execution goes to process i: each batch spans every execution
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    work = [ctx.Queue() for _ in range(processes)]
    answers: Any = ctx.Queue()
    procs = [ctx.Process(target=_finisher, args=(db_url, work[i], answers, barrier), daemon=True)
             for i in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in range(trials):
            async def prepare(db: Database, registry: Registry, client: Client
                              ) -> tuple[list[uuid.UUID], list[Claimed]]:
                ids = [await client.start(ACROSS_PROCESSES.name) for _ in range(executions)]
                return ids, await claim(db, registry, executions * width)

            ids, tasks = run(db_url, [ACROSS_PROCESSES], prepare)
            assert len(tasks) == executions * width and {t.execution_id for t in tasks} == set(ids)
            for i in range(processes):
                work[i].put([done(t) for t in tasks if t.step == f"b{i}"])
            fired: list[str] = []
            for _ in range(processes):
                try:
                    outcomes, fired_here = answers.get(timeout=BOUND)
                except queue.Empty:
                    raise AssertionError("a finisher process did not answer") from None
                assert set(outcomes) == {"ended"}
                fired.extend(fired_here)
            async def joins(db: Database, registry: Registry, client: Client,
                            ids: list[uuid.UUID] = ids) -> dict[uuid.UUID, int]:
                return await joins_per_execution(db, ids)

            # Exactly one decision per execution fired its join, and one join task exists.
            assert run(db_url, [ACROSS_PROCESSES], joins) == {e: 1 for e in ids}
            assert sorted(fired) == sorted(str(e) for e in ids)

            async def discard(db: Database, registry: Registry, client: Client,
                              ids: list[uuid.UUID] = ids) -> None:
                for e in ids:  # so the next trial's claim takes its branches, not these joins
                    await client.cancel(CancelRequest(e))

            run(db_url, [ACROSS_PROCESSES], discard)
    finally:
        for w in work:
            w.put(None)
        for p in procs:
            p.join(timeout=BOUND)
            if p.is_alive():
                p.kill()
