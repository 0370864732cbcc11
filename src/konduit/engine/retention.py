"""Retention: delete finished executions, and every row hanging off them, in small batches.

``konduit prune --older-than 30d``, :meth:`konduit.App.prune` and ``App(retention="30d")`` (which
every worker's maintenance loop applies every few minutes) all come here.

What goes: executions that *finished* (succeeded, failed, timed out or were cancelled) before the
cutoff, measured on ``finished_at``, with their steps, tasks, attempts, payloads and output
versions (``ON DELETE CASCADE`` from the execution row). What stays: pending and running
executions, whatever their age (a repair reopens an execution: it is running again and stays),
and executions that hold a **dead letter** — a task that failed for good and that no repair has
re-run since (the dashboard's definition, one SQL fragment: ``task_dead_letter``) — unless
``include_dead_letters`` is set. Once a repair re-ran the failed step (a newer generation of it
started), the old failed task no longer holds its execution; a repair created but cancelled
before it started re-ran nothing.

Each batch is one statement in its own short transaction: it locks at most ``batch_size``
execution rows with SKIP LOCKED (so two prunes, or a prune and a repair, never wait for each
other) and re-checks in the DELETE itself that each row is still finished and old enough.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from konduit.core.durations import Duration, parse_duration
from konduit.core.values import MAX_INT
from konduit.db.database import Database
from konduit.engine import webhooks
from konduit.errors import KonduitError, blamed

log = logging.getLogger(__name__)

BATCH_SIZE = 500
"""Executions deleted per transaction: enough to be quick, few enough that no lock is held long."""

RETENTION_INTERVAL = 300.0
"""Seconds between the retention rounds of a worker (``App(retention=...)``)."""

ROUND_BATCHES = 20
"""Most batches one worker round deletes: a round runs on the maintenance loop, whose rescues and
deadline sweeps must not wait behind a year of backlog (the next round, or ``konduit prune``,
goes on where it stopped)."""


def retention_seconds(value: Duration, *, what: str = "retention") -> float:
    """A retention period in seconds; zero or a negative/unreadable value is refused with an
    error naming ``what``."""
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise KonduitError(f"{what}: must be longer than zero, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Prunable:
    """Executions finished before a cutoff: how many, and how many of them a dead letter holds."""

    finished: int
    dead_letters: int

    def deletable(self, include_dead_letters: bool) -> int:
        return self.finished if include_dead_letters else self.finished - self.dead_letters


async def remove_stored(db: Database, ids: list[UUID]) -> None:
    """Remove the payloads the store keeps for these executions (deleted just now); a store
    that fails is logged and retried by nothing (its objects outlive their rows)."""
    store = db.io.store

    def remove() -> int:
        return sum(store.delete_prefix(str(eid)) for eid in ids)

    try:
        removed = await asyncio.to_thread(remove)
    except KonduitError as exc:
        log.warning("pruned executions' payloads not removed from the payload store: %s", exc)
        return
    if removed:
        log.info("removed %d stored payload(s) of %d pruned execution(s)", removed, len(ids))


async def prune(
    db: Database,
    older_than: Duration,
    *,
    include_dead_letters: bool = False,
    batch_size: int = BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """Delete executions that finished more than ``older_than`` ago (``"30d"``, or seconds) and
    all their rows, ``batch_size`` executions per transaction (at most ``max_batches`` of them);
    returns how many were deleted.
    Workers not heard from for that long (and at least an hour) are forgotten too, alerts
    resolved that long ago (open alerts are never deleted), webhook deliveries created that
    long ago that ended (pending ones are never deleted), stored events past their own
    retention, events sent that long ago, whether a task took them or not (see
    docs/durable-waits.md), and fair keys with nothing ahead of their queue's turn
    (docs/fairness.md)."""
    seconds = parse_duration(older_than, what="older_than")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) \
            or not 1 <= batch_size <= MAX_INT:
        raise blamed(KonduitError(f"batch_size: must be a whole number from 1 to {MAX_INT}, "
                                  f"got {batch_size!r:.40}"), "batch_size")
    began = time.monotonic()
    # The history (migration 0041) first: a day that ended before the cutoff goes whole, its
    # partitions dropped (no row deleted, nothing left for vacuum). A day the cutoff falls in
    # stays until it ended, up to a day longer than ``older_than`` (docs/retention.md).
    from konduit.engine import history  # it builds on this module's rounds

    deleted = await history.drop_days(db, seconds)
    batches = 0
    after_at: datetime | None = None
    after_id: UUID | None = None
    while True:
        rows = await db.all(
            "execution_delete_finished_batch_if_still_finished",
            older_than_seconds=seconds, include_dead_letters=include_dead_letters,
            after_finished_at=after_at, after_id=after_id, batch_size=batch_size,
        )
        batches += 1
        deleted += len(rows)
        if rows and db.io.store is not None:
            await remove_stored(db, [r["id"] for r in rows])
        if len(rows) < batch_size:
            break  # the rest is gone, held by a dead letter, or being deleted by another prune
        if max_batches is not None and batches >= max_batches:
            break
        # Resume after the last row deleted: executions a dead letter keeps are not re-read by
        # every batch. (A row another prune had locked is that prune's to delete.)
        after_at, after_id = max((r["finished_at"], r["id"]) for r in rows)
    await db.run("worker_delete_silent_before", older_than_seconds=seconds)
    # Alerts resolved that long ago go too (open ones never): they describe executions and
    # workflows whose rows are being pruned.
    while await db.run("alert_delete_resolved_before", older_than_seconds=seconds,
                       limit=batch_size) == batch_size:
        pass
    # Webhook deliveries that ended (delivered, failed, refused) that long ago; pending ones
    # are still owed to their receiver.
    await webhooks.prune(db, seconds, batch_size=batch_size)
    # Stored events past their own retention (the workers' waits pass deletes them too), then
    # events sent that long ago, taken or not (one whose task has yet to be woken with it stays).
    while await db.run("event_delete_expired", limit=batch_size) == batch_size:
        pass
    while await db.run("event_delete_before", older_than_seconds=seconds,
                       limit=batch_size) == batch_size:
        pass
    # Fair keys (docs/fairness.md) whose next turn the queue's clock passed: whatever their
    # age, such a row means what no row means.
    while await db.run("fair_key_delete_stale", limit=batch_size) == batch_size:
        pass
    if deleted:
        log.info("pruned %s execution(s) finished more than %s ago in %s batch(es), %.1f s",
                 deleted, older_than, batches, time.monotonic() - began)
    return deleted


async def count_prunable(db: Database, older_than: Duration) -> Prunable:
    """What :func:`prune` with the same ``older_than`` would consider, without deleting."""
    seconds = parse_duration(older_than, what="older_than")
    row = await db.one("execution_count_prunable", older_than_seconds=seconds)
    assert row is not None
    return Prunable(int(row["finished"]), int(row["dead_letters"]))


class Rounds:
    """Rounds of a housekeeping pass: at most one per ``interval`` seconds, the first at once
    (the pass's cadence is longer than the maintenance interval that calls it)."""

    def __init__(self, interval: float):
        self.interval = interval
        self._next_at = 0.0

    def due(self) -> bool:
        """Whether a round is due now; if so, the next one is ``interval`` from now."""
        now = time.monotonic()
        if now < self._next_at:
            return False
        self._next_at = now + self.interval
        return True


class Retention(Rounds):
    """A worker's retention rounds: at most one per ``interval`` seconds, the first at once."""

    def __init__(self, db: Database, retention: float, *, interval: float = RETENTION_INTERVAL):
        super().__init__(interval)
        self.db = db
        self.retention = retention

    async def run_if_due(self) -> int | None:
        """Prune if a round is due; returns how many executions it deleted (None: not due)."""
        if not self.due():
            return None
        return await prune(self.db, self.retention, max_batches=ROUND_BATCHES)
