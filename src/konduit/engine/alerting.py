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

from konduit.aio import cancelling
from konduit.core.alerts import (
    DEFAULT_QUEUE_UNSERVED,
    DEFAULT_VERSION_UNSERVED,
    GRACE_KINDS,
    KINDS,
    WINDOW_QUANTILE,
    Finding,
    Unkeepable,
    degraded_budget,
    fan_in_findings,
    no_success,
    queue_unserved,
    version_unserved,
    window_at_risk,
    window_resolution,
)
from konduit.core.durations import Duration
from konduit.core.fan_in import DEFAULT_HISTORY as STATS_HISTORY
from konduit.core.fan_in import (
    Wait,
    durable_steps,
    fan_in_alerts,
    fan_in_threshold,
    seconds_option,
    split_wait,
    thresholds_of,
    upstream_of,
)
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
GRACE_POLL = (1.0, 30.0)
"""Seconds between two looks for a rule with a grace (:data:`konduit.core.alerts.GRACE_KINDS`):
half its grace, within these bounds. A look that finds a condition not yet past its grace looks
again the moment it will be, so the alert is raised at most a second or so after its grace (or
at the first look, when the condition began less than a look before that)."""


def grace_poll(grace: float) -> float:
    """Seconds between two looks of a rule whose grace is ``grace``."""
    return min(GRACE_POLL[1], max(GRACE_POLL[0], grace / 2))


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
        queue_unserved: Duration = DEFAULT_QUEUE_UNSERVED,
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
        # Grace before ready tasks on a queue that no live worker takes raise theirs.
        self.queue_unserved = seconds_option(queue_unserved, "alert_queue_unserved")
        self._history_read_at: float | None = None  # monotonic time of the last history rules

    @property
    def workflows(self) -> list[str]:
        return sorted({spec.name for spec in self.registry})

    @property
    def graces(self) -> dict[str, float]:
        """The grace of each rule that has one, by kind."""
        return {"version_unserved": self.version_unserved, "queue_unserved": self.queue_unserved}

    async def run(self, interval: float, *, passed: Callable[[], None] = lambda: None) -> None:
        """Evaluate every ``interval`` seconds until cancelled; a failed round is logged and the
        next one tries again. ``passed`` is called after each round that ran to its end. The
        rules with a grace run beside, on their own cadence (:meth:`run_graces`)."""
        graces = asyncio.create_task(self.run_graces(), name="konduit-alert-graces")
        try:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.evaluate(graces=False)
                    passed()
                except (DatabaseError, KonduitError) as exc:
                    if cancelling():
                        raise  # the stop, not a failed evaluation
                    log.warning("alert evaluation failed: %s", exc)
                except Exception:  # a bug in a rule must not end alerting for the worker's life
                    if cancelling():
                        raise
                    log.exception("alert evaluation failed")
        finally:
            graces.cancel()
            await asyncio.gather(graces, return_exceptions=True)

    async def run_graces(self) -> None:
        """Look for the conditions of the rules with a grace until cancelled: each rule every
        :func:`grace_poll` of its grace, and again when a condition it found will have lasted
        its grace; a failed look is logged and the next one tries again."""
        due = dict.fromkeys(self.graces, 0.0)  # monotonic time of each rule's next look
        while True:
            clock = time.monotonic()
            kinds = [k for k, at in due.items() if at <= clock]
            if kinds:
                crossing: dict[str, float | None] = {}
                try:
                    crossing = (await self.evaluate_graces(kinds))[1]
                except (DatabaseError, KonduitError) as exc:
                    if cancelling():
                        raise  # the stop, not a failed look
                    log.warning("alert evaluation failed: %s", exc)
                except Exception:
                    if cancelling():
                        raise
                    log.exception("alert evaluation failed")
                for kind in kinds:
                    soon, poll = crossing.get(kind), grace_poll(self.graces[kind])
                    due[kind] = clock + (poll if soon is None else min(poll, soon + 0.05))
            await asyncio.sleep(max(0.05, min(due.values()) - time.monotonic()))

    async def evaluate_graces(
            self, kinds: Iterable[str] = GRACE_KINDS) -> tuple[Round, dict[str, float | None]]:
        """One look of the rules with a grace among ``kinds``: raise and resolve their alerts.
        Returns the round and, per kind, in how many seconds a condition it found under its
        grace will have lasted it (None: none found)."""
        now = await self.db.one("alert_get_clock")
        assert now is not None
        done = Round(as_of=now["now"])
        crossing: dict[str, float | None] = {}
        if "version_unserved" in kinds:
            crossing["version_unserved"] = await self._versions(done)
        if "queue_unserved" in kinds:
            crossing["queue_unserved"] = await self._queues(done)
        return done, crossing

    async def evaluate(self, *, graces: bool = True) -> Round:
        """One round: raise what the rules find, resolve what they no longer find; with
        ``graces``, the rules with a grace too (:meth:`run` looks for those on their own
        cadence)."""
        names = self.workflows
        now = await self.db.one("alert_get_clock")
        assert now is not None
        done = Round(as_of=now["now"])
        if graces:
            await self._versions(done)
            await self._queues(done)
        if not names:
            return done
        findings, evaluated = await self._windows()
        clock = time.monotonic()
        judged = {"window_at_risk"}  # kinds whose every open alert this round may resolve
        if self._history_read_at is None or clock - self._history_read_at >= self.history_every:
            findings += [*await self._fan_in(names), *await self._no_success(names),
                         *await self._degraded(names)]
            judged |= {"fan_in_wait", "no_success", "degraded_budget"}
            self._history_read_at = clock
        for finding in findings:
            await self._raise(finding, done)
        done.findings += findings
        found = {f.key for f in findings}
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
            unkeepable = None if r["unkeepable_step"] is None else Unkeepable(
                r["unkeepable_step"], float(r["unkeepable_reserve"]),
                float(r["unkeepable_window_left"]))
            finding = window_at_risk(str(r["id"]), spec.name, window=r["deadline_at"],
                                     now=r["now"], p50=p50, p95=p95, unkeepable=unkeepable)
            if finding is not None:
                found.append(finding)
        return found, {str(r["id"]) for r in known}

    async def _fan_in(self, names: list[str]) -> list[Finding]:
        """Fan-in findings: each join judged by its own threshold (the join's, its workflow's,
        else the worker's), on the part of its waits that its durable branches (waits for an
        event, a timer, a child workflow, and the steps behind them) did not hold alone."""
        specs = [spec.spec_json for spec in self.registry]
        # Read the open waits past the smallest threshold, and more of each join's last waits
        # than the rule needs: an open one under its own threshold is not judged yet.
        rows = await self.db.all(
            "step_join_waits_recent", workflow_name=None, history_seconds=self.fan_in_history,
            threshold_seconds=min([self.fan_in_wait, *thresholds_of(specs)]),
            per_join=2 * self.consecutive + 2)
        recent: dict[tuple[str, str], list[Wait]] = {}
        thresholds: dict[tuple[str, str], float] = {}
        for r in rows:
            if r["workflow_name"] not in names:
                continue
            key = (r["workflow_name"], r["step"])
            spec = self._spec_json(r["workflow_name"], r["workflow_version"])
            wait = split_wait(Wait(float(r["wait"]), r["straggler"], bool(r["waiting"]),
                                   str(r["execution_id"])),
                              upstream_of(spec, r["step"]), r["ends"] or {}, durable_steps(spec))
            recent.setdefault(key, []).append(wait)
            # The newest registered version's threshold judges the join's waits.
            thresholds[key] = fan_in_threshold(self.registry.get(key[0]).spec_json, key[1],
                                               self.fan_in_wait)
        return fan_in_findings(fan_in_alerts(recent, threshold=self.fan_in_wait,
                                             consecutive=self.consecutive,
                                             thresholds=thresholds))

    def _spec_json(self, name: str, version: int) -> dict[str, Any]:
        """The stored definition of a version this worker knows, else its newest one's."""
        try:
            return self.registry.get(name, version).spec_json
        except KonduitError:
            return self.registry.get(name).spec_json

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

    async def _versions(self, done: Round) -> float | None:
        """Raise ``version_unserved`` for every workflow version, of any deployment, whose running
        executions have had no live worker for the grace, and resolve those served again (or
        drained): the workers of such a version are gone, so whichever worker is up judges it.
        Returns in how many seconds the first version unserved for less than the grace will have
        been for the grace (None: none is)."""
        found, soon = [], None
        for r in await self.db.all("workflow_version_list_with_service", name=None):
            finding = version_unserved(r["name"], r["version"], running=r["running"],
                                       unserved_seconds=r["unserved_seconds"],
                                       grace=self.version_unserved)
            if finding is not None:
                found.append(finding)
            elif r["running"] > 0 and r["unserved_seconds"] is not None:
                soon = _sooner(soon, self.version_unserved - r["unserved_seconds"])
        await self._judge("version_unserved", found, done,
                          "a live worker serves the version again, or its executions ended")
        return soon

    async def _queues(self, done: Round) -> float | None:
        """Raise ``queue_unserved`` for every queue and workflow version, of any deployment, whose
        ready tasks no live worker takes (one that serves the version, but not the queue) for
        the grace, and resolve those taken again (or with nothing ready any more). Returns in
        how many seconds the first one unserved for less than the grace will have been for it."""
        found, soon = [], None
        for r in await self.db.all("task_queue_list_unserved"):
            name, _, version = str(r["workflow"]).rpartition("@")
            executions = [str(e) for e in r["executions"] or ()]
            finding = queue_unserved(r["queue"], name, int(version), ready=int(r["ready"]),
                                     executions=executions,
                                     unserved_seconds=r["unserved_seconds"],
                                     grace=self.queue_unserved)
            if finding is not None:
                found.append(finding)
            elif r["unserved_seconds"] is not None:
                soon = _sooner(soon, self.queue_unserved - r["unserved_seconds"])
        await self._judge("queue_unserved", found, done,
                          "a live worker serving the version takes the queue, nothing is ready "
                          "there any more, or no live worker serves the version")
        return soon

    async def _judge(self, kind: str, found: list[Finding], done: Round, resolution: str) -> None:
        """Raise ``found``, all of ``kind`` found by one full look, and resolve the open alerts of
        that kind it did not find (of every workflow: these rules judge every deployment's)."""
        for finding in found:
            await self._raise(finding, done)
        done.findings += found
        keys = {f.key for f in found}
        for row in await self.db.all("alert_list_recent", include_resolved=False,
                                     kind=kind, workflow=None, limit=1000):
            open_alert = AlertRecord.from_row(row)
            if (open_alert.kind, open_alert.subject) not in keys:
                await self._resolve(open_alert, {"resolution": resolution}, done)

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
                as_of=done.as_of, execution_id=finding.execution_id,
                queue=None if finding.queue is None else finding.queue[0],
                queue_workflow=None if finding.queue is None else finding.queue[1])
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
            limit = float(alert.details.get("threshold_seconds") or self.fan_in_wait)
            return {"resolution": f"fan-in wait back under {limit:g}s"}
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


def _sooner(soon: float | None, left: float) -> float:
    return max(0.0, left) if soon is None else min(soon, max(0.0, left))


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
