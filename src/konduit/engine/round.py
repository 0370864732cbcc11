"""The completion round: the outcomes of tasks of one or many executions recorded, and each
execution's fan-in decision made, in one transaction, step by step in the order of DESIGN.md's
fan-in protocol.

:meth:`Round.run` is the whole transaction; each step is a method of its own, in the order run
calls them:

1. :meth:`~Round.lock_executions` — the execution rows, in id order, before any sibling state is
   read (without the lock, siblings finishing together each read join state that misses the
   others' uncommitted writes, and none fires the join);
2. :meth:`~Round.fence` — each task ends only while its attempt's lease still holds it;
3. :meth:`~Round.store_outputs` — payloads, content-addressed;
4. :meth:`~Round.close_attempts` — the attempts that ended, and what their handlers logged
   (in the usual round the fence's own statement stored the outputs and closed the attempts
   of the tasks it ended, joined to its RETURNING: these two then only write what other
   transitions ended, and the logs);
5. :meth:`~Round.read_join_state` — the counters of every step the round touches, one read;
6. :meth:`~Round.decide` — :func:`konduit.core.advance.advance`, through each execution's
   :class:`~konduit.engine.advancer.Advancer`;
7. :meth:`~Round.write_decisions` — the step rows and counts of the whole round, set-based;
8. :meth:`~Round.return_to_ready` — the round's retries and releases (task rows come after every
   execution lock: DESIGN's global lock order);
9. :meth:`~Round.notify` — wake the queues that got tasks the caller did not claim itself.

The transaction is pipelined (:class:`~konduit.db.database.Tx`): the writes nobody reads are
queued and go out with the next statement that is waited for. In the usual round it waits for
the server only for the locks (the terminal writes ride with them), for the join state, for the
caller's claim and at commit: keep a new step from adding a wait of its own.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from uuid import UUID

from konduit.core.advance import Event, TaskEnded
from konduit.core.model import (
    MOVES,
    AttemptOutcome,
    Command,
    Completion,
    ExecutionStatus,
    Outcome,
    Recorded,
    Transition,
)
from konduit.core.payloads import DEFAULT_MAX_BYTES, Payload, content_hash
from konduit.db.database import Row, Tx
from konduit.engine import step_rows, transitions
from konduit.engine.advancer import Advanced, Advancer
from konduit.engine.registry import Registry

Fetch = Callable[[], Awaitable[list[Row]]]
"""The rows of a statement already sent (:meth:`konduit.db.database.Tx.later`)."""

Claim = Callable[[Tx], Awaitable[set[tuple[UUID, str]] | None]]
"""What runs after the round in its transaction (a worker claims its freed slots) and returns
the (execution, step) pairs it claimed, or None when its claim is only sent (its rows come back
with the COMMIT): the round's wake-ups then ask the server what is still ready."""

Waking = tuple[str, tuple[UUID, str] | None]
"""A queue that got a task, with the task's (execution, step); None for a map step's items, whose
key is never claimed whole (one task per item), so that queue is always woken."""


class Round:
    """One round of completions. Built outside the transaction (payloads are hashed once, so a
    rerun after a conflict repeats only database work); :meth:`run` is the transaction body and
    may run more than once; :meth:`results` answers for the last run that committed."""

    def __init__(self, registry: Registry, batch: Sequence[Completion], *,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES):
        self.registry = registry
        self.batch = list(batch)
        self.max_payload_bytes = max_payload_bytes
        # The same task twice in one batch (a redelivery): only the first may pass the fence.
        self.first: dict[int, Completion] = {}
        for c in self.batch:
            self.first.setdefault(c.task_id, c)
        self.ending = [c for c in self.first.values() if c.command is Command.END]
        self.moving = sorted((c for c in self.first.values() if c.command in MOVES),
                             key=lambda c: c.task_id)
        self.hashes = {c.task_id: content_hash(c.payload_json) if c.payload_json is not None
                       else None for c in self.ending}
        self.execution_ids = sorted({c.execution_id for c in self.ending})
        self._begin()

    def _begin(self) -> None:
        """Forget what an earlier run (rolled back by a conflict) found: a rerun decides afresh."""
        self.locked: dict[UUID, Row] = {}
        self.dropped: dict[int, Recorded] = {}
        self.ended: dict[int, datetime] = {}
        self.stored: set[int] = set()  # ended tasks whose outputs and attempts are written
        self.kept: list[Completion] = []  # completions whose task ended in this round
        self.deciding: list[tuple[Advancer, list[Completion]]] = []
        self.advanced: dict[UUID, Advanced] = {}
        self.moved: dict[int, Recorded] = {}
        self.waking: list[Waking] = []
        # The join state read ahead in the fence's round trip, and the pairs it covers.
        self.ahead: tuple[frozenset[tuple[UUID, str]], Fetch] | None = None

    async def run(self, tx: Tx, then: Claim | None = None) -> None:
        """The round, in the protocol's order, in ``tx`` (pipelined)."""
        self._begin()
        if self.ending:
            locks = await self.lock_executions(tx)
            await self.fence(tx, locks)
            if self.kept:
                await self.store_outputs(tx)
                await self.close_attempts(tx)
                await self.read_join_state(tx)
                await self.decide()
                await self.write_decisions(tx)
        await self.return_to_ready(tx)
        taken: set[tuple[UUID, str]] | None = set()
        if then is not None:
            taken = await then(tx)
        await self.notify(tx, taken)

    async def lock_executions(self, tx: Tx) -> Fetch:
        """Lock the rows of the round's executions in id order (``FOR NO KEY UPDATE``): two
        rounds that share executions queue instead of deadlocking. The statement is sent, not
        waited for; :meth:`fence` reads its rows."""
        if len(self.execution_ids) == 1:
            return await tx.later("execution_lock", id=self.execution_ids[0])
        return await tx.later("execution_lock_many_in_id_order", ids=self.execution_ids)

    async def fence(self, tx: Tx, locks: Fetch) -> None:
        """End each task only where its lease (or guard) still holds: a stale worker or a
        redelivered duplicate changes nothing. A task of an execution that is gone is gone with
        it: nothing of it ends. Without hedged failures among the outcomes (the usual round)
        the terminal writes are sent behind the locks and come back in the same round trip:
        the server runs them in order, so only once every lock is held."""
        # Only a success ends a hedged task while its other attempt runs: any other outcome
        # ends just its own attempt, and the survivor decides (under the row lock the drop took).
        may_drop = [c for c in self.ending
                    if c.transition == Transition.COMPLETE and c.outcome != Outcome.SUCCEEDED
                    and c.lease_token is not None]
        ending = None if may_drop else await transitions.end_later(
            tx, self.ending, [self.hashes[c.task_id] for c in self.ending], store=True)
        if ending is not None:
            await self.read_ahead(tx)
        self.locked = {row["id"]: row for row in await locks()}
        mine = [c for c in self.ending if c.execution_id in self.locked]
        for c in sorted((c for c in may_drop if c.execution_id in self.locked),
                        key=lambda c: c.task_id):
            assert c.lease_token is not None
            if await transitions.drop(tx, c.task_id, c.lease_token):
                self.dropped[c.task_id] = await close_dropped(tx, c)
        mine = [c for c in mine if c.task_id not in self.dropped]
        if ending is not None:
            own = {c.task_id for c in mine}
            self.ended = {t: at for t, at in (await ending()).items() if t in own}
            # Those of live workers had their outputs and attempts written by the same
            # statement that ended them.
            self.stored = {c.task_id for c in mine
                           if c.transition is Transition.COMPLETE and c.task_id in self.ended}
        elif mine:
            self.ended = await transitions.end(tx, mine, [self.hashes[c.task_id] for c in mine])
        self.kept = [c for c in mine if c.task_id in self.ended]

    async def read_ahead(self, tx: Tx) -> None:
        """Send the read of the join state the round will need behind the locks and the ends,
        so it comes back in their round trip instead of one of its own. The server runs it
        after the locks are granted, a statement of its own, so it sees what
        :meth:`read_join_state` would. Only when every completion names the workflow it was
        claimed under (the worker's rounds); :meth:`read_join_state` uses it only if it covers
        every pair the locked rows call for (an execution migrated to another version while
        its task ran may need other steps)."""
        pairs: set[tuple[UUID, str]] = set()
        for c in self.ending:
            if c.workflow is None or not self.registry.has(*c.workflow):
                return
            downstream = self.registry.get(*c.workflow).downstream.get(c.step)
            if downstream is None:
                return
            pairs.update((c.execution_id, step) for step in (c.step, *downstream))
        keys = sorted(pairs)
        self.ahead = (frozenset(keys), await step_rows.read_later(tx, keys))

    async def store_outputs(self, tx: Tx) -> None:
        """Store the payloads of the tasks that ended, keyed by (execution, step, map_index,
        content hash): the same outcome recorded twice stores nothing new. Those the fence's
        statement stored already (:attr:`stored`) are left out."""
        stored = [c for c in self.kept
                  if self.hashes[c.task_id] is not None and c.task_id not in self.stored]
        if not stored:
            return
        await tx.send(
            "output_insert_many_across_executions_if_absent",
            execution_ids=[c.execution_id for c in stored],
            steps=[c.step for c in stored],
            map_indexes=[c.map_index for c in stored],
            content_hashes=[self.hashes[c.task_id] for c in stored],
            # The canonical JSON the hash was taken of: the server parses it, no second
            # encoding on this loop.
            payloads=[c.payload_json for c in stored],
            sources=[c.source for c in stored],
        )

    async def close_attempts(self, tx: Tx) -> None:
        """Close the open attempts of the tasks that ended (wakes and ready-task sweeps have
        no lease, so no attempt to close; those the fence's statement closed are left out),
        and keep what the handlers of all of them logged."""
        closed = [c for c in self.kept if c.lease_token is not None]
        closing = [c for c in closed if c.task_id not in self.stored]
        if not closing:
            await store_logs(tx, closed)
            return
        await tx.send(
            "attempt_finish_many_if_open",
            task_ids=[c.task_id for c in closing],
            lease_tokens=[c.lease_token for c in closing],
            outcomes=[c.attempt_outcome or c.outcome for c in closing],
            errors=[c.error for c in closing],
            ages=[c.age_seconds for c in closing],
        )
        await store_logs(tx, closed)

    async def read_join_state(self, tx: Tx) -> None:
        """Read, in one statement, the join state of every step the round touches (each ended
        step and its downstream) in every execution that still runs; a new statement after the
        locks, so it sees every sibling that committed before them."""
        by_execution: dict[UUID, list[Completion]] = {}
        for c in self.kept:
            by_execution.setdefault(c.execution_id, []).append(c)
        for e in self.execution_ids:  # id order, as locked
            row = self.locked.get(e)
            if e not in by_execution or row is None or row["status"] != ExecutionStatus.RUNNING:
                continue
            spec = self.registry.get(row["workflow_name"], row["workflow_version"])
            self.deciding.append((Advancer.for_locked(tx, spec, row, defer_writes=True,
                                                      max_payload_bytes=self.max_payload_bytes),
                                  by_execution[e]))
        pairs = [(a.execution_id, step) for a, completions in self.deciding
                 for step in sorted({s for c in completions
                                     for s in (c.step, *a.spec.downstream[c.step])})]
        state: dict[UUID, list[Row]] = {}
        if self.ahead is not None and self.ahead[0].issuperset(pairs):
            rows = await self.ahead[1]()
        else:
            rows = await step_rows.read(tx, pairs)
        for row in rows:
            state.setdefault(row["execution_id"], []).append(row)
        for a, _ in self.deciding:
            a.preload(state.get(a.execution_id, []))

    async def decide(self) -> None:
        """Each execution's fan-in decision on the state read (the pure
        :func:`~konduit.core.advance.advance`, cascades included). A decision that leaves its
        execution running defers its writes to :meth:`write_decisions`; one that ends it
        finishes it now (:mod:`konduit.engine.finish`)."""
        for a, completions in self.deciding:
            # Name the cause when the execution fails: the last line of each failed step's error.
            a.errors = {c.step: c.error.strip().splitlines()[-1][:500] for c in completions
                        if c.error and c.outcome not in (Outcome.SUCCEEDED, Outcome.DEGRADED)}
            self.advanced[a.execution_id] = await a.run_events(self._events(completions))

    def _events(self, completions: list[Completion]) -> list[tuple[Event, datetime | None]]:
        events: list[tuple[Event, datetime | None]] = []
        for c in completions:
            assert c.outcome is not None  # only completions that end their task get here
            routes = frozenset(c.routes) if c.routes is not None else None
            events.append((TaskEnded(c.step, c.outcome, routes), self.ended[c.task_id]))
        return events

    async def write_decisions(self, tx: Tx) -> None:
        """Write what the deferred decisions changed: the step rows of every execution, in
        (execution, step) order, and the changed step counts, in one statement; and remember
        which queues got tasks (:meth:`notify`)."""
        self.waking.extend(await write_deferred(tx, [a for a, _ in self.deciding]))

    async def return_to_ready(self, tx: Tx) -> None:
        """The round's retries and releases, one guarded statement each, in id order: task rows
        after every execution lock and every terminal write (the global lock order)."""
        self.moved = {c.task_id: await move(tx, c) for c in self.moving}

    async def notify(self, tx: Tx, taken: set[tuple[UUID, str]] | None) -> None:
        """Wake each queue that got tasks in this round other than those the caller claimed
        (``taken``; None: the claim was only sent, so the server checks what is still ready
        after it): NOTIFY takes a global lock at commit and costs every listener a
        transaction."""
        if taken is not None:
            for queue_name in sorted({queue for queue, key in self.waking if key not in taken}):
                await tx.send("task_notify_ready", queue=queue_name)
            return
        by_queue: dict[str, set[tuple[UUID, str]] | None] = {}
        for queue, key in self.waking:
            keys = by_queue.setdefault(queue, set())
            if key is None or keys is None:
                by_queue[queue] = None  # a map's items: always woken
            else:
                keys.add(key)
        for queue_name, keys in sorted(by_queue.items()):
            if keys is None:
                await tx.send("task_notify_ready", queue=queue_name)
            else:
                ordered = sorted(keys)
                await tx.send("task_notify_ready_if_unclaimed", queue=queue_name,
                              execution_ids=[e for e, _ in ordered], steps=[s for _, s in ordered])

    def results(self) -> list[tuple[Recorded, Advanced | None]]:
        """What happened to each completion, in batch order: a task whose lease no longer held
        (or whose execution is gone), and a duplicate of one earlier in the batch, are
        :attr:`Recorded.LEASE_LOST`."""
        moved = {**self.moved, **self.dropped}
        results: list[tuple[Recorded, Advanced | None]] = []
        recorded: set[int] = set()
        for c in self.batch:
            if self.first[c.task_id] is not c or c.task_id in recorded:
                results.append((Recorded.LEASE_LOST, None))  # a duplicate: the first one counted
                continue
            recorded.add(c.task_id)
            if c.task_id in moved:
                results.append((moved[c.task_id], None))
            elif c.task_id in self.ended:
                results.append((Recorded.ENDED, self.advanced.get(c.execution_id)))
            else:
                results.append((Recorded.LEASE_LOST, None))
        return results


async def write_deferred(tx: Tx, advancers: list[Advancer]) -> list[Waking]:
    """Write what the deferred decisions of several executions changed: the step rows of every
    execution, in (execution, step) order, and the changed step counts, in one statement.
    Returns the tasks they made ready (:data:`Waking`)."""
    deferred = sorted((a for a in advancers if a.deferred), key=lambda a: a.execution_id)
    changed = [a for a in deferred if a.execution.steps_pending != a.stored_steps_pending]
    await step_rows.write(tx, [(a.execution_id, *w) for a in deferred for w in a.step_writes()],
                          [(a.execution_id, a.execution.steps_pending) for a in changed])
    for a in changed:
        a.stored_steps_pending = a.execution.steps_pending
    made: list[Waking] = []
    for a in deferred:
        for step in a.result.fired:
            spec = a.spec[step]
            made.append((spec.queue, None if spec.is_map else (a.execution_id, step)))
        # Queues that got tasks other than through a fired step (a repair's first steps):
        # always woken.
        fired_queues = {a.spec[step].queue for step in a.result.fired}
        made.extend((queue, None) for queue in a.result.queues - fired_queues)
    return made


async def move(tx: Tx, c: Completion) -> Recorded:
    """A retry, reclaim or release: the task goes back to ready. It takes no execution lock: the
    guards in the statement alone keep a stale worker from resurrecting a task someone else
    ended."""
    if c.transition is Transition.COMPLETE and c.lease_token is not None \
            and await transitions.drop(tx, c.task_id, c.lease_token) is not None:
        return await close_dropped(tx, c)
    if c.command is Command.RELEASE:
        row = await transitions.release(tx, c)
    elif c.transition is Transition.LOSE:
        row = await transitions.lose(tx, c)
    else:
        row = await transitions.retry(tx, c)
    if row is None:
        if c.command is Command.RETRY and c.lease_token is not None \
                and c.transition is Transition.COMPLETE \
                and await transitions.is_leased(tx, c.task_id, c.lease_token):
            return Recorded.TOO_LATE
        return Recorded.LEASE_LOST
    await tx.run(
        "attempt_finish_if_open",
        lease_token=c.lease_token,
        outcome=AttemptOutcome.RELEASED if c.command is Command.RELEASE
        else c.attempt_outcome or AttemptOutcome.RETRY,
        error=c.error,
        age_seconds=c.age_seconds,
    )
    await store_logs(tx, [c])
    await tx.one("task_notify_ready", queue=row["queue"])
    return Recorded.RELEASED if c.command is Command.RELEASE else Recorded.RETRYING


async def close_dropped(tx: Tx, c: Completion) -> Recorded:
    """Close the attempt that a hedged task's other attempt outlived."""
    await tx.run(
        "attempt_finish_if_open",
        lease_token=c.lease_token,
        outcome=AttemptOutcome.RELEASED if c.command is Command.RELEASE
        else AttemptOutcome.DROPPED,
        error=c.error,
        age_seconds=c.age_seconds,
    )
    await store_logs(tx, [c])
    return Recorded.DROPPED


async def store_logs(tx: Tx, closed: Sequence[Completion]) -> None:
    """Keep what the handlers logged during the attempts just closed in ``tx``, one statement
    for all of them, sent with the round's other writes (no wait of its own); nothing at all
    when none logged (the usual round)."""
    logged = [c for c in closed if c.logs and c.lease_token is not None]
    if not logged:
        return
    states = [c.logs.state() for c in logged if c.logs is not None]
    await tx.send(
        "attempt_log_insert_many_if_closed",
        lease_tokens=[c.lease_token for c in logged],
        # A payload each: sealed with the codec (what a handler logs may carry its data).
        records=[Payload(json.dumps(records, ensure_ascii=False)) for records, _ in states],
        droppeds=[dropped for _, dropped in states],
    )
