"""The stall watchdog: running executions in which nothing can run (never silent).

Every worker's maintenance pass calls :meth:`Watchdog.run`. One pass:

1. reads a bounded window of running executions after its cursor (``stalls.sql`` says why that
   read stays cheap on a big database) and keeps those in which no task is ready, running or
   waiting and no step moved for longer than the grace (60 s by default, ``stall_grace``);
2. decides each of them in a transaction of its own that first takes the execution row lock
   (``execution_lock``, ``FOR NO KEY UPDATE``: the lock every completion's fan-in decision
   takes) and then re-checks, in that transaction, that the execution is still running and
   still stalled. A completion that committed in between is seen (a new statement after the
   lock, under READ COMMITTED), one that comes later waits for us: the watchdog never races
   the normal fan-in, and two watchdogs deciding the same execution do it one after the other;
3. re-runs the fan-in decision: the task ends its counters never counted are replayed through
   the ordinary advancer (:func:`konduit.core.stall.diagnose`), which fires a join exactly once;
4. records the stall as an ``execution_stalled`` alert naming the execution, in the same
   transaction: resolved at once when the decision healed it, open (critical) when the data
   cannot decide; and counts it (``konduit_stalls_total``);
5. resolves the open stall alerts whose execution has since ended or can run again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.advance import Event
from konduit.core.alerts import execution_stalled
from konduit.core.model import ExecutionStatus
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.stall import Diagnosis, EndedTasks, diagnose
from konduit.db.database import Database, Row, Tx
from konduit.engine import step_rows
from konduit.engine.advancer import Advanced, Advancer
from konduit.engine.alerting import AlertChange, AlertHook, alert_changed
from konduit.engine.registry import Registry
from konduit.errors import DatabaseError, KonduitError
from konduit.records import AlertRecord

log = logging.getLogger(__name__)

DEFAULT_GRACE = 60.0
"""Seconds an execution must have been stalled before the watchdog decides it."""
WINDOW = 500
"""Running executions one pass looks at (the next pass goes on after the last of them)."""
PER_PASS = 20
"""Stalled executions one pass decides (each in a transaction of its own)."""


@dataclass(frozen=True)
class Stall:
    """A stall the watchdog decided."""

    execution_id: UUID
    workflow: str
    healed: bool
    alert: AlertRecord | None  # None when another worker recorded this stall first
    diagnosis: Diagnosis
    advanced: Advanced | None = None


@dataclass
class Pass:
    """What one pass did."""

    scanned: int = 0
    stalls: list[Stall] = field(default_factory=list)
    resolved: list[AlertRecord] = field(default_factory=list)


class Watchdog:
    """Finds and decides the stalled executions of the workflows in ``registry``."""

    def __init__(self, db: Database, registry: Registry, *, grace: float = DEFAULT_GRACE,
                 window: int = WINDOW, per_pass: int = PER_PASS, hook: AlertHook = alert_changed,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES):
        if grace <= 0:
            raise KonduitError(f"stall_grace must be > 0, got {grace}")
        self.db = db
        self.registry = registry
        self.grace = grace
        self.window = window
        self.per_pass = per_pass
        self.hook = hook
        self.max_payload_bytes = max_payload_bytes
        self.after: UUID | None = None  # the cursor: the last running execution looked at

    async def run(self) -> Pass:
        """One pass: decide the stalls found in the next window, resolve those that moved."""
        done = Pass()
        rows = await self.db.all("execution_list_stalled_after_cursor", after=self.after,
                                 window=self.window, limit=self.per_pass,
                                 grace_seconds=self.grace)
        head = rows[0]
        done.scanned = int(head["scanned"])
        found = [r["id"] for r in rows if r["id"] is not None]
        if len(found) >= self.per_pass:
            self.after = found[-1]  # more may stall in this window: go on after the last found
        elif done.scanned >= self.window:
            self.after = head["last_id"]
        else:
            self.after = None  # the window reached the newest running execution: start over
        for row in rows:
            if row["id"] is None or not self._known(row):
                continue  # another deployment's workflow: its own workers judge it
            try:
                stall = await self.decide(row["id"])
            except DatabaseError:
                raise  # the pass stops; the worker's connectivity handling sees it
            except Exception:  # one execution the watchdog cannot read must not stop the others
                log.exception("deciding the stall of execution %s failed", row["id"])
                continue
            if stall is not None:
                done.stalls.append(stall)
        done.resolved = await self.resolve_moved()
        return done

    def _known(self, row: Row) -> bool:
        try:
            self.registry.get(row["workflow_name"], row["workflow_version"])
        except KonduitError:
            return False
        return True

    async def decide(self, execution_id: UUID) -> Stall | None:
        """Under the execution lock: re-check the stall, re-run the fan-in decision, record the
        alert. None when the execution is no longer stalled (or no longer running)."""
        stall = await self.db.atomic(lambda tx: self._decide(tx, execution_id))
        if stall is not None:
            if stall.healed:
                log.warning("execution %s (%s) was stalled; the fan-in decision healed it: %s",
                            execution_id, stall.workflow, "; ".join(stall.diagnosis.replayed))
            elif stall.alert is not None:
                log.error("execution %s (%s) is stalled: %s", execution_id, stall.workflow,
                          stall.alert.message)
        return stall

    async def _decide(self, tx: Tx, execution_id: UUID) -> Stall | None:
        execution = await tx.one("execution_lock", id=execution_id)
        if execution is None or execution["status"] != ExecutionStatus.RUNNING:
            return None
        before = await tx.one("execution_get_stall", id=execution_id)
        assert before is not None
        moved_at = before["moved_at"] or before["created_at"]
        quiet = (before["now"] - moved_at).total_seconds()
        if before["live"] or quiet < self.grace:
            return None  # a decision committed between our look and the lock: not stalled
        spec = self.registry.get(execution["workflow_name"], execution["workflow_version"])
        states = {row["step"]: step_rows.state_of(row) for row in await step_rows.read(
            tx, [(execution_id, step) for step in spec.order])}
        tally = [EndedTasks(r["step"], r["status"], int(r["tasks"]),
                            None if r["routes"] is None else tuple(r["routes"]), r["finished_at"])
                 for r in await tx.all("task_count_latest_by_step_and_status",
                                       execution_id=execution_id,
                                       generation=execution["generation"])]
        diagnosis = diagnose(spec, states, tally)
        advanced = None
        healed = False
        if diagnosis.replay:
            replay: list[tuple[Event, datetime | None]] = list(diagnosis.replay)
            advanced = await Advancer.for_locked(
                tx, spec, execution, max_payload_bytes=self.max_payload_bytes,
            ).run_events(replay)
            after = await tx.one("execution_get_stall", id=execution_id)
            assert after is not None
            healed = after["status"] != ExecutionStatus.RUNNING or bool(after["live"])
        finding = execution_stalled(
            str(execution_id), spec.name, quiet_seconds=quiet, replayed=diagnosis.replayed,
            reasons=diagnosis.reasons, healed=healed,
            fired=advanced.fired if advanced is not None else ())
        alert = await self._record(tx, finding.subject, finding.workflow, finding.severity,
                                   finding.message, dict(finding.details), healed)
        return Stall(execution_id, spec.name, healed, alert, diagnosis, advanced)

    async def _record(self, tx: Tx, subject: str, workflow: str, severity: str, message: str,
                      details: dict[str, Any], healed: bool) -> AlertRecord | None:
        row = await tx.one("alert_raise_stall_unless_open", subject=subject, workflow=workflow,
                           severity=severity, message=message, details=Jsonb(details))
        raised = None if row is None else AlertRecord.from_row(row)
        if raised is not None:
            await tx.run("execution_stall_count_increment", workflow=workflow, healed=healed)
            await self.hook(tx, AlertChange("raised", raised))
        if not healed:
            return raised
        resolution = {"resolution": "the re-run fan-in decision healed it"}
        row = await tx.one("alert_resolve_stall_if_open", subject=subject,
                           resolution=Jsonb(resolution))
        if row is None:
            return raised
        resolved = AlertRecord.from_row(row)
        await self.hook(tx, AlertChange("resolved", resolved))
        return resolved

    async def resolve_moved(self, *, limit: int = 1000) -> list[AlertRecord]:
        """Resolve the open stall alerts whose execution ended, is gone, or can run again (an
        operator cancelled it, repaired it, or fixed its rows): one statement that re-checks it
        all, and the hook for each, in one transaction."""
        async with self.db.transaction() as tx:
            rows = await tx.all("alert_resolve_stalls_if_execution_moved", limit=limit)
            resolved = [AlertRecord.from_row(r) for r in rows]
            for record in resolved:
                await self.hook(tx, AlertChange("resolved", record))
        return resolved


async def open_stall(db: Database, execution_id: UUID) -> AlertRecord | None:
    """The open ``execution_stalled`` alert of an execution, if any."""
    row = await db.one("alert_get_open_stall_for_execution", subject=str(execution_id))
    return None if row is None else AlertRecord.from_row(row)
