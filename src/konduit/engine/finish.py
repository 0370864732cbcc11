"""Finishing an execution, in one place: the fan-in decision that ends it, a cancel, its hard
timeout, and the children a stopped execution stops all end it through :func:`finish_execution`.

Whoever finishes an execution holds its row lock (``execution_lock``, or the round's lock of
several in id order) in the caller's transaction, so the finish commits with what caused it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from konduit.core.model import ExecutionStatus
from konduit.core.payloads import canonical_json
from konduit.core.waits import parent_task_of
from konduit.db.database import Database, Tx
from konduit.engine import limit_keys, transitions
from konduit.errors import ExecutionNotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildEnded:
    """A child workflow's execution ended: once that transaction commits, the waiting task of
    its parent's child-workflow step may be woken (:func:`konduit.engine.waits.wake_parent`)."""

    child_id: UUID
    parent_task_id: int


OUTPUT_MAX_BYTES = 2**31 - 1
"""An execution's output gathers payloads each already within the limit: only PostgreSQL's own
bound applies to it."""


@dataclass(frozen=True)
class Finished:
    """An execution ended in the caller's transaction; ``child_ended`` when it is a child."""

    child_ended: ChildEnded | None = None


async def finish_execution(
    tx: Tx, execution_id: UUID, status: str, output: Any, error: str | None, steps_pending: int
) -> Finished | None:
    """End a running execution; its unfinished tasks and steps are cancelled. None when it was
    not running. When it is a child workflow (its idempotency key names its parent's task, read
    back by the finish statement itself), the answer says which task to wake after commit: the
    parent's execution is older, so locking it here would break the id order of locks."""
    row = await tx.one(
        "execution_finish_if_running",
        id=execution_id,
        status=status,
        # Sealed with the codec on its way in (its steps' payloads, gathered, as one payload).
        output=canonical_json(output, what=f"output of execution {execution_id}",
                              max_bytes=OUTPUT_MAX_BYTES),
        error=error,
        steps_pending=steps_pending,
    )
    if row is None:
        return None
    await tx.run("execution_output_insert", id=execution_id, version=row["output_version"])
    if row["webhooks"]:  # the outbox: deliveries commit with the finish (docs/webhooks.md)
        await tx.send("webhook_delivery_insert_for_execution_if_finished", id=execution_id)
    if status != "succeeded":
        cancelled = await transitions.cancel_unfinished(tx, execution_id, f"execution {status}")
        if cancelled:
            await tx.run("attempt_finish_open_for_tasks", task_ids=cancelled, outcome="cancelled")
            await tx.one("execution_notify_stopped", id=str(execution_id))
            await _stop_children(tx, execution_id, status)
        await tx.run("step_cancel_unfinished", execution_id=execution_id)
        # A map's items still waiting in chunks are never created now (a succeeded execution
        # has none left: its maps' joins counted every item).
        await tx.send("map_chunk_delete_for_execution", execution_id=execution_id)
    if row["finish_waited"]:
        await tx.one("execution_notify_finished", id=str(execution_id))
    if row["run_key"] is not None:  # Workflow(max_running=): its slot goes to the next pending
        await limit_keys.fill_after_finish(tx, row["workflow_name"], row["run_key"])
    parent_task = parent_task_of(row["idempotency_key"])
    return Finished(None if parent_task is None else ChildEnded(execution_id, parent_task))


async def stop_execution(tx: Tx, execution_id: UUID, status: ExecutionStatus,
                         reason: str) -> Finished | None:
    """Lock an execution and end it without output (cancelled, timed out) if it still runs;
    None when it had already finished. Raises :class:`ExecutionNotFound` when it is gone."""
    row = await tx.one("execution_lock", id=execution_id)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {execution_id}")
    # A scheduled execution (start later), or one pending a slot (max_running), is stopped as a
    # running one: its tasks wait unclaimed.
    if row["status"] not in (ExecutionStatus.RUNNING, ExecutionStatus.SCHEDULED,
                             ExecutionStatus.PENDING):
        return None
    return await finish_execution(tx, execution_id, status, None, reason, row["steps_pending"])


async def _stop_children(tx: Tx, execution_id: UUID, status: str) -> None:
    """A stopped execution stops the child executions its child-workflow steps started (and
    theirs, recursively); asked only when it had unfinished tasks, so an ordinary execution's
    end costs no statement more. Children are locked after their parent: a child's id is newer
    (UUIDv7), so this is the id order of executions."""
    for child in await tx.all("execution_children_running", execution_id=execution_id):
        try:
            # Its parent's waiting task was cancelled above, in this transaction: nothing to
            # wake, so the answer is dropped.
            await stop_execution(tx, child["id"], ExecutionStatus.CANCELLED,
                                 f"its parent execution {execution_id} ended {status}")
        except ExecutionNotFound:
            continue  # pruned since it was listed: nothing left to stop


async def end_timed_out_executions(db: Database, *, limit: int = 100) -> list[Finished]:
    """End running executions past their hard timeout as ``timed_out``, each in its own
    transaction; returns those ended (each says whether it was a child whose parent's step to
    wake)."""
    rows = await db.all("execution_list_timed_out", limit=limit)
    ended: list[Finished] = []
    for row in rows:
        try:
            async with db.transaction() as tx:
                finished = await stop_execution(tx, row["id"], ExecutionStatus.TIMED_OUT,
                                                "the execution exceeded its timeout")
        except ExecutionNotFound:
            continue  # pruned since it was listed
        if finished is not None:
            ended.append(finished)
            log.info("execution %s timed out", row["id"])
    return ended
