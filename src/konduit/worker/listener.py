"""The worker's LISTEN connection: notifications that make it act now instead of at its next
poll or heartbeat. Losing it costs latency only: the worker polls until it is back.

Nothing ends the loop but its own cancellation (the worker's stop). What a notification's
callback raises, ``BaseException`` included (its logging may run a user's handler or filter),
ends that call only, on the same connection; what connecting or listening raises is logged
and the loop listens again a second later. A ``KeyboardInterrupt`` or ``SystemExit`` let out
of the loop's task would end the worker's event loop itself (asyncio re-raises them out of
``run_forever``); the worker is stopped by cancellation (its signal handlers cancel), never by
those."""

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
                _dispatch(note.channel, note.payload, queues=queues, ready=ready,
                          stopped=stopped, outrun=outrun, deadline=deadline, chunks=chunks,
                          leader=leader)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if cancelling():
                raise  # the stop, turned into another error on its way up
            if isinstance(exc, Exception):
                log.debug("listener lost (%s); polling until it is back", exc)
            else:  # KeyboardInterrupt, SystemExit...: see the module's docstring
                log.error("listener: %s escaped it; polling until it is back",
                          type(exc).__name__, exc_info=exc)
            await asyncio.sleep(1.0)
        finally:
            if conn is not None:
                await conn.close()


def _dispatch(channel: str, payload: str, *, queues: Container[str],
              ready: Callable[[], None], stopped: Callable[[str], None],
              outrun: Callable[[str], None], deadline: Callable[[], None] | None,
              chunks: Callable[[], None] | None, leader: Callable[[], None] | None) -> None:
    """One notification's callback. Whatever it raises (``BaseException`` included) ends this
    call only: logged, and the connection listens on. A cancellation of the loop that comes
    meanwhile is not lost: it is raised at the loop's next wait for a notification."""
    try:
        if channel == "konduit_stopped":
            stopped(payload)
        elif channel == "konduit_outrun":
            outrun(payload)
        elif channel == "konduit_map_chunks":
            if chunks is not None:
                chunks()
        elif channel == "konduit_deadline":
            if deadline is not None:
                deadline()
        elif channel == "konduit_leader":
            if leader is not None:
                leader()
        elif payload in queues:
            ready()
    except BaseException as exc:
        log.error("listener: acting on a %s notification raised %s; listening on", channel,
                  type(exc).__name__, exc_info=exc)
