"""Every change of a task's status, and nothing else.

Each transition of DESIGN.md's task lifecycle is one guard-named statement that re-checks, at the
time of its own write, what it depends on: the lease token (and for a reclaim, that the lease has
expired and its worker is gone), the deadline, the status. A check made in an earlier statement
would be a race (River #1302: a rescuer overwrote a job that completed after the rescuer's read).

| transition | from -> to                          | statement                               |
|------------|-------------------------------------|-----------------------------------------|
| claim      | ready -> running                    | task_claim_batch (_flow_limited)        |
| complete   | running -> terminal                 | task_complete_many_if_leased            |
| retry      | running -> ready (backoff)          | task_retry_if_leased_before_deadline    |
| release    | running -> ready, attempt uncounted | task_release_if_leased                  |
| lose       | running -> ready or terminal        | task_lose_if_rescuable / task_end_if_rescuable |
| expire     | ready/running/waiting -> degraded/timed_out | task_expire_if_past_deadline    |
| cancel     | ready/running/waiting -> cancelled  | task_cancel_unfinished                  |
| wait       | running -> waiting (arming attempt) | task_wait_if_leased                     |
| due        | waiting, event accepted -> due now  | task_mark_due_if_waiting                |
| wake       | waiting -> succeeded/degraded/failed| task_wake_if_waiting                    |

Durable waits (docs/durable-waits.md): a wait step's arming attempt ends with ``wait`` instead of
``complete``; the task then holds no lease. ``wake`` (in the fan-in transaction) and ``expire``
are complements: a waiting task that became due (``wait_until``) before its deadline is only
woken, one that did not is only expired, so a late event changes nothing.

Hedged attempts (docs/hedging.md) add a second lease to a running task; they change no status
(the complete transition accepts either lease, and ends both):

| transition | lease change                                | statement                          |
|------------|---------------------------------------------|------------------------------------|
| hedge      | running, no hedge -> running with a hedge   | task_hedge_claim_if_straggling     |
| drop       | one attempt of two ends; the other decides  | task_drop_attempt_if_leased        |
| unhedge    | the hedge's worker is gone: hedge dropped   | task_drop_hedge_if_rescuable       |
| promote    | the primary's worker is gone: hedge takes it| task_promote_hedge_if_rescuable    |

A step's fallback is called only after ``task_start_fallback_if_unstarted`` (no status change)
committed its start, at most once per task: a sweep or a rescue that finds it set ends the task
``timed_out`` without calling it again, and only once the fallback's time limit is over (the
``fallback_settle`` guard of ``task_expire_if_past_deadline`` and ``task_end_if_rescuable``); a
reclaim never retries such a task.

Terminal transitions run inside the fan-in transaction (:meth:`konduit.engine.round.Round.fence`),
after the execution row is locked; the others decide nothing about the DAG and take no execution lock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.model import Completion, Transition, WaitKind
from konduit.db.database import Database, Row, Tx


class Claim(list[Row]):
    """The rows of the claimed tasks. ``limited_ready``: steps with flow limits had ready tasks
    at the time of the claim (its limits may have held some back: worth claiming again soon)."""

    limited_ready: bool = False


async def claim(
    db: Database | Tx,
    *,
    queues: Sequence[str],
    workflows: Sequence[str],
    limit: int,
    lease_seconds: float,
    worker_id: str,
    turn: int = 0,
    limited: bool = False,
    key_cursors: KeyCursors | None = None,
) -> Claim:
    """Lease up to ``limit`` ready tasks of running executions (ready -> running).

    In each queue the oldest execution's tasks come first within a priority; the queues share
    the limit, taking turns in the order given, starting at ``queues[turn % len(queues)]``. A
    worker passes a counter as ``turn``, so that claims smaller than its number of queues (one
    freed slot at a time) still serve every queue in turn.

    ``limited``: some of ``workflows`` have steps with flow limits (``concurrency=``,
    ``rate=``). Their tasks are claimed only by :func:`_claim_flow`; the plain claim skips them.
    ``key_cursors``: some of those limits are per key; the worker's turns among their keys,
    kept from one claim to the next."""
    params = claim_params(queues, workflows, limit, lease_seconds, worker_id, turn)
    if not limited:
        if isinstance(db, Tx):
            return await _claim_plain(db, params)
        # Its own pipelined transaction (the pin needs one): BEGIN, the pin, the claim and
        # COMMIT go out together and the rows are read once it committed, one round trip as
        # the autocommit claim was.
        fetch = await db.atomic(lambda tx: tx.later("task_claim_batch", **params), pipeline=True)
        return Claim(await fetch())
    if isinstance(db, Tx):
        return await _claim_flow(db, params, key_cursors)
    return await db.atomic(lambda tx: _claim_flow(tx, params, key_cursors))


async def _claim_plain(tx: Tx, params: dict[str, Any]) -> Claim:
    """The plain claim (its transaction pinned: konduit/db/queries.py, plan: pinned)."""
    return Claim(await tx.all("task_claim_batch", **params))


def claim_params(queues: Sequence[str], workflows: Sequence[str], limit: int,
                 lease_seconds: float, worker_id: str, turn: int = 0) -> dict[str, Any]:
    """The parameters of a claim (see :func:`claim`): the queues rotated by ``turn``."""
    first = turn % len(queues) if queues else 0
    return {"queues": [*queues[first:], *queues[:first]], "workflows": list(workflows),
            "limit": limit, "lease_seconds": lease_seconds, "worker_id": worker_id}


async def claim_later(tx: Tx, queues: Sequence[str], workflows: Sequence[str], limit: int,
                      lease_seconds: float, worker_id: str, turn: int = 0,
                      ) -> Callable[[], Awaitable[Claim]]:
    """The plain claim of :func:`claim` (no flow limits), sent now in ``tx`` (queued, in a
    pipelined transaction) and answered when the returned function is awaited: a completion
    round sends it with its COMMIT and reads the claimed rows once it has committed."""
    rows = await tx.later("task_claim_batch", **claim_params(
        queues, workflows, limit, lease_seconds, worker_id, turn))

    async def claimed() -> Claim:
        return Claim(await rows())

    return claimed


class KeyCursors(dict[tuple[str, str], str]):
    """Per step limited per key, the last key a worker's claim looked at: the next claim looks
    at the keys after it first (wrapping around), so every key with ready tasks gets its turn
    however many there are, and a claim reads a bounded number of them."""

    keys_per_step: int = 32


async def _lock_keys(tx: Tx, params: dict[str, Any], cursors: KeyCursors) -> list[Row]:
    """Lock the rows of keys with ready tasks (flow_limit_lock_keys_if_ready), moving the cursors."""
    steps = sorted(cursors)
    locked = await tx.all(
        "flow_limit_lock_keys_if_ready", queues=params["queues"], workflows=params["workflows"],
        cursor_workflows=[w for w, _ in steps], cursor_steps=[s for _, s in steps],
        cursor_keys=[cursors[k] for k in steps],
        keys_per_step=max(cursors.keys_per_step, params["limit"]),
    )
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for r in locked:
        at = (r["workflow"], r["step"])
        if at not in last or r["ord"] > last[at][0]:
            last[at] = (r["ord"], r["key"])
    cursors.update({at: key for at, (_, key) in last.items()})
    return locked


async def _claim_flow(tx: Tx, params: dict[str, Any],
                      key_cursors: KeyCursors | None = None) -> Claim:
    """Lock the rows of the limited steps with ready tasks (skipping those another claimer
    holds), then claim in a second statement, whose snapshot is taken after the locks were
    granted: two claimers of one step can never both count the same free slot. (One statement
    could not do it: under READ COMMITTED its snapshot predates the lock it waits for.) With no
    such step, the plain claim runs; it skips limited tasks."""
    locked = await tx.all("flow_limit_lock_if_ready", queues=params["queues"],
                          workflows=params["workflows"])
    keys = [] if key_cursors is None else await _lock_keys(tx, params, key_cursors)
    if not locked and not keys:
        return await _claim_plain(tx, params)
    rows = Claim(await tx.all(
        "task_claim_batch_flow_limited",
        flow_workflows=[r["workflow"] for r in locked],
        flow_steps=[r["step"] for r in locked],
        key_workflows=[r["workflow"] for r in keys],
        key_steps=[r["step"] for r in keys],
        key_keys=[r["key"] for r in keys],
        **params,
    ))
    rows.limited_ready = True
    return rows


async def hedge(
    db: Database | Tx,
    *,
    hedged: Sequence[tuple[str, str, float]],
    limit: int,
    lease_seconds: float,
    worker_id: str,
) -> list[Row]:
    """Lease a hedge of up to ``limit`` straggling tasks: ``hedged`` lists (``name@version``,
    step, threshold seconds) of the steps to hedge; a running task of one whose current attempt
    has run past its threshold, never hedged in this attempt, gets a second lease. Rows look
    like :func:`claim`'s (``lease_token`` is the hedge's) with ``hedged`` true."""
    if not hedged or limit <= 0:
        return []
    return await db.all(
        "task_hedge_claim_if_straggling",
        workflows=[w for w, _, _ in hedged],
        steps=[s for _, s, _ in hedged],
        thresholds=[t for _, _, t in hedged],
        limit=limit,
        lease_seconds=lease_seconds,
        worker_id=worker_id,
    )


async def drop(tx: Tx, task_id: int, lease_token: UUID) -> Row | None:
    """End only this attempt of a task whose other attempt runs on (a dropped primary hands its
    lease to the hedge). None when there is no other attempt (or no lease): the row stays
    locked until ``tx`` ends, so the caller retries or ends the task with no hedge starting in
    between."""
    return await tx.one("task_drop_attempt_if_leased", id=task_id, lease_token=lease_token)


async def unhedge(tx: Tx, task_id: int, hedge_token: UUID, lease_seconds: float) -> bool:
    """Rescue: drop a hedge whose worker is gone (the primary attempt runs on)."""
    return await tx.one("task_drop_hedge_if_rescuable", id=task_id, hedge_token=hedge_token,
                        lease_seconds=lease_seconds) is not None


async def promote(tx: Tx, task_id: int, lease_token: UUID, lease_seconds: float) -> bool:
    """Rescue: the primary's worker is gone and the hedge lives: the hedge becomes the lease."""
    return await tx.one("task_promote_hedge_if_rescuable", id=task_id, lease_token=lease_token,
                        lease_seconds=lease_seconds) is not None


async def hold(tx: Tx, task_id: int, lease_token: UUID) -> bool:
    """Whether the lease still holds the task; the row stays share-locked until ``tx`` ends, so a
    cancel cannot commit between this check and the handler's start."""
    return await tx.one("task_hold_if_leased", id=task_id, lease_token=lease_token) is not None


async def is_leased(tx: Tx, task_id: int, lease_token: UUID) -> bool:
    return await tx.one("task_is_leased", id=task_id, lease_token=lease_token) is not None


async def retry(tx: Tx, c: Completion) -> Row | None:
    """running -> ready after ``c.retry_delay``, if the lease holds and the backoff ends before
    the deadline (the caller tells the two apart with :func:`is_leased`)."""
    return await tx.one(
        "task_retry_if_leased_before_deadline",
        id=c.task_id,
        lease_token=c.lease_token,
        delay_seconds=c.retry_delay,
        error=c.error,
    )


async def lose(tx: Tx, c: Completion) -> Row | None:
    """Reclaim: running -> ready after the backoff, if the task's worker is still gone."""
    return await tx.one(
        "task_lose_if_rescuable",
        id=c.task_id,
        lease_token=c.lease_token,
        delay_seconds=c.retry_delay,
        error=c.error,
        lease_seconds=c.guard_seconds,
    )


async def release(tx: Tx, c: Completion) -> Row | None:
    """Graceful stop: running -> ready at once; the attempt does not count."""
    return await tx.one("task_release_if_leased", id=c.task_id, lease_token=c.lease_token)


async def end(tx: Tx, completions: Sequence[Completion], hashes: Sequence[str | None]
              ) -> dict[int, datetime]:
    """Terminal transitions of tasks of locked executions; returns the ids that changed with
    their finish time. Completions of live workers go in one statement (in id order, the lock
    order of every multi-row task write); reclaims and deadline sweeps come one at a time."""
    return await (await end_later(tx, completions, hashes))()


async def end_later(tx: Tx, completions: Sequence[Completion], hashes: Sequence[str | None],
                    *, store: bool = False) -> Callable[[], Awaitable[dict[int, datetime]]]:
    """:func:`end`, with the live workers' statement sent now (queued behind what the caller
    sent before it, such as the execution locks, in a pipelined transaction) and its answer
    read, and the one-at-a-time transitions run, when the returned function is awaited.

    With ``store``, the live workers' statement also stores the outputs and closes the
    attempts of the tasks it ended (a completion round's three writes in one
    statement); the other transitions leave both to the caller."""
    leased = [(c, h) for c, h in zip(completions, hashes, strict=True) if c.transition is Transition.COMPLETE]
    leased.sort(key=lambda pair: pair[0].task_id)
    ended_params: dict[str, Any] = {
        "ids": [c.task_id for c, _ in leased],
        "lease_tokens": [c.lease_token for c, _ in leased],
        "outcomes": [c.outcome for c, _ in leased],
        "output_hashes": [h for _, h in leased],
        "errors": [c.error for c, _ in leased],
        "routes": [Jsonb(list(c.routes)) if c.routes is not None else None for c, _ in leased],
        "ages": [c.age_seconds for c, _ in leased],
    }
    fetch: Callable[[], Awaitable[list[Row]]] | None = None
    if leased and store:
        fetch = await tx.later(
            "task_complete_many_if_leased_storing_outputs_and_attempts",
            **ended_params,
            attempt_outcomes=[c.attempt_outcome or c.outcome for c, _ in leased],
            # The canonical JSON the hash was taken of: the server parses it.
            payloads=[c.payload_json if h is not None else None for c, h in leased],
            execution_ids=[c.execution_id for c, _ in leased],  # whose payloads, for the store
            sources=[c.source for c, _ in leased],
        )
    elif leased:
        fetch = await tx.later("task_complete_many_if_leased", **ended_params)

    async def finish() -> dict[int, datetime]:
        ended: dict[int, datetime] = {}
        if fetch is not None:
            ended.update((row["id"], row["finished_at"]) for row in await fetch())
        for c, h in zip(completions, hashes, strict=True):
            if c.transition is Transition.COMPLETE:
                continue
            params: dict[str, Any] = {
                "id": c.task_id, "lease_token": c.lease_token, "outcome": c.outcome,
                "output_hash": h, "error": c.error,
            }
            if c.transition is Transition.LOSE:
                row = await tx.one("task_end_if_rescuable", lease_seconds=c.guard_seconds,
                                   fallback_settle=c.fallback_settle, **params)
            elif c.transition is Transition.WAKE:
                row = await tx.one("task_wake_if_waiting", outcome=c.outcome, output_hash=h,
                                   error=c.error, id=c.task_id)
            elif c.transition is Transition.EXPIRE:
                row = await tx.one("task_expire_if_past_deadline", grace_seconds=c.guard_seconds,
                                   fallback_settle=c.fallback_settle, **params)
            else:
                raise ValueError(f"unknown transition {c.transition!r}")
            if row is not None:
                ended[row["id"]] = row["finished_at"]
        return ended

    return finish


async def cancel_unfinished(tx: Tx, execution_id: UUID, reason: str) -> list[int]:
    """ready/running -> cancelled for every unfinished task of a stopped execution."""
    rows = await tx.all("task_cancel_unfinished", execution_id=execution_id, reason=reason)
    return [r["id"] for r in rows]


async def wait(tx: Tx, c: Completion, *, kind: WaitKind, event: str | None = None,
               key: str | None = None, until: datetime | None = None,
               delay_seconds: float | None = None, child: UUID | None = None) -> Row | None:
    """The arming attempt's end: running -> waiting, if the lease holds (no execution lock:
    it decides nothing about the DAG)."""
    return await tx.one("task_wait_if_leased", id=c.task_id, lease_token=c.lease_token,
                        kind=kind, event=event, key=key, until=until,
                        delay_seconds=delay_seconds, child=child)


async def mark_due(tx: Tx, task_id: int) -> bool:
    """An event was accepted for a waiting task before its deadline: it is due now."""
    return await tx.one("task_mark_due_if_waiting", id=task_id) is not None
