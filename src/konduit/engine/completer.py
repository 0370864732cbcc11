"""Record a task's outcome and make the fan-in decision it triggers, in one transaction.

This is the protocol of DESIGN.md: lock the execution row first, then write the task through its
lease fence, store the output, and advance the DAG before committing. A crash anywhere in between
commits nothing, so the task stays leased and is reclaimed; it can never be left "done" with its
join undecided. The entry points for callers live here; the round's steps are
:class:`konduit.engine.round.Round`.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

# Completion and Recorded are imported from here by the worker's callers and the tests.
from konduit.core.model import MOVES, Completion, Recorded
from konduit.core.payloads import DEFAULT_MAX_BYTES, content_hash
from konduit.db.database import Database
from konduit.engine.advancer import Advanced
from konduit.engine.registry import Registry
from konduit.engine.round import Claim, Round, move

__all__ = ["Completion", "Recorded", "record", "record_ended", "record_late_result", "record_many"]


async def record(db: Database, registry: Registry, c: Completion, *,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Recorded, Advanced | None]:
    """Record one attempt's end. Returns what happened and, when the DAG advanced, how."""
    if c.command in MOVES:
        return await db.atomic(lambda tx: move(tx, c)), None
    ((outcome, advanced),) = await record_many(db, registry, [c],
                                               max_payload_bytes=max_payload_bytes)
    return outcome, advanced


async def record_ended(
    db: Database, registry: Registry, batch: list[Completion]
) -> list[tuple[Recorded, Advanced | None]]:
    """Record terminal outcomes and advance their DAGs in one transaction (kept for its callers:
    :func:`record_many` does the work, for one execution's completions or several)."""
    return await record_many(db, registry, batch)


async def record_many(
    db: Database, registry: Registry, batch: list[Completion],
    *, then: Claim | None = None,
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
    round_ = Round(registry, batch, max_payload_bytes=max_payload_bytes)
    # A deadlock or serialization failure rolls it all back: run it again (it is database work only).
    await db.atomic(lambda tx: round_.run(tx, then), pipeline=True)
    return round_.results()


async def record_late_result(db: Database, lease_token: UUID, payload_json: str, payload: Any) -> bool:
    """Keep a result that arrived after the deadline ended its attempt. It is stored beside the
    payload the join consumed and never replaces it; returns whether it was stored."""
    async with db.transaction() as tx:
        stored = await tx.run(
            "output_insert_late_if_attempt_ended_by_deadline",
            lease_token=lease_token,
            content_hash=content_hash(payload_json),
            payload=payload_json,  # sealed with the codec on its way in
        )
    return stored > 0
