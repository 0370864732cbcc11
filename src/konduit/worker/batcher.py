"""The completer's batching front: terminal outcomes that arrive together are recorded together.

While one round of transactions is in flight, the outcomes that finish meanwhile queue up; the
next round takes them all, one transaction per execution (the lock is per execution, so an
execution's outcomes could not run in parallel anyway). A wide fan-out that finishes together
then costs one lock, one round of writes and one fan-in decision per round instead of per task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

from konduit.engine.advancer import Advanced
from konduit.engine.completer import Completion, Recorded
from konduit.errors import DatabaseError, DatabaseUnavailable

log = logging.getLogger("konduit.completer")

Result = tuple[Recorded, Advanced | None]
RecordGroup = Callable[[list[Completion]], Awaitable[list[Result]]]


class CompletionBatcher:
    def __init__(self, record_group: RecordGroup, *, max_batch: int = 500):
        self.record_group = record_group
        self.max_batch = max_batch
        self.queue: asyncio.Queue[tuple[Completion, asyncio.Future[Result]]] = asyncio.Queue()
        self.rounds = 0

    async def submit(self, completion: Completion) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((completion, future))
        return await future

    async def run(self) -> None:
        while True:
            items = [await self.queue.get()]
            while len(items) < self.max_batch and not self.queue.empty():
                items.append(self.queue.get_nowait())
            groups: dict[UUID, list[tuple[Completion, asyncio.Future[Result]]]] = {}
            for item in items:
                groups.setdefault(item[0].execution_id, []).append(item)
            self.rounds += 1
            await asyncio.gather(*(self._flush(g) for g in groups.values()))

    async def _flush(self, group: list[tuple[Completion, asyncio.Future[Result]]]) -> None:
        try:
            results = await self.record_group([c for c, _ in group])
        except DatabaseUnavailable as exc:
            for _, future in group:  # each submitter retries through the outage
                if not future.done():
                    future.set_exception(exc)
            return
        except DatabaseError as exc:
            if len(group) == 1:
                if not group[0][1].done():
                    group[0][1].set_exception(exc)
                return
            # One outcome the database refuses must not take its neighbours down: alone, each
            # either records or gets its own error.
            log.warning("a batch of %s outcomes failed (%s); recording them one by one",
                        len(group), exc)
            for item in group:
                await self._flush([item])
            return
        except BaseException as exc:  # cancelled at shutdown, or a bug: never leave waiters hanging
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), result in zip(group, results, strict=True):
            if not future.done():
                future.set_result(result)
