"""Record a task's outcome and make the fan-in decision it triggers, in one transaction.

This is the protocol of DESIGN.md: lock the execution row first, then write the task through its
lease fence, store the output, and advance the DAG before committing. A crash anywhere in between
commits nothing, so the task stays leased and is reclaimed; it can never be left "done" with its
join undecided.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.advance import Event, ExecutionState, TaskEnded
from konduit.core.model import (
    MOVES,
    AttemptOutcome,
    Command,
    Completion,
    Recorded,
    Transition,
)
from konduit.core.payloads import DEFAULT_MAX_BYTES, content_hash
from konduit.db.database import Database, Row, Tx
from konduit.engine import step_rows, transitions
from konduit.engine.advancer import Advanced, Advancer
from konduit.engine.registry import Registry

log = logging.getLogger(__name__)


async def record(db: Database, registry: Registry, c: Completion, *,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Recorded, Advanced | None]:
    """Record one attempt's end. Returns what happened and, when the DAG advanced, how."""
    if c.command in MOVES:
        return await db.atomic(lambda tx: _move(tx, c)), None
    ((outcome, advanced),) = await record_many(db, registry, [c],
                                               max_payload_bytes=max_payload_bytes)
    return outcome, advanced


async def _move(tx: Tx, c: Completion) -> Recorded:
    """A retry, reclaim or release: the task goes back to ready. It takes no execution lock: the
    guards in the statement alone keep a stale worker from resurrecting a task someone else
    ended."""
    if c.transition is Transition.COMPLETE and c.lease_token is not None \
            and await transitions.drop(tx, c.task_id, c.lease_token) is not None:
        return await _dropped(tx, c)
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
    await tx.one("task_notify_ready", queue=row["queue"])
    return Recorded.RELEASED if c.command is Command.RELEASE else Recorded.RETRYING


async def _dropped(tx: Tx, c: Completion) -> Recorded:
    """Close the attempt that a hedged task's other attempt outlived."""
    await tx.run(
        "attempt_finish_if_open",
        lease_token=c.lease_token,
        outcome=AttemptOutcome.RELEASED if c.command is Command.RELEASE
        else AttemptOutcome.DROPPED,
        error=c.error,
        age_seconds=c.age_seconds,
    )
    return Recorded.DROPPED


async def record_ended(
    db: Database, registry: Registry, batch: list[Completion]
) -> list[tuple[Recorded, Advanced | None]]:
    """Record terminal outcomes and advance their DAGs in one transaction (kept for its callers:
    :func:`record_many` does the work, for one execution's completions or several)."""
    return await record_many(db, registry, batch)


async def record_many(
    db: Database, registry: Registry, batch: list[Completion],
    *, then: Callable[[Tx], Awaitable[set[tuple[UUID, str]]]] | None = None,
    max_payload_bytes: int = DEFAULT_MAX_BYTES,
) -> list[tuple[Recorded, Advanced | None]]:
    """Record the terminal outcomes of tasks of one or MANY executions in one transaction, and
    make each execution's fan-in decision in it: under load a worker's completions that ended
    together share one commit, one round of set-based writes, and one decision per execution.
    Retries and releases in the batch (:data:`MOVES`) are written in the same transaction, last.

    The execution rows are locked first, in id order (DESIGN's global lock order: executions,
    then tasks in id order, then outputs), so two batches that share executions queue instead of
    deadlocking. Results come back in ``batch`` order; a task whose lease no longer holds (or
    whose execution is gone) is :attr:`Recorded.LEASE_LOST` and changes nothing.

    ``then`` runs last in the same transaction (a worker claims its freed slots there: one commit
    records a round and starts the next) and returns the (execution, step) pairs it claimed; the
    round then wakes other workers only for a queue that got tasks it did not claim itself. It
    may run again if the transaction is rerun after a conflict. ``max_payload_bytes`` bounds
    each item of a map step that fans out (the App's limit)."""
    # The same task twice in one batch (a redelivery): only the first may pass the fence.
    first: dict[int, Completion] = {}
    for c in batch:
        first.setdefault(c.task_id, c)
    unique = [c for c in first.values() if c.command is Command.END]
    moving = sorted((c for c in first.values() if c.command in MOVES), key=lambda c: c.task_id)
    # Hashed once, outside the transaction: a conflict reruns only database work.
    hashes = {
        c.task_id: content_hash(c.payload_json) if c.payload_json is not None else None
        for c in unique
    }
    execution_ids = sorted({c.execution_id for c in unique})
    dropped: dict[int, Recorded] = {}
    # (queue, (execution, step)) of the tasks the round's deferred decisions made ready; a map
    # step's key is never claimed whole (it has one task per item), so its queue is always woken.
    waking: list[tuple[str, tuple[UUID, str] | None]] = []

    async def write(tx: Tx) -> tuple[dict[int, datetime], dict[UUID, Advanced], dict[int, Recorded]]:
        dropped.clear()  # a rerun of the transaction decides afresh
        waking.clear()
        ended, advanced = await decide(tx) if unique else ({}, {})
        # Task rows after every execution lock and every terminal write (the global lock order);
        # one guarded statement each, in id order.
        moved = {c.task_id: await _move(tx, c) for c in moving}
        taken = await then(tx) if then is not None else set()
        # NOTIFY takes a global lock at commit and costs every listener a transaction: wake a
        # queue only for the tasks this round made ready and did not claim itself.
        for queue_name in sorted({queue for queue, key in waking if key not in taken}):
            await tx.send("task_notify_ready", queue=queue_name)
        return ended, advanced, moved

    async def decide(tx: Tx) -> tuple[dict[int, datetime], dict[UUID, Advanced]]:
        # Acquire the execution row locks before anything else, to serialize fan-in decisions.
        # Without them, concurrent completions of sibling branches each read join state that
        # misses the others' uncommitted writes (READ COMMITTED), so none of them fires the
        # join and the execution stalls with every task green (seed 000).
        lock = await (tx.later("execution_lock", id=execution_ids[0]) if len(execution_ids) == 1
                      else tx.later("execution_lock_many_in_id_order", ids=execution_ids))
        # Only a success ends a hedged task while its other attempt runs: any other outcome
        # ends just its own attempt, and the survivor decides (under the row lock the drop took).
        may_drop = [c for c in unique if c.transition == "complete" and c.outcome != "succeeded"
                    and c.lease_token is not None]
        # Without such outcomes (the usual round) the terminal writes go out with the locks, in
        # one round trip: the server runs them in order, so only once every lock is held.
        ending = None if may_drop else await transitions.end_later(
            tx, unique, [hashes[c.task_id] for c in unique])
        locked = {row["id"]: row for row in await lock()}
        mine = [c for c in unique if c.execution_id in locked]
        for c in sorted((c for c in may_drop if c.execution_id in locked), key=lambda c: c.task_id):
            assert c.lease_token is not None
            if await transitions.drop(tx, c.task_id, c.lease_token):
                dropped[c.task_id] = await _dropped(tx, c)
        mine = [c for c in mine if c.task_id not in dropped]
        if ending is not None:
            # A task of an execution that is gone is gone with it: nothing of it could end.
            ended = {t: at for t, at in (await ending()).items() if t in {c.task_id for c in mine}}
        elif mine:
            ended = await transitions.end(tx, mine, [hashes[c.task_id] for c in mine])
        else:
            ended = {}
        if not mine:
            return {}, {}
        kept = [c for c in mine if c.task_id in ended]
        stored = [c for c in kept if hashes[c.task_id] is not None]
        if stored:
            await tx.send(
                "output_insert_many_across_executions_if_absent",
                execution_ids=[c.execution_id for c in stored],
                steps=[c.step for c in stored],
                map_indexes=[c.map_index for c in stored],
                content_hashes=[hashes[c.task_id] for c in stored],
                # The canonical JSON the hash was taken of: the server parses it, no second
                # encoding on this loop.
                payloads=[c.payload_json for c in stored],
                sources=[c.source for c in stored],
            )
        closing = [c for c in kept if c.lease_token is not None]
        if closing:
            await tx.send(
                "attempt_finish_many_if_open",
                task_ids=[c.task_id for c in closing],
                lease_tokens=[c.lease_token for c in closing],
                outcomes=[c.attempt_outcome or c.outcome for c in closing],
                errors=[c.error for c in closing],
                ages=[c.age_seconds for c in closing],
            )
        by_execution: dict[UUID, list[Completion]] = {}
        for c in kept:
            by_execution.setdefault(c.execution_id, []).append(c)
        deciding = [(locked[e], by_execution[e]) for e in execution_ids  # id order, as locked
                    if e in by_execution and locked[e]["status"] == "running"]
        advancers = [(_advancer(tx, registry, execution, max_payload_bytes), completions)
                     for execution, completions in deciding]
        # The join state every decision of the round reads, in one statement.
        pairs = [(a.execution_id, step) for a, completions in advancers
                 for step in sorted({s for c in completions
                                     for s in (c.step, *a.spec.downstream[c.step])})]
        state: dict[UUID, list[Row]] = {}
        for row in await step_rows.read(tx, pairs):
            state.setdefault(row["execution_id"], []).append(row)
        for a, _ in advancers:
            a.preload(state.get(a.execution_id, []))
        advanced: dict[UUID, Advanced] = {}
        for a, completions in advancers:
            # Name the cause when the execution fails: the last line of each failed step's error.
            a.errors = {c.step: c.error.strip().splitlines()[-1][:500] for c in completions
                        if c.error and c.outcome not in ("succeeded", "degraded")}
            advanced[a.execution_id] = await a.run_events(_events(completions, ended))
        waking.extend(await write_deferred(tx, [a for a, _ in advancers]))
        return ended, advanced

    # A deadlock or serialization failure rolls it all back: run it again (it is database work only).
    ended, advanced, moved = await db.atomic(write, pipeline=True)
    moved.update(dropped)
    results: list[tuple[Recorded, Advanced | None]] = []
    recorded: set[int] = set()
    for c in batch:
        if first[c.task_id] is not c or c.task_id in recorded:
            results.append((Recorded.LEASE_LOST, None))  # a duplicate: the first one counted
            continue
        recorded.add(c.task_id)
        if c.task_id in moved:
            results.append((moved[c.task_id], None))
        elif c.task_id in ended:
            results.append((Recorded.ENDED, advanced.get(c.execution_id)))
        else:
            results.append((Recorded.LEASE_LOST, None))
    return results


def _advancer(tx: Tx, registry: Registry, execution: Row, max_payload_bytes: int) -> Advancer:
    """The fan-in decision of one locked execution of a round; its writes are deferred to the
    round's set-based statements (:func:`write_deferred`) unless it ends the execution."""
    spec = registry.get(execution["workflow_name"], execution["workflow_version"])
    return Advancer(tx, spec, execution["id"],
                    ExecutionState(execution["status"], execution["steps_pending"]),
                    execution["generation"], max_payload_bytes=max_payload_bytes,
                    defer_writes=True, window_left=execution["window_left_seconds"])


async def write_deferred(tx: Tx, advancers: list[Advancer]
                         ) -> list[tuple[str, tuple[UUID, str] | None]]:
    """Write what the deferred decisions of a round changed: the step rows of every execution
    in one statement, in (execution, step) order, and the changed step counts in another.
    Returns the tasks they made ready as (queue, (execution, step)), the key None for a map
    step's items: the caller wakes their queues (see :func:`record_many`)."""
    deferred = sorted((a for a in advancers if a.deferred), key=lambda a: a.execution_id)
    await step_rows.write(tx, [(a.execution_id, *w) for a in deferred for w in a.step_writes()])
    changed = [a for a in deferred if a.execution.steps_pending != a.stored_steps_pending]
    if changed:
        await tx.send(
            "execution_set_steps_pending_many_if_running_and_changed",
            ids=[a.execution_id for a in changed],
            steps_pendings=[a.execution.steps_pending for a in changed],
        )
        for a in changed:
            a.stored_steps_pending = a.execution.steps_pending
    made: list[tuple[str, tuple[UUID, str] | None]] = []
    for a in deferred:
        for step in a.result.fired:
            spec = a.spec[step]
            made.append((spec.queue, None if spec.is_map else (a.execution_id, step)))
        # Queues that got tasks other than through a fired step (a repair's first steps):
        # always woken.
        fired_queues = {a.spec[step].queue for step in a.result.fired}
        made.extend((queue, None) for queue in a.result.queues - fired_queues)
    return made


def _events(completions: list[Completion], ended: dict[int, datetime]
            ) -> list[tuple[Event, datetime | None]]:
    events: list[tuple[Event, datetime | None]] = []
    for c in completions:
        assert c.outcome is not None  # only completions that end their task get here
        routes = frozenset(c.routes) if c.routes is not None else None
        events.append((TaskEnded(c.step, c.outcome, routes), ended[c.task_id]))
    return events


async def record_late_result(db: Database, lease_token: UUID, payload_json: str, payload: Any) -> bool:
    """Keep a result that arrived after the deadline ended its attempt. It is stored beside the
    payload the join consumed and never replaces it; returns whether it was stored."""
    async with db.transaction() as tx:
        stored = await tx.run(
            "output_insert_late_if_attempt_ended_by_deadline",
            lease_token=lease_token,
            content_hash=content_hash(payload_json),
            payload=Jsonb(payload),
        )
    return stored > 0
