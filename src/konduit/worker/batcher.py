"""The completer's batching front: terminal outcomes that arrive together are recorded together.

While one round of transactions is in flight, the outcomes that finish meanwhile queue up; the
next round takes them all (at most ``max_batch``). With ``max_executions`` set, a round's
outcomes of up to that many executions go to ONE call of ``record_group`` (one transaction:
:func:`konduit.engine.completer.record_many` locks the executions in id order), so fifty
executions finishing together cost one commit, not fifty; without it, each execution's outcomes
go to a call of their own. A wide fan-out that finishes together then costs one lock, one round
of writes and one fan-in decision per round instead of per task.

A round that takes long (a map's fan-in runs ``over()`` over a million items) does not hold the
others: once it has run ``patience`` seconds the next round starts beside it, with the outcomes of
every other execution; those of the executions it records wait for it (they would wait for its
locks anyway). At most two rounds are in flight.

How a group's failure reaches its submitters:

- the database cannot be reached, or the pool has no connection: every submitter of the group
  gets that error (it is nobody's fault in particular; each retries through the outage);
- a conflict (deadlock, serialization failure): the whole group is recorded again, a few times,
  after a short jittered pause: conflicts are transient and the rerun is a fresh transaction;
  if it keeps conflicting every submitter gets the DatabaseConflict;
- any other database error in a group of several: the group is split (a group of several
  executions into one group per execution, an execution's group into single completions) and
  each part recorded alone, so one outcome the database refuses cannot fail its neighbours;
- the loop being cancelled (shutdown) or any other failure: no submitter is left waiting; each
  gets :class:`BatcherStopped` (or the unexpected error) and may record its completion directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

from konduit.core.model import Completion, Recorded
from konduit.engine.advancer import Advanced
from konduit.errors import (
    DatabaseConflict,
    DatabaseError,
    DatabaseUnavailable,
    KonduitError,
    PoolExhausted,
)

log = logging.getLogger(__name__)

Result = tuple[Recorded, Advanced | None]
RecordGroup = Callable[[list[Completion]], Awaitable[list[Result]]]
Item = tuple[Completion, asyncio.Future[Result]]


class BatcherStopped(KonduitError):
    """The completion batcher stopped before it recorded this completion (the worker is
    shutting down): record it directly; the lease fence makes a second write harmless."""


class CompletionBatcher:
    """Queue terminal completions and record them in per-execution groups, one round at a time.

    ``record_group`` records the completions it is given in one transaction and returns their
    results in the same order; it is given completions of ONE execution, or, when
    ``max_executions`` is set, of up to that many. A round takes at most ``max_batch``
    completions (both caps keep one transaction's lock holding short). ``conflict_attempts`` is
    how many times a group is recorded when it keeps meeting a DatabaseConflict.
    """

    def __init__(self, record_group: RecordGroup, *, max_batch: int = 500,
                 conflict_attempts: int = 3, max_executions: int | None = None,
                 patience: float = 0.5):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if max_executions is not None and max_executions < 1:
            raise ValueError("max_executions must be at least 1")
        self.record_group = record_group
        self.max_batch = max_batch
        self.max_executions = max_executions
        self.conflict_attempts = max(1, conflict_attempts)
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.rounds = 0
        self.stopped = False
        # The first item of the next round: taken from the queue, but of one execution too many
        # for the round it was taken in.
        self._carry: Item | None = None
        self.patience = patience
        # The rounds in flight: when each began (monotonic) and the executions it records.
        self._flights: dict[asyncio.Future[None], tuple[float, set[UUID]]] = {}
        # Outcomes of executions a round in flight records: they wait for it.
        self._held: list[Item] = []

    @property
    def busy(self) -> bool:
        """Whether a round is being recorded or outcomes wait for the next one."""
        return bool(self._flights) or self._carry is not None or not self.queue.empty() \
            or bool(self._held)

    @property
    def stalled(self) -> bool:
        """Whether every round in flight has run past ``patience`` (a slow one: the worker
        claims without waiting for it) and none waits to start."""
        if not self._flights or self._carry is not None or not self.queue.empty():
            return False
        now = time.monotonic()
        return all(now - began >= self.patience for began, _ in self._flights.values())

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
                in_flight = await self._take()
                self.rounds += 1
                executions = {c.execution_id for c, _ in in_flight}
                flight: asyncio.Future[None] = asyncio.ensure_future(self._round(in_flight))
                self._flights[flight] = (time.monotonic(), executions)
                flight.add_done_callback(self._landed)
                in_flight = []
                # Wait for it, but past its patience the next round may start beside it;
                # never more than two at once.
                await asyncio.wait({flight}, timeout=self.patience)
                if len(self._flights) > 1:
                    await asyncio.wait(set(self._flights), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whatever ended the loop, nobody may wait for a round that will not come.
            self.stopped = True
            flights = list(self._flights)
            for landing in flights:
                landing.cancel()  # its _flush fails its submitters
            if flights:
                await asyncio.gather(*flights, return_exceptions=True)
            if self._carry is not None:
                in_flight.append(self._carry)
                self._carry = None
            in_flight.extend(self._held)
            self._held.clear()
            while not self.queue.empty():
                in_flight.append(self.queue.get_nowait())
            _fail(in_flight, BatcherStopped("the completion batcher stopped before recording"))

    async def _round(self, in_flight: list[Item]) -> None:
        if self.max_executions is not None:
            await self._flush(in_flight)
        else:
            await asyncio.gather(*(self._flush(g) for g in _per_execution(in_flight)))

    def _landed(self, flight: asyncio.Future[None]) -> None:
        """A round ended: the outcomes it held back go first into the next one."""
        self._flights.pop(flight, None)
        if self._held:
            held, self._held = self._held, []
            for item in held:
                self.queue.put_nowait(item)

    def _recorded_now(self) -> set[UUID]:
        return {e for _, executions in self._flights.values() for e in executions}

    async def _take(self) -> list[Item]:
        """The next round: what is queued, up to ``max_batch`` completions and (when set)
        ``max_executions`` executions, leaving out (held until it ends) those of executions a
        round in flight records; waits for the first."""
        while True:
            if self._carry is not None:
                first, self._carry = self._carry, None
            else:
                first = await self.queue.get()
            busy = self._recorded_now()
            if first[0].execution_id in busy:
                self._held.append(first)
                continue
            break
        taken = [first]
        executions = {first[0].execution_id}
        while len(taken) < self.max_batch and not self.queue.empty():
            item = self.queue.get_nowait()
            if item[0].execution_id in busy:
                self._held.append(item)
                continue
            if self.max_executions is not None and item[0].execution_id not in executions:
                if len(executions) >= self.max_executions:
                    self._carry = item
                    break
                executions.add(item[0].execution_id)
            taken.append(item)
        return taken

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
                parts = _per_execution(group)
                if len(parts) > 1:
                    log.warning("a batch of %s outcomes of %s executions failed (%s); recording "
                                "each execution's alone", len(group), len(parts), exc)
                    await self._flush_each(parts)
                else:
                    log.warning("a batch of %s outcomes failed (%s); recording them one by one",
                                len(group), exc)
                    await self._flush_each([[item] for item in group])
            except Exception as exc:  # a bug: the submitters see it rather than hang
                parts = _per_execution(group)
                if len(parts) > 1:
                    # It may be one execution's (its workflow, its data): the others go on.
                    log.exception("recording a batch of %s executions failed; recording each "
                                  "execution's alone", len(parts))
                    await self._flush_each(parts)
                    return
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

    async def _flush_each(self, parts: list[list[Item]]) -> None:
        for i, part in enumerate(parts):
            try:
                await self._flush(part)
            except BaseException as exc:
                stopped = BatcherStopped("the completion batcher stopped while recording")
                stopped.__cause__ = exc
                _fail([item for rest in parts[i + 1:] for item in rest], stopped)
                raise


def _per_execution(items: list[Item]) -> list[list[Item]]:
    """``items`` grouped by execution, each group in submission order."""
    groups: dict[UUID, list[Item]] = {}
    for item in items:
        groups.setdefault(item[0].execution_id, []).append(item)
    return list(groups.values())


def _fail(items: list[Item], exc: BaseException) -> None:
    for _, future in items:
        if not future.done():
            future.set_exception(exc)
