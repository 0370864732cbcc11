"""The heartbeat: extend the leases of a worker's running tasks, and say which it lost.

On a connection of its own, reopened at the next beat when it breaks: after an outage the pool
may wait out its reconnect backoff for seconds, and a heartbeat that waited for it would let
live workers' leases be rescued. ``ctx.heartbeat()`` asks for a beat now (:class:`BeatRequest`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg

from konduit.aio import cancelling, wait_event
from konduit.core.model import TaskAttempt
from konduit.db.database import Database, Row, Tx
from konduit.errors import DatabaseError, DatabaseUnavailable
from konduit.worker.config import WorkerConfig
from konduit.worker.connectivity import Connectivity

log = logging.getLogger(__name__)

ASKED_GAP = 1.0
"""Seconds at least between an asked beat and the beat before it: a handler that calls
``ctx.heartbeat()`` in a tight loop must not turn the heartbeat into a busy loop of writes."""


class BeatRequest:
    """``ctx.heartbeat()``'s hook: ask the worker's heartbeat for a beat now, from any thread
    (a sync handler's own, or the loop's). Does nothing before the heartbeat runs or after it
    stopped."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: asyncio.Event | None = None

    def __call__(self) -> None:
        loop, asked = self._loop, self._asked
        if loop is None or asked is None:
            return
        try:
            loop.call_soon_threadsafe(asked.set)
        except RuntimeError:  # the loop closed meanwhile: the worker is gone
            pass

    def bind(self) -> None:
        """Called by the heartbeat, on its loop."""
        self._loop, self._asked = asyncio.get_running_loop(), asyncio.Event()

    async def pause(self, seconds: float) -> None:
        """Until the next beat: ``seconds`` from now, or sooner when asked (though not within
        :data:`ASKED_GAP` of now)."""
        assert self._loop is not None and self._asked is not None
        began = self._loop.time()
        if await wait_event(self._asked, seconds):
            await asyncio.sleep(min(seconds, ASKED_GAP) - (self._loop.time() - began))
        self._asked.clear()


async def beat(db: Database, config: WorkerConfig, connectivity: Connectivity, *,
               held: Callable[[], list[TaskAttempt]], abandoned: Callable[[], int],
               lost: Callable[[TaskAttempt], None], asked: BeatRequest | None = None,
               leader: Callable[[], str | None] = lambda: None,
               leader_free: Callable[[], None] = lambda: None) -> None:
    """Forever, every ``heartbeat_interval`` (or sooner when ``asked``): record the worker
    alive (with its running and ``abandoned()`` counts) and extend the leases of the ``held()``
    attempts; ``lost(task)`` for each whose lease no longer holds (cancelled, rescued after the
    lease ran out, or its hedged twin finished first). ``leader()`` names the maintenance lease
    to watch (None while this worker holds it): ``leader_free()`` when the beat found it free
    (:mod:`konduit.worker.leadership`)."""
    asked = asked or BeatRequest()
    asked.bind()
    conn: psycopg.AsyncConnection[Row] | None = None
    # The first beat comes at once: it records the worker's session (below), which the deadline
    # sweep needs from the moment this worker claims a task.
    first = True
    try:
        while True:
            if not first:
                await asked.pause(config.heartbeat_interval)
            first = False
            tasks = held()
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = await db.listen_connection()
                    if db.direct_url is not None or not db.pooled:
                        # Straight to PostgreSQL: this backend lives exactly as long as this
                        # process (a pooler's server connection would outlive it).
                        await Tx(conn).run("worker_set_session", id=config.worker_id)
                tx = Tx(conn)
                watched = leader()
                row = await tx.one("worker_heartbeat", id=config.worker_id, running=len(tasks),
                                   abandoned=abandoned(), leader=watched)
                rows = await tx.all(
                    "task_extend_leases_if_held",
                    ids=[t.id for t in tasks],
                    lease_tokens=[t.lease_token for t in tasks],
                    lease_seconds=config.lease_seconds,
                ) if tasks else []
            except DatabaseError as exc:
                if cancelling():
                    raise  # the stop, not a failed beat
                if isinstance(exc, DatabaseUnavailable):
                    connectivity.disconnected()
                log.warning("heartbeat failed: %s", exc)
                if conn is not None:
                    await conn.close()
                    conn = None
                continue
            connectivity.connected()
            if watched is not None and row is not None and row["leader_free"]:
                leader_free()
            still = {(r["id"], r["lease_token"]) for r in rows}
            for t in tasks:
                if (t.id, t.lease_token) not in still:
                    lost(t)
    finally:
        if conn is not None:
            await conn.close()
