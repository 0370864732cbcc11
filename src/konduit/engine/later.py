"""Start later: executions started with ``run_at=`` or ``delay=`` wait as ``scheduled`` until
their time; every worker's maintenance pass starts the ones due (so within a maintenance
interval of their time). Their root tasks were made at start, ready from that moment; the claim
takes only tasks of running executions, so flipping the status is the whole start.

A scheduled execution is visible (status ``scheduled``, with its ``run_at``), can be waited for,
and can be cancelled before its time: the cancel commits first or the start does, both under
the execution row's lock, each re-checking the status in its own statement.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from konduit.core.durations import Duration, parse_duration
from konduit.db.database import Database
from konduit.errors import KonduitError, blame, blamed

MAX_PRIORITY = 1_000_000
"""The bound of ``priority=``: it is added to each step's priority in a 32-bit column."""


def check_moment(at: datetime, field: str) -> None:
    """A moment PostgreSQL stores and every face reads back: before the year 10000 in UTC
    (``9999-12-31T23:00-05:00`` is not)."""
    try:
        at.astimezone(UTC)
    except OverflowError:
        raise blamed(KonduitError(f"{field} {at.isoformat()}: past the year 9999 in UTC"),
                     field) from None


def start_time(run_at: datetime | None, delay: Duration | None) -> tuple[datetime | None,
                                                                     float | None]:
    """``run_at`` and ``delay`` of a start, checked: at most one, an aware datetime or a
    duration of zero or more. (The delay is counted from the database's clock, at insert.)"""
    if run_at is not None and delay is not None:
        raise blamed(KonduitError("give run_at or delay, not both"), "delay")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise blamed(KonduitError(f"run_at is a datetime, not {type(run_at).__name__}"),
                         "run_at")
        if run_at.tzinfo is None:
            raise blamed(KonduitError(f"run_at {run_at}: give a time zone (an aware datetime)"),
                         "run_at")
        check_moment(run_at, "run_at")
        return run_at, None
    if delay is None:
        return None, None
    with blame("delay"):
        seconds = parse_duration(delay, what="delay")
    if seconds < 0:
        raise blamed(KonduitError(f"delay {delay!r}: not negative"), "delay")
    return None, seconds


def check_priority(priority: Any) -> int:
    """An execution's priority: a whole number; lower is claimed first, as a step's."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise blamed(KonduitError(f"priority is a whole number, not {type(priority).__name__}"),
                     "priority")
    if abs(priority) > MAX_PRIORITY:
        raise blamed(KonduitError(f"priority {priority}: between -{MAX_PRIORITY} and "
                                  f"{MAX_PRIORITY}"), "priority")
    return priority


async def start_due(db: Database, *, limit: int = 500) -> list[UUID]:
    """Start the scheduled executions whose time came (up to ``limit``, oldest first); returns
    their ids."""
    row = await db.one("execution_start_many_if_due", limit=limit)
    return [] if row is None else [UUID(str(i)) for i in row["started"]]
