"""A harness that makes sibling branches of one join finish at the same instant.

Each branch completion runs on its own thread, event loop and database connection; a
``threading.Barrier`` releases them together, so the completions collide in PostgreSQL instead of
arriving one by one. The completion function is a parameter, so the same harness runs the
engine's protocol and the naive check of seed 000 (which can also be held, deterministically,
between its write and its check: the interleaving that makes it stall).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import konduit
from konduit.bench.harness import LoopThread, claim
from konduit.core.advance import TaskEnded
from konduit.db.database import Database
from konduit.engine.completer import Completion, Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed

WORKER_ID = "harness"

CompleteFn = Callable[[Database, Registry, Claimed], Awaitable[object]]


def fan_in_workflow(
    width: int, name: str | None = None, join_policy: konduit.Join | None = None
) -> konduit.Workflow:
    """root -> b0..b{width-1} -> join."""
    wf = konduit.Workflow(name or f"fan-in-{width}", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> int:
        return 0

    branches = []
    for i in range(width):

        def branch(ctx: konduit.Context) -> int:
            return 1

        branches.append(wf.step(name=f"b{i}", after=[root])(branch))

    @wf.step(after=branches, join=join_policy or konduit.Join.all_done())
    def join(ctx: konduit.Context) -> int:
        return len(ctx.upstream)

    return wf


def completion_for(task: Claimed, outcome: str = "succeeded") -> Completion:
    if outcome == "succeeded":
        return task.completion(outcome, payload_json="1", payload=1)
    return task.completion(outcome)


async def engine_complete(db: Database, registry: Registry, task: Claimed) -> object:
    outcome, _ = await record(db, registry, completion_for(task))
    assert outcome is Recorded.ENDED
    return outcome


async def _write_then_check(
    db: Database, task: Claimed, pause: threading.Barrier | None, lock: bool
) -> bool:
    """Seed 000's check in one transaction: mark this branch done, read its siblings, dispatch
    the join if all are terminal. ``pause`` holds every finisher between its write and its
    check (its transaction still open); ``lock`` takes the execution row lock after that pause,
    before the check (the seed's fix); without the lock, ``pause`` also holds every finisher
    again after its check, so that all check before any commits. Returns whether this finisher
    decided to fire the join: the join row's unique key would hide a second insert, the
    decision cannot hide."""
    async with db.transaction() as tx:
        await tx.conn.execute(
            "UPDATE konduit_tasks SET status = 'succeeded', lease_token = NULL,"
            " lease_expires_at = NULL, finished_at = clock_timestamp()"
            " WHERE id = %s AND lease_token = %s AND status = 'running'",
            (task.id, task.lease_token),
        )
        if pause is not None:
            # Blocks this branch's own loop thread, which is all it runs.
            pause.wait(timeout=30)
        if lock:
            await tx.conn.execute(
                "SELECT 1 FROM konduit_executions WHERE id = %s FOR UPDATE", (task.execution_id,)
            )
        cur = await tx.conn.execute(
            "SELECT status FROM konduit_tasks WHERE execution_id = %s AND step LIKE 'b%%'",
            (task.execution_id,),
        )
        statuses = [r["status"] for r in await cur.fetchall()]
        fire = bool(statuses) and all(s in ("succeeded", "failed") for s in statuses)
        if fire:
            await tx.conn.execute(
                "INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, queue,"
                " max_attempts) VALUES (%s, %s, 'join', 0, 'default', 1)"
                " ON CONFLICT DO NOTHING",
                (task.execution_id, f"{task.workflow_name}@{task.workflow_version}"),
            )
        if pause is not None and not lock:
            # And hold every transaction open until all have checked: a finisher that commits
            # first would otherwise be seen by a slower one's check.
            pause.wait(timeout=30)
    return fire


async def naive_complete(db: Database, registry: Registry, task: Claimed) -> object:
    """Seed 000's obvious check: mark done, read the siblings, dispatch if all are terminal —
    in one transaction but with no lock on the execution row."""
    return await _write_then_check(db, task, None, lock=False)


def naive_complete_paused(pause: threading.Barrier) -> CompleteFn:
    """The naive check with every finisher held between its write and its check, and again
    before its commit: each reads its siblings while their writes are still uncommitted, so
    under READ COMMITTED no one sees the group complete and the join never fires (seed 000's
    interleaving, every time)."""

    async def complete(db: Database, registry: Registry, task: Claimed) -> object:
        return await _write_then_check(db, task, pause, lock=False)

    return complete


def locked_complete_paused(pause: threading.Barrier) -> CompleteFn:
    """The same pause between write and check, then the execution row lock before the check:
    the finishers now check one after another, each seeing every earlier one committed, so
    exactly the last of them fires the join. (No pause before the commit: with the lock held,
    that would deadlock.)"""

    async def complete(db: Database, registry: Registry, task: Claimed) -> object:
        return await _write_then_check(db, task, pause, lock=True)

    return complete


@dataclass
class TrialResult:
    join_tasks: int
    join_fired: bool
    decisions: int = 0  # finishers that decided to fire the join (the checks that say so)


class Harness:
    """Runs trials of one join of ``width`` branches finishing together."""

    def __init__(self, app: konduit.App, width: int, workflow: str):
        self.app = app
        self.width = width
        self.workflow = workflow
        self.registry = app.registry
        url = app.database_url
        self.threads = [LoopThread(url) for _ in range(width)]
        self.main = self.threads[0]

    def close(self) -> None:
        for t in self.threads:
            t.close()

    def prepare(self) -> list[Claimed]:
        """Start an execution and bring it to: every branch leased, none finished."""
        handle = self.app.start(self.workflow)

        async def go() -> list[Claimed]:
            (root,) = await claim(self.main.db, self.registry, 1)
            assert root.execution_id == handle.id and root.step == "root"
            await engine_complete(self.main.db, self.registry, root)
            branches = await claim(self.main.db, self.registry, self.width)
            assert len(branches) == self.width
            return branches

        return self.main.submit(go()).result()  # type: ignore[return-value]

    def trial(self, complete: CompleteFn) -> TrialResult:
        branches = self.prepare()
        barrier = threading.Barrier(self.width)

        async def finish(lt: LoopThread, task: Claimed) -> object:
            # Check the connection out before the barrier so that all of them leave it at once.
            barrier.wait(timeout=30)
            return await complete(lt.db, self.registry, task)

        futures = [t.submit(finish(t, b)) for t, b in zip(self.threads, branches, strict=True)]
        returned = [f.result(timeout=60) for f in futures]
        decisions = sum(1 for r in returned if r is True)
        execution_id = branches[0].execution_id

        async def inspect() -> TrialResult:
            async with self.main.db.transaction() as tx:
                cur = await tx.conn.execute(
                    "SELECT count(*) AS n FROM konduit_tasks WHERE execution_id = %s"
                    " AND step = 'join'",
                    (execution_id,),
                )
                row = await cur.fetchone()
                assert row is not None
                return TrialResult(join_tasks=row["n"], join_fired=row["n"] > 0,
                                   decisions=decisions)

        self.last_execution = execution_id
        return self.main.submit(inspect()).result()  # type: ignore[return-value]

    def discard(self) -> None:
        """Cancel the last trial's execution so its leftovers are never claimed."""
        self.app.cancel(self.last_execution)

    def finish_join(self) -> None:
        """Run the join task too, so the execution can end (proves it terminates)."""

        async def go() -> None:
            (join,) = await claim(self.main.db, self.registry, 1)
            assert join.step == "join"
            await engine_complete(self.main.db, self.registry, join)

        self.main.submit(go()).result()


__all__ = ["Harness", "TaskEnded", "engine_complete", "fan_in_workflow", "locked_complete_paused",
           "naive_complete", "naive_complete_paused"]
