"""Finishing an execution from outside its fan-in decisions (engine/finish.py): a cancel, the
hard-timeout sweep, and the children a stopped execution stops. Real database, real rows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import psycopg
import pytest

import konduit
from konduit.core.model import ExecutionStatus
from konduit.db.database import Database
from konduit.engine.client import Client
from konduit.engine.finish import end_timed_out_executions, stop_execution
from konduit.engine.registry import Registry
from konduit.errors import ExecutionNotFound

pytestmark = [pytest.mark.storage]
BOUND = 60.0


def one_step() -> konduit.Workflow:
    wf = konduit.Workflow("finish", version=1)

    @wf.step()
    async def only(ctx: konduit.Context) -> int:
        return 1

    return wf


def scenario(url: str, body: Callable[[Database, Client], Awaitable[None]]) -> None:
    async def main() -> None:
        db = Database(url, min_size=1, max_size=2)
        await db.open()
        client = Client(db, Registry([one_step()]))
        await client.register_all()
        try:
            await asyncio.wait_for(body(db, client), BOUND)
        finally:
            await db.close()

    asyncio.run(main())


def state(url: str, eid: uuid.UUID) -> tuple[str, str, str | None]:
    """(execution status, its task's status, its error)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT e.status, t.status, e.error FROM konduit_executions e"
                           " JOIN konduit_tasks t ON t.execution_id = e.id WHERE e.id = %s",
                           (eid,)).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_stop_execution_ends_a_running_execution_once(db_url: str) -> None:
    async def body(db: Database, client: Client) -> None:
        eid = await client.start("finish")
        async with db.transaction() as tx:
            first = await stop_execution(tx, eid, ExecutionStatus.CANCELLED, "enough")
        assert first is not None and first.child_ended is None  # not a child workflow
        assert state(db_url, eid) == ("cancelled", "cancelled", "enough")
        async with db.transaction() as tx:  # already finished: nothing changes
            assert await stop_execution(tx, eid, ExecutionStatus.TIMED_OUT, "late") is None
        assert state(db_url, eid) == ("cancelled", "cancelled", "enough")
        with pytest.raises(ExecutionNotFound):
            async with db.transaction() as tx:
                await stop_execution(tx, uuid.uuid4(), ExecutionStatus.CANCELLED, "gone")

    scenario(db_url, body)


def test_the_timeout_sweep_ends_only_executions_past_their_timeout(db_url: str) -> None:
    async def body(db: Database, client: Client) -> None:
        late = await client.start("finish", timeout="1h")
        on_time = await client.start("finish", timeout="1h")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE konduit_executions SET timeout_at = now() - interval '1 second'"
                         " WHERE id = %s", (late,))
        ended = await end_timed_out_executions(db)
        assert len(ended) == 1
        assert state(db_url, late) == ("timed_out", "cancelled",
                                       "the execution exceeded its timeout")
        assert state(db_url, on_time)[:2] == ("running", "ready")
        assert await end_timed_out_executions(db) == []  # ended once

    scenario(db_url, body)
