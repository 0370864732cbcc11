"""History off the hot path (migration 0041, docs/retention.md "History"): finished executions
move out of the tables the workers write into tables partitioned by the UTC day they finished,
and retention drops a day's partitions instead of deleting its rows.

``App(history_after="1d")`` makes the deployment's leader move, every few minutes, the
executions that finished more than that long ago (:class:`HistoryMover`);
:func:`move_finished` is one such pass, :func:`drop_days` the partitions' side of
:func:`konduit.engine.retention.prune`. What moves: what retention would prune (finished, no dead
letter), with every row hanging off it. A moved execution reads the same through every door
(the reads of one execution go through the ``konduit_<table>_all`` views); the claim, the round,
the dashboard's recent lists and every write touch the hot tables only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

from konduit.core.durations import Duration, parse_duration
from konduit.core.values import MAX_INT
from konduit.db.database import Database
from konduit.engine.retention import Rounds, remove_stored
from konduit.errors import ExecutionInHistory, KonduitError, blamed

log = logging.getLogger(__name__)

BATCH_SIZE = 500
"""Executions moved per transaction: each move copies and deletes every row of its executions
(some 60 rows for an execution of 20 branches), so a batch stays well under a second."""

HISTORY_INTERVAL = 60.0
"""Seconds between two moves of the leader (``App(history_after=...)``)."""

ROUND_BATCHES = 20
"""Most batches one pass moves: the pass runs on the maintenance loop, whose rescues and
deadline sweeps must not wait behind a year of backlog (the next pass goes on)."""


def history_seconds(value: Duration, *, what: str = "history_after") -> float:
    """``history_after`` in seconds; zero, negative or unreadable is refused, naming ``what``."""
    seconds = parse_duration(value, what=what)
    if seconds <= 0:
        raise KonduitError(f"{what}: must be longer than zero, got {value!r}")
    return seconds


def _check_batch(batch_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) \
            or not 1 <= batch_size <= MAX_INT:
        raise blamed(KonduitError(f"batch_size: must be a whole number from 1 to {MAX_INT}, "
                                  f"got {batch_size!r:.40}"), "batch_size")


async def move_finished(db: Database, older_than: Duration, *, batch_size: int = BATCH_SIZE,
                        max_batches: int | None = None) -> int:
    """Move executions that finished more than ``older_than`` ago into the history,
    ``batch_size`` per transaction (at most ``max_batches`` batches); returns how many moved."""
    seconds = parse_duration(older_than, what="older_than")
    _check_batch(batch_size)
    began = time.monotonic()
    moved = batches = 0
    after_at: datetime | None = None
    after_id: UUID | None = None
    while True:
        rows = await db.all(
            "execution_move_to_history_if_still_finished", older_than_seconds=seconds,
            after_finished_at=after_at, after_id=after_id, batch_size=batch_size)
        batches += 1
        moved += len(rows)
        if not rows:
            break  # nothing left (or every row of the batch is held: the next pass takes it)
        if max_batches is not None and batches >= max_batches:
            break
        after_at, after_id = max((r["finished_at"], r["id"]) for r in rows)
    if moved:
        log.info("moved %s finished execution(s) into the history in %s batch(es), %.1f s",
                 moved, batches, time.monotonic() - began)
    return moved


async def drop_days(db: Database, older_than_seconds: float) -> int:
    """Drop every day of history that ended more than ``older_than_seconds`` ago (its
    partitions, every table's); returns how many executions they held."""
    dropped = 0
    for row in await db.all("history_day_list_ended_before",
                            older_than_seconds=older_than_seconds):
        day: date = row["day"]
        if db.io.store is not None:
            ids = [r["id"] for r in await db.all("history_execution_list_ids_of_day", day=day)]
            if ids:
                await remove_stored(db, ids)
        held = await db.one("history_day_drop", day=day)
        assert held is not None
        dropped += int(held["executions"])
        log.info("dropped the history of %s (%s execution(s))", day, held["executions"])
    return dropped


async def refuse_if_moved(db: Database, execution_id: UUID, action: str) -> None:
    """Raise :class:`ExecutionInHistory` when ``execution_id`` was moved into the history: a
    write that found nothing to act on in the hot tables says why (``action``: what it was,
    ``"cancel"``, ``"repair"``...), rather than "not found" or nothing at all."""
    row = await db.one("execution_get_in_history", id=execution_id)
    if row is not None:
        raise in_history(row, action)


def in_history(row: Mapping[str, Any], action: str) -> ExecutionInHistory:
    """The error of a write (``action``) to the moved execution of ``row``
    (``execution_get_in_history``)."""
    finished: datetime = row["finished_at"]
    moved: datetime | None = row["moved_at"]
    when = (f"on {_day(moved)}" if moved is not None
            else "after it finished")
    return ExecutionInHistory(
        f"cannot {action} execution {row['id']}: it finished {row['status']} on "
        f"{_day(finished)} and was moved into the history {when} (history_after=); it reads "
        "as before, but nothing acts on it any more", execution_id=row["id"],
        status=row["status"], finished_at=finished, moved_at=moved)


def _day(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class HistoryMover(Rounds):
    """The leader's moves into the history: at most one per ``interval`` seconds."""

    def __init__(self, db: Database, after: float, *, interval: float = HISTORY_INTERVAL):
        super().__init__(interval)
        self.db = db
        self.after = after

    async def run_if_due(self) -> int | None:
        """Move if a pass is due; returns how many executions moved (None: not due)."""
        if not self.due():
            return None
        return await move_finished(self.db, self.after, max_batches=ROUND_BATCHES)
