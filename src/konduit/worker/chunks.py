"""The chunk taker: creates the items of big maps, chunk by chunk, beside the claim loop.

A map step's fan-in creates its first chunk of tasks and keeps the rest as chunk rows
(:mod:`konduit.engine.maps`). Every worker runs one taker: woken by ``konduit_map_chunks``
(sent when a fan-in left chunks), and, on the maintenance leader only (``polls``), every
``poll`` seconds otherwise (a chunk a dead worker left half-taken is visible again once its
transaction rolled back; so is one whose transaction failed): an idle follower costs the
database nothing for it. It creates chunks one transaction at a time until none is left. It holds
no claim slot and no completion round: the worker claims and records other executions' work
meanwhile, and several workers share a big map's chunks (SKIP LOCKED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from konduit.aio import cancelling, wait_event
from konduit.db.database import Database
from konduit.engine.maps import create_next_chunk
from konduit.errors import DatabaseError

log = logging.getLogger(__name__)


class ChunkTaker:
    def __init__(self, db: Database, *, poll: float, passed: Callable[[], None] = lambda: None,
                 polls: Callable[[], bool] = lambda: True):
        self.db = db
        self.poll = poll
        self.polls = polls  # whether to look at each poll too, or only when poked
        self.passed = passed
        self.created = 0  # tasks created from chunks by this worker
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """A fan-in left chunks: look now."""
        self._wake.set()

    async def run(self) -> None:
        """Forever: create chunks until none is left, then wait for a poke or the poll."""
        while True:
            self._wake.clear()
            try:
                while (made := await create_next_chunk(self.db)) is not None:
                    self.created += made
                    # Let the claim loop and the rounds in between two chunks.
                    await asyncio.sleep(0)
                self.passed()
            except Exception as exc:  # the chunk rolled back: it stays, for the next look
                if cancelling():
                    raise  # the stop, turned into another error on its way up: not a failure
                # Which chunk (create_next_chunk notes it), and when it is tried again.
                which = "; ".join(getattr(exc, "__notes__", ())) or "a chunk"
                again = (f"at the next look (every {self.poll:g} s)" if self.polls()
                         else "when the next fan-in announces chunks, or at the "
                              "maintenance leader's next look")
                if isinstance(exc, DatabaseError):
                    log.warning("creating a map's items failed (%s): %s; tried again %s",
                                which, exc, again)
                else:  # a bug must not end the taker
                    log.exception("creating a map's items failed (%s); tried again %s",
                                  which, again)
            while not await wait_event(self._wake, self.poll) and not self.polls():
                pass
