"""A finished execution wakes the clients that wait for it at once, and nobody else: NOTIFY costs
every listening backend of the database a transaction, so executions nobody waits for send none
(migration 0010)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import konduit
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage


def slow_workflow() -> konduit.Workflow:
    wf = konduit.Workflow("finish-notify", version=1)

    @wf.step()
    async def work(ctx: konduit.Context) -> int:
        import asyncio

        await asyncio.sleep(ctx.input)
        return 1

    return wf


def test_a_waiting_client_is_woken_by_the_finish_not_by_its_poll(make_app: Any) -> None:
    app = make_app(slow_workflow())
    with running_worker(app, poll_interval=0.05):
        for _ in range(3):
            handle = app.start("finish-notify", input=0.6)
            result = handle.wait(timeout=30)
            woke = time.time()
            assert result.finished_at is not None
            # The poll fallback runs once a second: three wake-ups all within 0.3 s of the
            # finish happen by notification (by chance of the poll: 0.3 ** 3).
            assert woke - result.finished_at.timestamp() < 0.3


def test_executions_nobody_waits_for_notify_nobody(make_app: Any, db_url: str) -> None:
    app = make_app(slow_workflow())
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN konduit_finished")
        with running_worker(app, poll_interval=0.05):
            unwaited = [app.start("finish-notify", input=0) for _ in range(5)]
            deadline = time.monotonic() + 30
            while not all(app.status(h.id).finished for h in unwaited):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            waited = app.start("finish-notify", input=0.3)
            waited.wait(timeout=30)
        payloads = [n.payload for n in listener.notifies(timeout=0.5)]
    assert payloads == [str(waited.id)]
