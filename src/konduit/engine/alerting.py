"""Alerting: evaluate the alert rules and keep ``konduit_alerts`` in step with them.

Every worker runs :meth:`Alerting.run` beside its maintenance loop (a loop of its own, so that slow
history reads never delay lease rescue or the deadline sweep). One round (:meth:`Alerting.evaluate`)
reads the facts for the workflows this worker knows, asks the pure rules of
:mod:`konduit.core.alerts` which alerts should be open, then:

- **raises** each finding with one upsert on the partial unique index ``konduit_alerts_open``:
  however many workers find the same thing at once, there is one open row per (kind, subject);
  the others only refresh it (``last_seen_at``);
- **resolves** each open alert of its workflows that no rule found, with one guarded UPDATE.

Both writes re-check, in their own statement, what they depend on: the time ``as_of`` at which
this round read its facts. A raise does not reopen an alert that another worker resolved after
``as_of`` (its facts are newer than ours), nor raise a window alert for an execution that is no
longer running; a resolve does not close an alert that another worker confirmed after ``as_of``.
Two workers whose rounds straddle a change of the facts may still flap an alert once; the next
round settles it.

Every raise and resolution is handed, inside the transaction that wrote it, to
:func:`alert_changed`: the one place where alerts leave the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core.alerts import (
    DEFAULT_VERSION_UNSERVED,
    KINDS,
    WINDOW_QUANTILE,
    Finding,
    degraded_budget,
    fan_in_findings,
    no_success,
    version_unserved,
    window_at_risk,
    window_resolution,
)
from konduit.core.durations import Duration
from konduit.core.fan_in import DEFAULT_HISTORY as STATS_HISTORY
from konduit.core.fan_in import Wait, fan_in_alerts, seconds_option
from konduit.core.forecast import DEFAULT_HISTORY as PLAN_HISTORY
from konduit.core.forecast import StepProgress, forecast
from konduit.core.model import ExecutionStatus
from konduit.core.shares import DEGRADED_WINDOW
from konduit.core.values import MAX_BIGINT, check_text
from konduit.db.database import Database, Tx
from konduit.engine import webhooks
from konduit.engine.registry import Registry
from konduit.engine.spans import load_durations
from konduit.errors import AlertError, DatabaseError, KonduitError, blamed
from konduit.records import AlertRecord

log = logging.getLogger(__name__)

MAX_WINDOWED = 500
"""Running executions with a window one round forecasts (soonest window first)."""
HISTORY_EVERY = 30.0
"""Seconds between two evaluations of the rules over history (fan-in waits, last successes):
their facts move slowly and their reads cover a day of executions. Windows are forecast every
round, from fresh span quantiles: a history of a few fast runs must count as soon as it exists."""


@dataclass(frozen=True)
class AlertChange:
    """An alert was raised (a new open row) or resolved."""

    event: Literal["raised", "resolved"]
    alert: AlertRecord


AlertHook = Callable[[Tx, AlertChange], Awaitable[None]]


async def alert_changed(tx: Tx, change: AlertChange) -> None:
    """Called once per raise and per resolution, inside the transaction that wrote it.

    The change is logged, and its webhook deliveries (``alert.raised`` / ``alert.resolved``)
    are written to the outbox through ``tx``, so a delivery commits together with the alert
    change (none lost, none invented); workers send it later. Keep it quick and free of network
    calls: it holds the transaction open."""
    a = change.alert
    await webhooks.alert_event(tx, f"alert.{change.event}", a)
    if change.event == "raised":
        log.warning("alert raised [%s %s] %s", a.kind, a.severity, a.message)
    else:
        log.info("alert resolved [%s] %s: %s", a.kind, a.subject,
                 a.details.get("resolution", "condition cleared"))


@dataclass
class Round:
    """What one evaluation did."""

    as_of: datetime
    findings: list[Finding] = field(default_factory=list)
    raised: list[AlertRecord] = field(default_factory=list)  # newly opened rows
    confirmed: list[AlertRecord] = field(default_factory=list)  # already open, refreshed
    resolved: list[AlertRecord] = field(default_factory=list)


class Alerting:
    """The alert rules of the workflows in ``registry``, evaluated against ``db``."""

    def __init__(
        self,
        db: Database,
        registry: Registry,
        *,
        fan_in_wait: Duration = 20.0,
        consecutive: int = 2,
        history: Duration = PLAN_HISTORY,
        fan_in_history: Duration = STATS_HISTORY,
        hook: AlertHook = alert_changed,
        history_every: float = HISTORY_EVERY,
        version_unserved: Duration = DEFAULT_VERSION_UNSERVED,
    ):
        self.db = db
        self.registry = registry
        self.fan_in_wait = seconds_option(fan_in_wait, "alert_fan_in_wait")
        if consecutive < 1:
            raise KonduitError(f"alert_fan_in_consecutive must be at least 1, got {consecutive}")
        self.consecutive = consecutive
        self.history = history  # the spans that forecasts weigh steps by (as `konduit plan`)
        self.fan_in_history = seconds_option(fan_in_history, "fan-in history")
        self.hook = hook
        self.history_every = history_every
        # Grace before a version whose executions no live worker serves raises its alert.
        self.version_unserved = seconds_option(version_unserved, "alert_version_unserved")
        self._history_read_at: float | None = None  # monotonic time of the last history rules

    @property
    def workflows(self) -> list[str]:
        return sorted({spec.name for spec in self.registry})

    async def run(self, interval: float, *, passed: Callable[[], None] = lambda: None) -> None:
        """Evaluate every ``interval`` seconds until cancelled; a failed round is logged and the
        next one tries again. ``passed`` is called after each round that ran to its end."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.evaluate()
                passed()
            except (DatabaseError, KonduitError) as exc:
                log.warning("alert evaluation failed: %s", exc)
            except Exception:  # a bug in a rule must not end alerting for the worker's life
                log.exception("alert evaluation failed")

    async def evaluate(self) -> Round:
        """One round: raise what the rules find, resolve what they no longer find."""
        names = self.workflows
        now = await self.db.one("alert_get_clock")
        assert now is not None
        done = Round(as_of=now["now"])
        if not names:
            return done
        windows, evaluated = await self._windows()
        done.findings = windows
        clock = time.monotonic()
        judged = {"window_at_risk"}  # kinds whose every open alert this round may resolve
        if self._history_read_at is None or clock - self._history_read_at >= self.history_every:
            done.findings += [*await self._fan_in(names), *await self._no_success(names),
                              *await self._degraded(names)]
            judged |= {"fan_in_wait", "no_success", "degraded_budget"}
            await self._versions(done)
            self._history_read_at = clock
        for finding in done.findings:
            await self._raise(finding, done)
        found = {f.key for f in done.findings}
        for row in await self.db.all("alert_list_open_for_workflows", workflows=names):
            open_alert = AlertRecord.from_row(row)
            if (open_alert.kind, open_alert.subject) in found or open_alert.kind not in judged:
                continue
            resolution = await self._resolution(open_alert, evaluated)
            if resolution is not None:
                await self._resolve(open_alert, resolution, done)
        return done

    # -- the rules' facts ------------------------------------------------------------------------

    async def _windows(self) -> tuple[list[Finding], set[str]]:
        """Window findings, and the executions forecast (their open alerts may be resolved)."""
        rows = await self.db.all("execution_list_running_with_window", limit=MAX_WINDOWED)
        known = [r for r in rows if self._spec(r["workflow_name"], r["workflow_version"])]
        if not known:
            return [], set()
        progress: dict[UUID, dict[str, StepProgress]] = {}
        for s in await self.db.all("step_list_progress_for_executions",
                                   execution_ids=[r["id"] for r in known]):
            progress.setdefault(s["execution_id"], {})[s["step"]] = StepProgress(
                s["status"], s["fired_at"], s["ended_at"])
        durations = {name: await load_durations(self.db, name, history=self.history)
                     for name in sorted({r["workflow_name"] for r in known})}
        found = []
        for r in known:
            spec = self.registry.get(r["workflow_name"], r["workflow_version"])
            steps, history = progress.get(r["id"], {}), durations[r["workflow_name"]]
            p50 = forecast(spec, steps, history, now=r["now"], quantile="p50")
            p95 = forecast(spec, steps, history, now=r["now"], quantile=WINDOW_QUANTILE)
            finding = window_at_risk(str(r["id"]), spec.name, window=r["deadline_at"],
                                     now=r["now"], p50=p50, p95=p95)
            if finding is not None:
                found.append(finding)
        return found, {str(r["id"]) for r in known}

    async def _fan_in(self, names: list[str]) -> list[Finding]:
        rows = await self.db.all(
            "step_join_waits_recent", workflow_name=None, history_seconds=self.fan_in_history,
            threshold_seconds=self.fan_in_wait, per_join=self.consecutive)
        recent: dict[tuple[str, str], list[Wait]] = {}
        for r in rows:
            if r["workflow_name"] in names:
                recent.setdefault((r["workflow_name"], r["step"]), []).append(Wait(
                    float(r["wait"]), r["straggler"], bool(r["waiting"]), str(r["execution_id"])))
        return fan_in_findings(fan_in_alerts(recent, threshold=self.fan_in_wait,
                                             consecutive=self.consecutive))

    async def _no_success(self, names: list[str]) -> list[Finding]:
        thresholds = {n: t for n in names
                      if (t := self.registry.get(n).alert_after_no_success) is not None}
        if not thresholds:
            return []
        found = []
        for r in await self.db.all("workflow_last_success_for_names", names=sorted(thresholds)):
            finding = no_success(r["name"], threshold=thresholds[r["name"]], now=r["now"],
                                 last_success_at=r["last_success_at"],
                                 registered_at=r["registered_at"])
            if finding is not None:
                found.append(finding)
        return found

    async def _degraded(self, names: list[str]) -> list[Finding]:
        budgets = {n: b for n in names if (b := self.registry.get(n).degraded_budget) is not None}
        if not budgets:
            return []
        found = []
        for r in await self.db.all("workflow_degraded_share_for_names", names=sorted(budgets),
                                   window_seconds=DEGRADED_WINDOW):
            finding = degraded_budget(r["name"], budget=budgets[r["name"]],
                                      finished=r["finished"], degraded=r["degraded"],
                                      window=DEGRADED_WINDOW)
            if finding is not None:
                found.append(finding)
        return found

    async def _versions(self, done: Round) -> None:
        """Raise ``version_unserved`` for every workflow version, of any deployment, whose running
        executions have had no live worker for the grace, and resolve those served again (or
        drained): the workers of such a version are gone, so whichever worker is up judges it."""
        found = []
        for r in await self.db.all("workflow_version_list_with_service", name=None):
            finding = version_unserved(r["name"], r["version"], running=r["running"],
                                       unserved_seconds=r["unserved_seconds"],
                                       grace=self.version_unserved)
            if finding is not None:
                found.append(finding)
                await self._raise(finding, done)
        done.findings += found
        keys = {f.key for f in found}
        for row in await self.db.all("alert_list_recent", include_resolved=False,
                                     kind="version_unserved", workflow=None, limit=1000):
            open_alert = AlertRecord.from_row(row)
            if (open_alert.kind, open_alert.subject) not in keys:
                await self._resolve(open_alert, {"resolution": "a live worker serves the version "
                                                 "again, or its executions ended"}, done)

    def _spec(self, name: str, version: int) -> bool:
        try:
            self.registry.get(name, version)
        except KonduitError:
            return False  # another deployment's version: its own workers judge it
        return True

    # -- writes ----------------------------------------------------------------------------------

    async def _raise(self, finding: Finding, done: Round) -> None:
        async with self.db.transaction() as tx:
            row = await tx.one(
                "alert_raise_or_confirm_unless_resolved_since", kind=finding.kind,
                subject=finding.subject, workflow=finding.workflow, severity=finding.severity,
                message=finding.message, details=Jsonb(dict(finding.details)),
                as_of=done.as_of, execution_id=finding.execution_id)
            if row is None:
                return  # resolved after our facts were read, or the execution ended meanwhile
            record = AlertRecord.from_row(row)
            if row["raised"]:
                done.raised.append(record)
                await self.hook(tx, AlertChange("raised", record))
            else:
                done.confirmed.append(record)

    async def _resolve(self, alert: AlertRecord, resolution: dict[str, Any], done: Round) -> None:
        async with self.db.transaction() as tx:
            row = await tx.one(
                "alert_resolve_if_open_and_unconfirmed_since", kind=alert.kind,
                subject=alert.subject, as_of=done.as_of, resolution=Jsonb(resolution))
            if row is None:
                return  # already resolved, or confirmed by a newer evaluation
            record = AlertRecord.from_row(row)
            done.resolved.append(record)
            await self.hook(tx, AlertChange("resolved", record))

    async def _resolution(self, alert: AlertRecord, evaluated: Iterable[str]) -> dict[str, Any] | None:
        """Why an open alert that no rule found now closes; None to leave it open."""
        if alert.kind == "fan_in_wait":
            return {"resolution": f"fan-in wait back under {self.fan_in_wait:g}s"}
        if alert.kind == "no_success":
            return {"resolution": "a successful execution, or no threshold any more"}
        if alert.kind == "degraded_budget":
            return {"resolution": "degraded share back within the budget, or no budget any more"}
        if alert.kind != "window_at_risk":
            return None  # a kind this version does not evaluate
        if alert.subject in evaluated:
            return window_resolution(ExecutionStatus.RUNNING, None, None)
        try:
            execution_id = UUID(alert.subject)
        except ValueError:
            return {"resolution": "execution no longer exists"}
        row = await self.db.one("execution_get_window_outcome", id=execution_id)
        if row is None:
            return window_resolution(None, None, None)
        if row["status"] == ExecutionStatus.RUNNING and row["generation"] == 1:
            return None  # not forecast this round (past the round's limit): leave it
        if row["status"] == ExecutionStatus.RUNNING:
            return {"resolution": "execution is being repaired: its window was its first run's"}
        return window_resolution(row["status"], row["deadline_at"], row["finished_at"])


async def list_alerts(
    db: Database, *, include_resolved: bool = False, kind: str | None = None,
    workflow: str | None = None, limit: int = 100,
) -> list[AlertRecord]:
    """Stored alerts, newest first: the open ones, or resolved ones too."""
    if kind is not None and kind not in KINDS:
        raise blamed(AlertError(f"unknown alert kind {kind!r} (known: {', '.join(KINDS)})"),
                     "kind")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BIGINT:
        raise blamed(AlertError(f"limit must be a whole number from 1 to {MAX_BIGINT}, got "
                                f"{limit!r:.40}"), "limit")
    check_text(workflow, "workflow")
    rows = await db.all("alert_list_recent", include_resolved=include_resolved, kind=kind,
                        workflow=workflow, limit=limit)
    return [AlertRecord.from_row(r) for r in rows]


async def prune_resolved_alerts(db: Database, older_than: Duration, *, batch: int = 1000) -> int:
    """Delete alerts resolved more than ``older_than`` ago, in batches; returns how many. Open
    alerts are never deleted. (For retention: ``App(retention=...)`` may call it.)"""
    seconds = seconds_option(older_than, "older_than")
    deleted = 0
    while True:
        n = await db.run("alert_delete_resolved_before", older_than_seconds=seconds, limit=batch)
        deleted += n
        if n < batch:
            return deleted
