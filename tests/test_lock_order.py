"""The heartbeat never takes part in a lock cycle with a completion or a cancel.

A completion or cancel locks the execution row, then its task rows (DESIGN.md, fan-in protocol
point 7). The old heartbeat locked task rows with no execution lock and in the order the worker
listed them, so it could hold one task row while waiting for another that an ender held, while
the ender waited for the first: PostgreSQL broke the cycle by aborting one of them (40P01). The
heartbeat now skips rows someone holds and never waits at all.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerrors

import konduit
from konduit.bench.harness import leased_branches
from konduit.db.database import Database
from konduit.worker.executor import Claimed
from tests.support.db import wait_until_blocked
from tests.support.fanin import fan_in_workflow

pytestmark = [pytest.mark.storage]

# The heartbeat as it was: task rows locked in the order of the worker's list, no row skipped.
OLD_HEARTBEAT = """
UPDATE konduit_tasks t
SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[]) AS u(id, lease_token)
WHERE t.id = u.id AND t.lease_token = u.lease_token AND t.status = 'running'
RETURNING t.id
"""


def lease_of(url: str, task_id: int) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT lease_expires_at FROM konduit_tasks WHERE id = %s", (task_id,)
        ).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def two_leased(make_app: Any) -> Iterator[tuple[konduit.App, Claimed, Claimed]]:
    """An execution with two branch tasks leased (same worker), lower id first."""
    wf = fan_in_workflow(2, "locks")
    app = make_app(wf)

    async def prepare() -> list[Claimed]:
        db = Database(app.database_url, min_size=1, max_size=1)
        await db.open()
        try:
            return await leased_branches(db, app.registry, "locks", 2)
        finally:
            await db.close()

    low, high = sorted(asyncio.run(prepare()), key=lambda t: t.id)
    yield app, low, high


class Ender:
    """A completion-then-cancel transaction, in the global lock order: the execution row, then
    the task rows (the lower id first, like a completion that then cancels the rest)."""

    def __init__(self, url: str, execution_id: Any, *, deadlock_timeout: str):
        self.conn = psycopg.connect(url)
        self.execution_id = execution_id
        # deadlock_timeout is per waiting backend: it decides which side runs the deadlock check.
        self.conn.execute("SELECT set_config('deadlock_timeout', %s, true)", (deadlock_timeout,))
        self.conn.execute(
            "SELECT id FROM konduit_executions WHERE id = %s FOR NO KEY UPDATE", (execution_id,)
        )

    def end(self, task_id: int) -> None:
        self.conn.execute(
            "UPDATE konduit_tasks SET status = 'cancelled', lease_token = NULL,"
            " lease_expires_at = NULL, finished_at = clock_timestamp() WHERE id = %s",
            (task_id,),
        )

    def close(self, commit: bool = False) -> None:
        if commit:
            self.conn.commit()
        else:
            self.conn.rollback()
        self.conn.close()


def test_old_heartbeat_deadlocks_with_an_ender(two_leased: Any) -> None:
    """The control: the old statement and a completion/cancel form a lock cycle (40P01)."""
    app, low, high = two_leased
    url = app.database_url
    ender = Ender(url, low.execution_id, deadlock_timeout="50ms")
    heartbeat = psycopg.connect(url, autocommit=True)
    outcome: dict[str, Any] = {}
    try:
        # The deadlock check is made by the ender (50 ms after it waits); the heartbeat's is set
        # far away, so the victim is always the ender and the test is deterministic.
        heartbeat.execute("SET deadlock_timeout = '30s'")
        # The old statement locks in the order its plan meets the rows: the worker's list (a
        # nested loop fetching each by primary key, the plan on a real-sized table) or lease
        # expiry (the partial index of running tasks the old release had, on a tiny one: made
        # here, as migration 0040 keys that index by worker). Make both say "higher task
        # first", the order opposite to the ender's.
        with psycopg.connect(url, autocommit=True) as setup:
            setup.execute("CREATE INDEX konduit_tasks_leased ON konduit_tasks"
                          " (lease_expires_at) WHERE status = 'running'")
            setup.execute(
                "UPDATE konduit_tasks SET lease_expires_at = clock_timestamp()"
                " + make_interval(mins => CASE WHEN id = %s THEN 10 ELSE 20 END)"
                " WHERE id = ANY(%s)",
                (high.id, [low.id, high.id]),
            )
        heartbeat.execute("SET enable_seqscan = off")
        heartbeat.execute("SET enable_hashjoin = off")
        heartbeat.execute("SET enable_mergejoin = off")
        pid = heartbeat.info.backend_pid
        ender.end(low.id)  # the ender holds the execution and the lower task

        def beat() -> None:
            try:
                rows = heartbeat.execute(OLD_HEARTBEAT, {
                    "ids": [high.id, low.id],  # the worker's order: the opposite one
                    "lease_tokens": [high.lease_token, low.lease_token],
                    "lease_seconds": 60,
                }).fetchall()
                outcome["rows"] = rows
            except psycopg.Error as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        wait_until_blocked(url, pid)  # it holds the higher task and waits for the lower
        with pytest.raises(pgerrors.DeadlockDetected) as caught:
            ender.end(high.id)  # the ender now needs the higher task: a cycle
        assert caught.value.sqlstate == "40P01"
        ender.conn.rollback()  # the victim's transaction is gone: the heartbeat goes on
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert "error" not in outcome
    finally:
        ender.close()
        heartbeat.close()


def test_heartbeat_skips_rows_an_ender_holds_and_reports_them_held(two_leased: Any) -> None:
    """The named statement returns at once while an ender holds a task, extends the other one,
    and does not report the held task as lost."""
    app, low, high = two_leased
    url = app.database_url
    ender = Ender(url, low.execution_id, deadlock_timeout="50ms")
    db = Database(url, min_size=1, max_size=1)
    params = {
        "ids": [high.id, low.id],
        "lease_tokens": [high.lease_token, low.lease_token],
        "lease_seconds": 3600,
    }

    async def beat() -> set[int]:
        # A heartbeat that waited would fail here within the second instead of hanging.
        async with db.transaction() as tx:
            await tx.conn.execute("SET LOCAL lock_timeout = '1s'")
            rows = await tx.all("task_extend_leases_if_held", **params)
        return {r["id"] for r in rows}

    async def go() -> None:
        await db.open()
        try:
            ender.end(low.id)
            before_low, before_high = lease_of(url, low.id), lease_of(url, high.id)
            t0 = time.monotonic()
            held = await asyncio.wait_for(beat(), timeout=5)
            assert time.monotonic() - t0 < 1.0
            assert held == {low.id, high.id}  # the locked one is not reported lost
            assert lease_of(url, high.id) > before_high  # extended
            assert lease_of(url, low.id) == before_low  # skipped, not waited for
            # The heartbeat holds nothing afterwards: the ender goes on at once, no cycle.
            ender.end(high.id)
            ender.close(commit=True)
            assert await asyncio.wait_for(beat(), timeout=5) == set()  # both really lost now
        finally:
            await db.close()

    try:
        asyncio.run(go())
    finally:
        if not ender.conn.closed:
            ender.close()


def test_heartbeat_reports_only_tasks_still_held_by_their_token(two_leased: Any) -> None:
    app, low, high = two_leased
    url = app.database_url
    db = Database(url, min_size=1, max_size=1)

    async def go() -> set[int]:
        await db.open()
        try:
            rows = await db.all(
                "task_extend_leases_if_held",
                ids=[low.id, high.id],
                # the lower task's token is stale: another attempt holds it now
                lease_tokens=[high.lease_token, high.lease_token],
                lease_seconds=60,
            )
            return {r["id"] for r in rows}
        finally:
            await db.close()

    assert asyncio.run(go()) == {high.id}
