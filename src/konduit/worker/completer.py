"""Record a task's outcome and make the fan-in decision it triggers, in one transaction.

This is the protocol of DESIGN.md: lock the execution row first, then write the task through its
lease fence, store the output, and advance the DAG before committing. A crash anywhere in between
commits nothing, so the task stays leased and is reclaimed; it can never be left "done" with its
join undecided.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.advance import TaskEnded
from konduit.db.database import Database
from konduit.engine.advancer import Advanced, record_event
from konduit.payloads import content_hash
from konduit.registry import Registry

log = logging.getLogger("konduit.completer")


class Recorded(enum.Enum):
    ENDED = "ended"  # outcome recorded and the DAG advanced
    RETRYING = "retrying"  # attempt failed, the task is ready again after its backoff
    RELEASED = "released"  # handed back unrun (shutdown): ready at once, attempt not counted
    LEASE_LOST = "lease_lost"  # the caller no longer held the task: nothing changed


@dataclass(frozen=True)
class Completion:
    task_id: int
    lease_token: UUID
    execution_id: UUID
    step: str
    map_index: int
    attempt: int
    outcome: str  # a terminal outcome, "retry", or "released"
    payload_json: str | None = None  # canonical JSON of the output (succeeded/degraded)
    payload: Any = None
    error: str | None = None
    retry_delay: float = 0.0
    age_seconds: float = 0.0  # how long ago the handler ended, so timings use the DB clock
    attempt_outcome: str | None = None  # how the attempt itself ended, when not `outcome` ("lost")
    routes: tuple[str, ...] | None = None  # downstream steps the handler chose (Route)
    source: str = "handler"  # where the payload came from: the handler or the fallback


async def record(db: Database, registry: Registry, c: Completion) -> tuple[Recorded, Advanced | None]:
    """Record one attempt's end. Returns what happened and, when the DAG advanced, how."""
    if c.outcome == "retry":
        # A retry decides nothing about the DAG, so it takes no execution lock: the lease fence
        # alone keeps a stale worker from resurrecting a task someone else already ended.
        async with db.transaction() as tx:
            row = await tx.one(
                "task_retry_if_leased",
                id=c.task_id,
                lease_token=c.lease_token,
                delay_seconds=c.retry_delay,
                error=c.error,
            )
            if row is None:
                return Recorded.LEASE_LOST, None
            await tx.run(
                "attempt_finish_if_open",
                lease_token=c.lease_token,
                outcome=c.attempt_outcome or "retry",
                error=c.error,
                age_seconds=c.age_seconds,
            )
            await tx.one("task_notify_ready", queue=row["queue"])
            return Recorded.RETRYING, None

    if c.outcome == "released":
        async with db.transaction() as tx:
            row = await tx.one("task_release_if_leased", id=c.task_id, lease_token=c.lease_token)
            if row is None:
                return Recorded.LEASE_LOST, None
            await tx.run(
                "attempt_finish_if_open",
                lease_token=c.lease_token,
                outcome="released",
                error=c.error,
                age_seconds=0.0,
            )
            await tx.one("task_notify_ready", queue=row["queue"])
            return Recorded.RELEASED, None

    async with db.transaction() as tx:
        # Acquire the execution row lock before anything else, to serialize fan-in decisions.
        # Without it, concurrent completions of sibling branches each read join state that
        # misses the others' uncommitted writes (READ COMMITTED), so none of them fires the
        # join and the execution stalls with every task green (seed 000).
        execution = await tx.one("execution_lock", id=c.execution_id)
        if execution is None:
            return Recorded.LEASE_LOST, None
        output_hash = content_hash(c.payload_json) if c.payload_json is not None else None
        task = await tx.one(
            "task_complete_if_leased",
            id=c.task_id,
            lease_token=c.lease_token,
            outcome=c.outcome,
            output_hash=output_hash,
            error=c.error,
            routes=list(c.routes) if c.routes is not None else None,
            age_seconds=c.age_seconds,
        )
        if task is None:
            return Recorded.LEASE_LOST, None
        if output_hash is not None:
            await tx.run(
                "output_insert_if_absent",
                execution_id=c.execution_id,
                step=c.step,
                map_index=c.map_index,
                content_hash=output_hash,
                payload=Jsonb(c.payload),
                source=c.source,
            )
        await tx.run(
            "attempt_finish_if_open",
            lease_token=c.lease_token,
            outcome=c.attempt_outcome or c.outcome,
            error=c.error,
            age_seconds=c.age_seconds,
        )
        if execution["status"] != "running":
            return Recorded.ENDED, None
        spec = registry.get(execution["workflow_name"], execution["workflow_version"])
        advanced = await record_event(
            tx,
            spec,
            execution,
            TaskEnded(c.step, c.outcome, frozenset(c.routes) if c.routes is not None else None),
            task["finished_at"],
        )
        return Recorded.ENDED, advanced


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
