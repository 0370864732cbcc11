"""The worker's LISTEN connection: notifications that make it act now instead of at its next
poll or heartbeat. Losing it costs latency only: the worker polls until it is back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container

from konduit.aio import cancelling
from konduit.db.database import Database

log = logging.getLogger(__name__)


async def listen(db: Database, *, queues: Container[str], hedged: bool,
                 ready: Callable[[], None], stopped: Callable[[str], None],
                 outrun: Callable[[str], None],
                 deadline: Callable[[], None] | None = None,
                 chunks: Callable[[], None] | None = None,
                 leader: Callable[[], None] | None = None) -> None:
    """Forever: ``ready()`` when a task became ready in one of ``queues``; ``stopped(execution
    id)`` when an execution ended with tasks cancelled under them; ``outrun(lease token)``
    when a hedged task's other attempt finished first (listened to only if ``hedged``);
    ``deadline()`` when another worker's claim set a deadline sooner than it knew of (rare:
    see :mod:`konduit.worker.wakeups`); ``chunks()`` when a map's fan-in left chunks of items
    to create (:mod:`konduit.worker.chunks`); ``leader()`` when a maintenance leader resigned
    (its worker stopped: :mod:`konduit.worker.leadership`)."""
    while True:
        conn = None
        try:
            conn = await db.listen_connection()
            await conn.execute("LISTEN konduit_ready")
            # Not konduit_finished: that one is for clients waiting on every execution.
            await conn.execute("LISTEN konduit_stopped")
            if hedged:
                await conn.execute("LISTEN konduit_outrun")
            if deadline is not None:
                await conn.execute("LISTEN konduit_deadline")
                deadline()  # announcements sent while it was not listening are lost: re-read
            if chunks is not None:
                await conn.execute("LISTEN konduit_map_chunks")
                chunks()  # likewise
            if leader is not None:
                await conn.execute("LISTEN konduit_leader")
            async for note in conn.notifies():
                if note.channel == "konduit_stopped":
                    stopped(note.payload)
                elif note.channel == "konduit_outrun":
                    outrun(note.payload)
                elif note.channel == "konduit_map_chunks":
                    if chunks is not None:
                        chunks()
                elif note.channel == "konduit_deadline":
                    if deadline is not None:
                        deadline()
                elif note.channel == "konduit_leader":
                    if leader is not None:
                        leader()
                elif note.payload in queues:
                    ready()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if cancelling():
                raise  # the stop, turned into another error on its way up
            log.debug("listener lost (%s); polling until it is back", exc)
            await asyncio.sleep(1.0)
        finally:
            if conn is not None:
                await conn.close()
