"""Each step of the completion round (:class:`konduit.engine.round.Round`), one at a time,
against a real database: the round is driven step by step inside a real pipelined transaction,
and what each step did is read back from the server (through that transaction where it has not
committed yet, or from another connection where a lock or a notification is the point)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest

import konduit
from konduit.bench.harness import claim
from konduit.core.model import Command, Completion, Outcome, Recorded, TaskAttempt
from konduit.core.payloads import content_hash
from konduit.db.database import Database, Tx
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.registry import Registry
from konduit.engine.round import Round

pytestmark = [pytest.mark.storage]
BOUND = 60.0  # no scenario may take longer


def two_branches_and_join() -> konduit.Workflow:
    """b0, b1 -> join: the join fires when both branches ended."""
    wf = konduit.Workflow("round", version=1)

    @wf.step()
    async def b0(ctx: konduit.Context) -> int:
        return 1

    @wf.step()
    async def b1(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[b0, b1], join=konduit.Join.all_done())
    async def join(ctx: konduit.Context) -> int:
        return 2

    return wf


@dataclasses.dataclass
class World:
    db: Database
    registry: Registry
    client: Client
    url: str

    async def leased(self, executions: int) -> dict[uuid.UUID, dict[str, TaskAttempt]]:
        """Start ``executions`` executions and lease every branch: id -> step -> attempt."""
        ids = [await self.client.start("round") for _ in range(executions)]
        tasks = await claim(self.db, self.registry, 2 * executions)
        by_execution: dict[uuid.UUID, dict[str, TaskAttempt]] = {i: {} for i in ids}
        for t in tasks:
            by_execution[t.execution_id][t.step] = t
        assert all(len(steps) == 2 for steps in by_execution.values())
        return by_execution

    def round(self, batch: list[Completion]) -> Round:
        return Round(self.registry, batch)


def done(task: TaskAttempt) -> Completion:
    return task.completion(Outcome.SUCCEEDED, payload_json="1", payload=1)


def scenario(url: str, body: Callable[[World], Awaitable[None]]) -> None:
    async def main() -> None:
        db = Database(url, min_size=1, max_size=3)
        await db.open()
        registry = Registry([two_branches_and_join()])
        client = Client(db, registry)
        await client.register_all()
        try:
            await asyncio.wait_for(body(World(db, registry, client, url)), BOUND)
        finally:
            await db.close()

    asyncio.run(main())


@asynccontextmanager
async def pipelined(db: Database) -> AsyncIterator[Tx]:
    async with db.transaction(pipeline=True) as tx:
        yield tx


async def rows(tx: Tx, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read back inside the round's own transaction (what it wrote has not committed)."""
    cur = await tx.conn.execute(sql, params)
    return [tuple(r.values()) if isinstance(r, dict) else tuple(r) for r in await cur.fetchall()]


async def next_note(listener: psycopg.AsyncConnection[Any]) -> str:
    """The payload of the next notification ``listener`` (LISTENing) receives."""
    async for note in listener.notifies(timeout=BOUND, stop_after=1):
        return note.payload
    raise AssertionError("no notification")


async def fenced(world: World, tx: Tx, batch: list[Completion]) -> Round:
    r = world.round(batch)
    await r.fence(tx, await r.lock_executions(tx))
    return r


def test_lock_executions_holds_every_row_of_the_round_in_id_order(db_url: str) -> None:
    async def body(w: World) -> None:
        leased = await w.leased(3)
        batch = [done(t) for steps in reversed(leased.values()) for t in steps.values()]
        r = w.round(batch)
        async with await psycopg.AsyncConnection.connect(w.url, autocommit=True) as other:
            async with pipelined(w.db) as tx:
                locked = await (await r.lock_executions(tx))()
                assert [row["id"] for row in locked] == sorted(leased)
                for eid in leased:
                    with pytest.raises(psycopg.errors.LockNotAvailable):
                        await other.execute("SELECT 1 FROM konduit_executions WHERE id = %s"
                                            " FOR NO KEY UPDATE NOWAIT", (eid,))
            # Committed: the locks are gone with the transaction.
            for eid in leased:
                await other.execute("SELECT 1 FROM konduit_executions WHERE id = %s"
                                    " FOR NO KEY UPDATE NOWAIT", (eid,))

    scenario(db_url, body)


def test_fence_ends_only_tasks_whose_lease_still_holds(db_url: str) -> None:
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        good = done(steps["b0"])
        stale = dataclasses.replace(done(steps["b1"]), lease_token=uuid.uuid4())
        async with pipelined(w.db) as tx:
            r = await fenced(w, tx, [good, stale, good])  # good twice: a redelivery
            assert set(r.ended) == {good.task_id}
            assert r.kept == [good]
            statuses = dict(await rows(tx, "SELECT step, status FROM konduit_tasks"
                                           " WHERE execution_id = %s", eid))
            assert statuses == {"b0": "succeeded", "b1": "running"}
        assert r.results() == [(Recorded.ENDED, None), (Recorded.LEASE_LOST, None),
                               (Recorded.LEASE_LOST, None)]

    scenario(db_url, body)


def test_fence_ends_a_failure_one_statement_at_a_time(db_url: str) -> None:
    """A failed outcome may only end a hedged attempt (the fence tries the drop first, so the
    terminal write is not sent with the locks); a task that is not hedged still ends."""
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        failed = steps["b1"].completion(Outcome.FAILED, error="boom")
        async with pipelined(w.db) as tx:
            r = await fenced(w, tx, [done(steps["b0"]), failed])
            assert set(r.ended) == {steps["b0"].id, steps["b1"].id} and not r.dropped
            statuses = dict(await rows(tx, "SELECT step, status FROM konduit_tasks"
                                           " WHERE execution_id = %s", eid))
            assert statuses == {"b0": "succeeded", "b1": "failed"}

    scenario(db_url, body)


def test_store_outputs_keeps_each_payload_once_by_content(db_url: str) -> None:
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        async with pipelined(w.db) as tx:
            r = await fenced(w, tx, [done(steps["b0"])])
            await r.store_outputs(tx)
            await r.store_outputs(tx)  # the same outcome again stores nothing new
            stored = await rows(tx, "SELECT step, map_index, content_hash, payload"
                                    " FROM konduit_outputs WHERE execution_id = %s", eid)
            assert stored == [("b0", 0, content_hash("1"), 1)]

    scenario(db_url, body)


def test_close_attempts_closes_the_attempts_that_ended_only(db_url: str) -> None:
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        stale = dataclasses.replace(done(steps["b1"]), lease_token=uuid.uuid4())
        async with pipelined(w.db) as tx:
            r = await fenced(w, tx, [done(steps["b0"]), stale])
            await r.close_attempts(tx)
            attempts = dict(await rows(
                tx, "SELECT t.step, a.outcome FROM konduit_attempts a"
                    " JOIN konduit_tasks t ON t.id = a.task_id WHERE t.execution_id = %s", eid))
            assert attempts == {"b0": "succeeded", "b1": None}

    scenario(db_url, body)


def test_read_join_state_reads_the_touched_steps_of_running_executions(db_url: str) -> None:
    async def body(w: World) -> None:
        leased = await w.leased(2)
        first, second = sorted(leased)
        # The second execution's branch ends with a stale lease: nothing of it is decided.
        batch = [done(leased[first]["b0"]),
                 dataclasses.replace(done(leased[second]["b0"]), lease_token=uuid.uuid4())]
        async with pipelined(w.db) as tx:
            r = await fenced(w, tx, batch)
            await r.read_join_state(tx)
            assert [(a.execution_id, [c.step for c in cs]) for a, cs in r.deciding] \
                == [(first, ["b0"])]
            (advancer, _), = r.deciding
            assert set(advancer.loaded) == {"b0", "join"}  # the ended step and its downstream
            assert advancer.loaded["join"].state.up_pending == 2  # not decided yet

    scenario(db_url, body)


def test_decide_fires_the_join_once_and_write_decisions_records_it(db_url: str) -> None:
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()

        async def decided(task: TaskAttempt) -> Round:
            async with pipelined(w.db) as tx:
                r = await fenced(w, tx, [done(task)])
                await r.read_join_state(tx)
                await r.decide()
                join = await rows(tx, "SELECT up_pending, fired_at IS NOT NULL"
                                      " FROM konduit_steps WHERE execution_id = %s"
                                      " AND step = 'join'", eid)
                assert join == [(2 if task.step == "b0" else 1, False)]  # deferred: not written
                await r.write_decisions(tx)
                join = await rows(tx, "SELECT up_pending, fired_at IS NOT NULL"
                                      " FROM konduit_steps WHERE execution_id = %s"
                                      " AND step = 'join'", eid)
                assert join == [(1 if task.step == "b0" else 0, task.step == "b1")]
            return r

        early = await decided(steps["b0"])
        assert early.advanced[eid].fired == [] and early.waking == []
        last = await decided(steps["b1"])
        assert last.advanced[eid].fired == ["join"]
        assert last.waking == [("default", (eid, "join"))]
        (join,) = await claim(w.db, w.registry, 2)
        assert join.step == "join" and join.execution_id == eid

    scenario(db_url, body)


def test_notify_wakes_only_queues_the_caller_did_not_claim_from(db_url: str) -> None:
    async def body(w: World) -> None:
        leased = await w.leased(2)
        async with await psycopg.AsyncConnection.connect(w.url, autocommit=True) as listener:
            await listener.execute("LISTEN konduit_ready")

            async def last_round(eid: uuid.UUID, taken: set[tuple[uuid.UUID, str]]) -> None:
                r = w.round([done(t) for t in leased[eid].values()])

                async def claims(tx: Tx) -> set[tuple[uuid.UUID, str]]:
                    return taken

                await w.db.atomic(lambda tx: r.run(tx, claims), pipeline=True)
                assert r.advanced[eid].fired == ["join"]

            first, second = sorted(leased)
            await last_round(first, set())
            assert await next_note(listener) == "default"
            # The caller claimed the join it made ready: nobody else needs waking. A marker
            # sent after the round commits arrives first, so the round sent nothing.
            await last_round(second, {(second, "join")})
            await listener.execute("SELECT pg_notify('konduit_ready', 'marker')")
            assert await next_note(listener) == "marker"

    scenario(db_url, body)


def test_run_answers_in_batch_order_and_decides_afresh_after_a_rollback(db_url: str) -> None:
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        b0 = done(steps["b0"])
        retry = steps["b1"].completion(Command.RETRY, error="again", retry_delay=0.0)
        r = w.round([b0, retry, b0])

        class Conflict(Exception):
            pass

        with pytest.raises(Conflict):  # the body runs, then its transaction rolls back
            async with pipelined(w.db) as tx:
                await r.run(tx)
                assert set(r.ended) == {b0.task_id} and r.moved == {retry.task_id:
                                                                    Recorded.RETRYING}
                raise Conflict
        await w.db.atomic(lambda tx: r.run(tx), pipeline=True)
        advanced = r.advanced[eid]
        assert r.results() == [(Recorded.ENDED, advanced), (Recorded.RETRYING, None),
                               (Recorded.LEASE_LOST, None)]
        assert advanced.fired == []  # b1 goes again: the join still waits for it
        with psycopg.connect(w.url) as conn:
            statuses = dict(conn.execute("SELECT step, status FROM konduit_tasks"
                                         " WHERE execution_id = %s", (eid,)).fetchall())
        assert statuses == {"b0": "succeeded", "b1": "ready"}

    scenario(db_url, body)


def test_a_claim_sent_with_the_commit_wakes_others_only_for_what_it_left_ready(db_url: str) -> None:
    """A worker's round sends its claim without waiting for the rows (they come back with the
    COMMIT), so it cannot say what it took: the wake-up asks the server, after the claim, whether
    a task the round made ready is still ready."""
    async def body(w: World) -> None:
        leased = await w.leased(2)
        async with await psycopg.AsyncConnection.connect(w.url, autocommit=True) as listener:
            await listener.execute("LISTEN konduit_ready")

            async def last_round(eid: uuid.UUID, limit: int) -> list[dict[str, Any]]:
                r = w.round([done(t) for t in leased[eid].values()])
                sent: list[Callable[[], Awaitable[transitions.Claim]]] = []

                async def claims(tx: Tx) -> None:
                    sent.clear()
                    if limit:
                        sent.append(await transitions.claim_later(
                            tx, ["default"], w.registry.keys(), limit, 30.0, "round-test"))

                await w.db.atomic(lambda tx: r.run(tx, claims), pipeline=True)
                assert r.advanced[eid].fired == ["join"]
                return list(await sent[-1]()) if sent else []

            first, second = sorted(leased)
            # The claim took the join the round made ready (its rows read after the commit):
            # nobody else needs waking, so the marker sent after the round arrives first.
            (join,) = await last_round(first, 1)
            assert (join["execution_id"], join["step"]) == (first, "join")
            await listener.execute("SELECT pg_notify('konduit_ready', 'marker')")
            assert await next_note(listener) == "marker"
            # Nothing claimed: the join is still ready after the round, so its queue is woken.
            assert await last_round(second, 0) == []
            assert await next_note(listener) == "default"

    scenario(db_url, body)


def test_the_join_state_read_ahead_sees_a_sibling_that_committed_while_it_waited_for_the_lock(
        db_url: str) -> None:
    """The round reads the join state it needs in its first round trip, behind the lock; the
    server runs that read only once the lock is granted, as a statement of its own, so it sees
    the sibling that held the lock: the join fires once, in the second round."""
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        first, second = w.round([done(steps["b0"])]), w.round([done(steps["b1"])])
        async with await psycopg.AsyncConnection.connect(w.url, autocommit=True) as observer:
            async with pipelined(w.db) as tx:
                await first.run(tx)
                assert first.advanced[eid].fired == []
                late = asyncio.create_task(w.db.atomic(lambda tx: second.run(tx), pipeline=True))
                while not (await (await observer.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()")).fetchone())[0]:
                    assert not late.done()
                    await asyncio.sleep(0.01)
            await late
        assert second.ahead is not None and {(eid, "b1"), (eid, "join")} <= second.ahead[0]
        assert second.advanced[eid].fired == ["join"]

    scenario(db_url, body)


def test_a_completion_that_names_no_known_workflow_reads_its_join_state_after_the_locks(
        db_url: str) -> None:
    """Sweeps and wakes name no workflow, and a task's version may be one this process does not
    run: the round then reads the join state once the locked rows name the workflow."""
    async def body(w: World) -> None:
        ((eid, steps),) = (await w.leased(1)).items()
        b0 = dataclasses.replace(done(steps["b0"]), workflow=None)
        b1 = dataclasses.replace(done(steps["b1"]), workflow=("round", 99))
        r = w.round([b0, b1])
        await w.db.atomic(lambda tx: r.run(tx), pipeline=True)
        assert r.ahead is None
        assert r.advanced[eid].fired == ["join"]

    scenario(db_url, body)
