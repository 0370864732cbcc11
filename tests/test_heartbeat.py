"""``ctx.heartbeat()`` extends the attempt's lease now (DESIGN "Public surface": lease extension),
and a handler calling it in a tight loop does not turn the heartbeat into a busy loop."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

import konduit
from konduit.worker.heartbeat import ASKED_GAP, BeatRequest
from tests.support.workers import running_worker


def test_an_asked_beat_comes_at_once_and_asks_coalesce() -> None:
    async def go() -> tuple[float, int]:
        asked = BeatRequest()
        asked()  # before the heartbeat runs: nothing to wake, and no error
        asked.bind()
        began = time.monotonic()
        asked()
        await asked.pause(30)  # the regular beat is 30 s away
        first = time.monotonic() - began
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await asked.pause(30)
                beats += 1

        task = asyncio.create_task(heartbeat())
        for _ in range(100):  # two seconds of asking, every 20 ms
            asked()
            await asyncio.sleep(0.02)
        task.cancel()
        return first, beats

    first, beats = asyncio.run(go())
    assert first < 5
    # One beat per ASKED_GAP at most (a slow machine only makes fewer).
    assert beats <= 2 / ASKED_GAP + 1


@pytest.mark.storage
def test_ctx_heartbeat_extends_the_lease_before_the_next_regular_beat(make_app, db_url) -> None:
    entered, beat, done = threading.Event(), threading.Event(), threading.Event()
    wf = konduit.Workflow("beating", version=1)

    @wf.step()
    def work(ctx: konduit.Context) -> int:
        entered.set()
        assert beat.wait(30)
        ctx.heartbeat()
        assert done.wait(30)
        return 1

    def lease_expiry() -> object:
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT lease_expires_at FROM konduit_tasks WHERE step = 'work'"
                               ).fetchone()
        assert row is not None and row[0] is not None
        return row[0]

    app = make_app(wf)
    handle = app.start("beating")
    # The worker's own beats are 30 s apart (its first comes at start, before the claim): only
    # ctx.heartbeat() can move the lease while the handler runs.
    with running_worker(app, concurrency=1, lease_seconds=60, heartbeat_interval=30):
        assert entered.wait(15)
        claimed = lease_expiry()
        beat.set()
        deadline = time.monotonic() + 15
        while lease_expiry() == claimed:
            assert time.monotonic() < deadline, "ctx.heartbeat() did not extend the lease"
            time.sleep(0.05)
        done.set()
        assert handle.wait(timeout=15).output == 1
