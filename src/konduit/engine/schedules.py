"""Schedules in the database: store the definitions from code, start each due tick's execution,
pause and resume, and list them.

Every worker whose App defines schedules runs :meth:`Schedules.run` beside its claim loop; there
is no leader. Each tick's execution carries the idempotency key ``schedule:<name>:<tick>`` and
is created by the same statement as any start (:func:`konduit.engine.starts.insert_executions`),
so the unique index on (workflow, key) lets exactly one execution per tick exist, whichever
workers try and whenever. On top of that, a worker starts a schedule's ticks holding that
schedule's row (``FOR UPDATE SKIP LOCKED``): the others skip it instead of repeating the same
inserts, a pause waits for a round in flight and then holds, and the missed policy is decided
once per tick against one consistent state. (Lock order: the schedule row, then the rows of
the executions its ticks create; nothing that locks executions ever locks a schedule.) Which
ticks are due is the pure
:func:`konduit.core.schedules.plan_ticks`; this module loads its inputs and applies its answer.
"""

from __future__ import annotations

import builtins
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from konduit.aio import cancelling
from konduit.core import clock
from konduit.core.payloads import DEFAULT_MAX_BYTES, canonical_json
from konduit.core.requests import StartRequest
from konduit.core.schedules import LATE_AFTER, MAX_CATCH_UP, Timing, plan_ticks, tick_key
from konduit.core.search import MAX_TAG_VALUE
from konduit.core.values import check_text
from konduit.db.database import Database, Row, Tx
from konduit.engine.registry import Registry
from konduit.engine.starts import Prepared, insert_executions, prepare_off_loop
from konduit.errors import DatabaseError, IdempotencyConflict, KonduitError, ScheduleNotFound

log = logging.getLogger(__name__)

MAX_WAIT = 5.0
"""Longest a worker sleeps between two looks at its schedules, however far the next tick is: a
resume, a pause or a changed definition is seen within this long."""
WAKE_MARGIN = 0.02
"""Seconds a worker wakes after a tick, so that the database's clock has passed it too."""


def timing_of(row: Row) -> Timing:
    """A stored schedule's timing."""
    return Timing(cron=row["cron"], every=row["every_seconds"], timezone=row["timezone"])


@dataclass(frozen=True)
class Started:
    """One tick a round started (``execution_id`` is the tick's execution, new or not)."""

    schedule: str
    tick: datetime
    execution_id: UUID


class Schedules:
    """The schedules of one App's registry, in one database."""

    def __init__(
        self,
        db: Database,
        registry: Registry,
        *,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        late_after: float = LATE_AFTER,
        max_catch_up: int = MAX_CATCH_UP,
    ):
        self.db = db
        self.registry = registry
        self.max_payload_bytes = max_payload_bytes
        self.late_after = late_after
        self.max_catch_up = max_catch_up

    @property
    def names(self) -> builtins.list[str]:
        return sorted(self.registry.schedules)

    async def sync(self, *, now: datetime | None = None) -> None:
        """Store the definitions from code (a worker does it as it starts). ``now`` (default:
        the database's clock) is where a new schedule starts counting."""
        schedules = [self.registry.schedules[n] for n in self.names]
        if not schedules:
            return
        await self.db.run(
            "schedule_upsert_many_from_code",
            now=now,
            names=[s.name for s in schedules],
            workflow_names=[s.workflow for s in schedules],
            workflow_versions=[s.version for s in schedules],
            crons=[s.timing.cron for s in schedules],
            every_seconds=[s.timing.every for s in schedules],
            timezones=[s.timing.timezone for s in schedules],
            inputs=[canonical_json(s.input, what=f"input of schedule {s.name!r}")
                    for s in schedules],
            window_seconds=[s.window for s in schedules],
            misseds=[s.missed for s in schedules],
            definition_hashes=[s.definition_hash for s in schedules],
        )
        log.info("schedules: %s", ", ".join(f"{s.name} ({s.timing.describe()})" for s in schedules))

    async def run_due(self, *, now: datetime | None = None) -> tuple[builtins.list[Started], float]:
        """One round: start the due ticks of every schedule this App defines that no other
        worker is starting right now. Returns what it started and how many seconds until the
        next tick of any of them (at most :data:`MAX_WAIT`). ``now`` replaces the database's
        clock (tests drive rounds with explicit times)."""
        names = self.names
        if not names:
            return [], MAX_WAIT
        rows = await self.db.all("schedule_list_by_names", names=names, now=now)
        started: builtins.list[Started] = []
        wake = MAX_WAIT
        for row in rows:
            if row["paused"]:
                continue
            timing = timing_of(row)
            upcoming = timing.next_after(row["last_tick"])
            if upcoming is not None and upcoming <= row["now"]:
                try:
                    started += await self.db.atomic(
                        functools.partial(self._start_due, name=row["name"], now=now))
                except (DatabaseError, KonduitError) as exc:
                    if cancelling():
                        raise  # the stop, not a schedule that failed to start
                    log.warning("schedule %r: could not start its due ticks (%s); the next "
                                "round tries again", row["name"], exc)
                # Handled now (here or by the worker that held it): next is what follows now.
                upcoming = timing.next_after(row["now"])
            if upcoming is not None:
                wake = min(wake, (upcoming - row["now"]).total_seconds() + WAKE_MARGIN)
        return started, max(wake, WAKE_MARGIN)

    async def _start_due(self, tx: Tx, name: str, now: datetime | None) -> builtins.list[Started]:
        row = await tx.one("schedule_lock_if_active", name=name, now=now)
        if row is None:
            return []  # paused meanwhile, or another worker is starting these very ticks
        try:
            self.registry.get(row["workflow_name"], row["workflow_version"])
        except KonduitError:
            # Stored by a worker running another version of the code (a rolling deploy): the
            # workers that know that workflow version start its ticks.
            log.debug("schedule %r: workflow %s version %s is not served here", name,
                      row["workflow_name"], row["workflow_version"])
            return []
        plan = plan_ticks(timing_of(row), row["missed"], row["last_tick"], row["now"],
                          late_after=self.late_after, max_catch_up=self.max_catch_up)
        if plan.advance_to is None:
            return []
        if plan.passed_over:
            log.warning(
                "schedule %r missed ticks between %s and %s (no worker ran, or it was paused): "
                "missed=%r passes over some of them; %d tick(s) start now", name,
                row["last_tick"].isoformat(), plan.advance_to.isoformat(), row["missed"],
                len(plan.start))
        started = await self._insert(tx, row, plan.start) if plan.start else []
        advanced = await tx.one(
            "schedule_advance_if_behind", name=name, tick=plan.advance_to,
            execution_id=started[-1].execution_id if started else None)
        if advanced is None:
            # The lock makes this impossible; should it happen, roll the round back.
            raise KonduitError(f"schedule {name!r} moved on while locked")
        for s in started:
            log.info("schedule %r: tick %s started execution %s", name, s.tick.isoformat(),
                     s.execution_id)
        return started

    async def _insert(self, tx: Tx, row: Row, ticks: tuple[datetime, ...]) -> builtins.list[Started]:
        """Start one execution per tick (one that exists already, by its key, is not started
        again), marked with its tick."""
        name = row["name"]
        window = row["window_seconds"]
        # The workflow's input checks and key functions are user code: off this loop, which
        # is the worker's (prepare_off_loop).
        batch = [
            await prepare_off_loop(self.registry, StartRequest(
                row["workflow_name"], row["input"], idempotency_key=tick_key(name, tick),
                version=row["workflow_version"],
                deadline_at=None if window is None else tick + timedelta(seconds=window),
                # Found by its schedule: konduit list --tag schedule=<name>.
                tags={"schedule": name} if len(name) <= MAX_TAG_VALUE else None,
            ), max_bytes=self.max_payload_bytes)
            for tick in ticks
        ]
        made: builtins.list[tuple[datetime, UUID]] = []
        try:
            made = list(zip(ticks, await insert_executions(tx, batch), strict=True))
        except IdempotencyConflict:
            # Some tick's key already started an execution with another input (started by
            # hand, or before the input changed): that tick has its execution; start the rest.
            for tick, prepared in zip(ticks, batch, strict=True):
                made += await self._insert_one(tx, name, tick, prepared)
        await tx.run(
            "execution_set_scheduled_at_if_keyed",
            ids=[eid for _, eid in made],
            keys=[tick_key(name, tick) for tick, _ in made],
            ticks=[tick for tick, _ in made],
        )
        return [Started(name, tick, eid) for tick, eid in made]

    async def _insert_one(self, tx: Tx, name: str, tick: datetime,
                          prepared: Prepared) -> builtins.list[tuple[datetime, UUID]]:
        try:
            [eid] = await insert_executions(tx, [prepared])
        except IdempotencyConflict as exc:
            log.warning("schedule %r: tick %s already has an execution (%s)", name,
                        tick.isoformat(), exc)
            return []
        return [(tick, eid)]

    async def run(self, *, passed: Callable[[], None] = lambda: None) -> None:
        """Start due ticks until cancelled, waking at each next tick (and at least every
        :data:`MAX_WAIT` seconds). A worker runs it beside its claim loop: its maintenance
        sweeps every couple of seconds, too coarse for an ``every="1s"`` schedule. ``passed``
        is called after each round that ran to its end."""
        if not self.names:
            return
        while True:
            try:
                _, wait = await self.run_due()
                passed()
            except (DatabaseError, KonduitError) as exc:
                if cancelling():
                    raise  # the stop, not a failed round
                log.warning("schedules round failed: %s", exc)
                wait = 1.0
            await clock.sleep(wait)

    # -- looking and steering -----------------------------------------------------------------

    async def list(self) -> builtins.list[dict[str, Any]]:
        """Every stored schedule (see :func:`list_schedules`)."""
        return await list_schedules(self.db, late_after=self.late_after)

    async def set_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume ``name``; returns whether that changed anything. Unknown names raise
        :class:`~konduit.ScheduleNotFound`."""
        check_text(name, "name")
        row = await self.db.one("schedule_set_paused", name=name, paused=paused)
        if row is None:
            known = ", ".join(r["name"] for r in await self.db.all("schedule_list")) or "none"
            raise ScheduleNotFound(
                f"no schedule named {name!r} (known: {known}); a schedule is stored when a "
                f"worker of the App that defines it starts")
        return bool(row["was_paused"]) != paused


async def list_schedules(db: Database, *, late_after: float = LATE_AFTER) -> list[dict[str, Any]]:
    """Every stored schedule: name, workflow and version, timing, ``paused``, ``last_tick``
    (every tick up to it is handled), ``next_tick`` (the next one from now; None while paused), ``behind``
    (ticks are due that no worker has started for longer than they may be late: is a
    worker running?), and the execution of the latest tick started with its status
    (``last_execution_id``, ``last_status``, ``last_scheduled_at``, ``last_started_at``;
    None once it was pruned)."""
    rows = await db.all("schedule_list")
    out = []
    for row in rows:
        timing = timing_of(row)
        now = row.pop("now")
        upcoming = timing.next_after(row["last_tick"])
        out.append({
            **row,
            "schedule": timing.describe(),
            "next_tick": None if row["paused"]
            else timing.next_after(max(row["last_tick"], now)),
            "behind": not row["paused"] and upcoming is not None
            and (now - upcoming).total_seconds() > late_after,
        })
    return out
