"""The completer's batching front: terminal outcomes that arrive together are recorded together.

While one round of transactions is in flight, the outcomes that finish meanwhile queue up; the
next round takes them all (at most ``max_batch``), one transaction per execution (the lock is
per execution, so an execution's outcomes could not run in parallel anyway). A wide fan-out that
finishes together then costs one lock, one round of writes and one fan-in decision per round
instead of per task.

How a group's failure reaches its submitters:

- the database cannot be reached, or the pool has no connection: every submitter of the group
  gets that error (it is nobody's fault in particular; each retries through the outage);
- a conflict (deadlock, serialization failure): the whole group is recorded again, a few times,
  after a short jittered pause: conflicts are transient and the rerun is a fresh transaction;
  if it keeps conflicting every submitter gets the DatabaseConflict;
- any other database error in a group of several: the group is split and each completion is
  recorded alone, so one outcome the database refuses cannot fail its neighbours;
- the loop being cancelled (shutdown) or any other failure: no submitter is left waiting; each
  gets :class:`BatcherStopped` (or the unexpected error) and may record its completion directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from uuid import UUID

from konduit.engine.advancer import Advanced
from konduit.engine.completer import Completion, Recorded
from konduit.errors import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    KonduitError,
    PoolExhausted,
)

log = logging.getLogger("konduit.completer")

Result = tuple[Recorded, Advanced | None]
RecordGroup = Callable[[list[Completion]], Awaitable[list[Result]]]
Item = tuple[Completion, asyncio.Future[Result]]


class BatcherStopped(KonduitError):
    """The completion batcher stopped before it recorded this completion (the worker is
    shutting down): record it directly; the lease fence makes a second write harmless."""


class CompletionBatcher:
    """Queue terminal completions and record them in per-execution groups, one round at a time.

    ``record_group`` records completions of ONE execution in one transaction and returns their
    results in the same order. ``conflict_attempts`` is how many times a group is recorded when
    it keeps meeting a DatabaseConflict.
    """

    def __init__(self, record_group: RecordGroup, *, max_batch: int = 500,
                 conflict_attempts: int = 3):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.record_group = record_group
        self.max_batch = max_batch
        self.conflict_attempts = max(1, conflict_attempts)
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.rounds = 0
        self.stopped = False

    async def submit(self, completion: Completion) -> Result:
        """Queue ``completion`` for the next round and wait for its result."""
        if self.stopped:
            raise BatcherStopped("the completion batcher is stopped")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((completion, future))
        return await future

    async def run(self) -> None:
        """The batching loop; runs until cancelled."""
        in_flight: list[Item] = []
        try:
            while True:
                in_flight = [await self.queue.get()]
                while len(in_flight) < self.max_batch and not self.queue.empty():
                    in_flight.append(self.queue.get_nowait())
                groups: dict[UUID, list[Item]] = {}
                for item in in_flight:
                    groups.setdefault(item[0].execution_id, []).append(item)
                self.rounds += 1
                await asyncio.gather(*(self._flush(g) for g in groups.values()))
                in_flight = []
        finally:
            # Whatever ended the loop, nobody may wait for a round that will not come.
            self.stopped = True
            while not self.queue.empty():
                in_flight.append(self.queue.get_nowait())
            _fail(in_flight, BatcherStopped("the completion batcher stopped before recording"))

    async def _flush(self, group: list[Item]) -> None:
        conflicts = 0
        while True:
            try:
                results = await self.record_group([c for c, _ in group])
                if len(results) != len(group):
                    raise RuntimeError(
                        f"record_group returned {len(results)} results for {len(group)} completions"
                    )
            except DatabaseConflict as exc:
                conflicts += 1
                if conflicts < self.conflict_attempts:
                    log.info("a batch of %s outcomes met a conflict (%s); recording it again",
                             len(group), exc)
                    await asyncio.sleep(random.uniform(0.5, 1.0) * 0.05 * 2 ** (conflicts - 1))
                    continue
                _fail(group, exc)
            except (DatabaseUnavailable, PoolExhausted) as exc:
                _fail(group, exc)  # each submitter retries through the outage
            except DatabaseError as exc:
                if len(group) == 1:
                    _fail(group, exc)
                    return
                # One outcome the database refuses must not take its neighbours down: alone, each
                # either records or gets its own error.
                log.warning("a batch of %s outcomes failed (%s); recording them one by one",
                            len(group), exc)
                await self._flush_each(group)
            except Exception as exc:  # a bug: the submitters see it rather than hang
                log.exception("recording a batch of %s outcomes failed", len(group))
                _fail(group, exc)
            except BaseException as exc:  # cancelled at shutdown: never leave waiters hanging
                stopped = BatcherStopped("the completion batcher stopped while recording")
                stopped.__cause__ = exc
                _fail(group, stopped)
                raise
            else:
                for (_, future), result in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(result)
            return

    async def _flush_each(self, group: list[Item]) -> None:
        for i, item in enumerate(group):
            try:
                await self._flush([item])
            except BaseException as exc:
                stopped = BatcherStopped("the completion batcher stopped while recording")
                stopped.__cause__ = exc
                _fail(group[i + 1:], stopped)
                raise


def _fail(items: list[Item], exc: BaseException) -> None:
    for _, future in items:
        if not future.done():
            future.set_exception(exc)
