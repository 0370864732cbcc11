"""Alert rules, pure: given what the history says, which alerts should be open.

Four rules, each turning facts into :class:`Finding`\\ s (an alert that should be open now):

- :func:`window_at_risk` — a running execution with a window (``deadline_at``) whose p95
  forecast (:mod:`konduit.core.forecast`) finishes after the window. ``warning`` while its p50
  forecast still makes it, ``critical`` once not even that does (or the window has passed).
- :func:`fan_in_findings` — the page to send: a join whose fan-in wait exceeded a threshold in
  each of its last N executions (the rule of ``konduit stats``, :func:`konduit.core.fan_in.fan_in_alert`).
- :func:`no_success` — a workflow without a successful execution for longer than its
  ``Workflow(..., alert_after_no_success=...)``.
- :func:`execution_stalled` — a running execution in which nothing can run (the stall
  watchdog of the maintenance pass, :mod:`konduit.engine.stalls`, raises it; resolved at once
  when the fan-in decision it re-ran healed the execution).
- :func:`version_unserved` — a workflow version with running executions and no live worker
  serving it for longer than a grace (docs/changing-workflows.md).
- :func:`queue_unserved` — ready tasks of a workflow version on a queue that no live worker
  serving that version takes, for longer than a grace (a few seconds).
- :func:`degraded_budget` — a workflow whose executions went out degraded more often over the
  last day than its ``Workflow(..., degraded_budget="2%")`` (e.g. "roughly 2% of runs").

A finding that is no longer found resolves its alert. The service that stores them is
:mod:`konduit.engine.alerting`; a stored alert as the API returns it is a
:class:`konduit.records.AlertRecord`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from konduit.core.durations import format_duration, format_elapsed
from konduit.core.fan_in import Alert as FanInAlert
from konduit.core.forecast import Forecast, Quantile
from konduit.core.shares import degraded_share, format_share

Kind = Literal["window_at_risk", "fan_in_wait", "no_success", "execution_stalled",
               "degraded_budget", "version_unserved", "queue_unserved"]
KINDS: tuple[Kind, ...] = ("window_at_risk", "fan_in_wait", "no_success", "execution_stalled",
                           "degraded_budget", "version_unserved", "queue_unserved")
GRACE_KINDS: tuple[Kind, ...] = ("version_unserved", "queue_unserved")
"""The kinds raised once a condition has lasted a grace: evaluated on a cadence of their own,
so that they are raised soon after the grace whatever it is (docs/alerts.md)."""
Severity = Literal["warning", "critical"]

WINDOW_QUANTILE: Quantile = "p95"
"""The forecast that raises a window alert: the p95 finish crossing the window."""


@dataclass(frozen=True)
class Finding:
    """An alert that a rule says should be open now."""

    kind: Kind
    subject: str  # what it is about: an execution id, "workflow/join", a workflow
    workflow: str
    severity: Severity
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    execution_id: str | None = None  # set for alerts about one running execution
    queue: tuple[str, str] | None = None  # (queue, workflow@version): raised only while unserved

    @property
    def key(self) -> tuple[str, str]:
        """(kind, subject): at most one open alert per key."""
        return self.kind, self.subject


# -- window at risk ------------------------------------------------------------------------------


def _clock(moment: datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class Unkeepable:
    """A branch whose window left it no time: what its budget's reserve needed after its
    deadline, and what the window had left when its task was made (both in seconds)."""

    step: str
    reserve: float
    window_left: float


def window_at_risk(
    execution_id: str, workflow: str, *, window: datetime, now: datetime,
    p50: Forecast, p95: Forecast, unkeepable: Unkeepable | None = None,
) -> Finding | None:
    """A finding when the p95 forecast finishes after ``window`` (or the window has passed with
    the execution still running), else None. Critical when the p50 forecast misses too, and
    at once when a branch's budget could not keep the window even with its fallback run
    immediately (``unkeepable``): the rule knows then, not at the miss."""
    if p95.finish_at <= window and now <= window and unkeepable is None:
        return None
    missed = now > window
    # A branch left no time is critical: whatever the forecast, the window's reserve is gone.
    severity: Severity = "critical" if missed or p50.finish_at > window or \
        unkeepable is not None else "warning"
    late = -p95.slack_seconds(window)
    path = " → ".join(p95.path) if p95.path else "—"
    if unkeepable is not None and not missed:
        message = (f"{workflow} execution {execution_id}: its window {_clock(window)} leaves "
                   f"no time for step {unkeepable.step!r}, which needs "
                   f"{format_elapsed(unkeepable.reserve)} after its deadline (its fallback, "
                   f"the steps after it and a margin) where the window had "
                   f"{format_elapsed(max(0.0, unkeepable.window_left))}: its fallback ran at "
                   f"once")
    elif missed:
        message = (f"{workflow} execution {execution_id} is still running "
                   f"{format_elapsed((now - window).total_seconds())} past its window "
                   f"{_clock(window)}")
    else:
        message = (f"{workflow} execution {execution_id} is predicted to finish at "
                   f"{_clock(p95.finish_at)} (p95), {format_elapsed(late)} after its window "
                   f"{_clock(window)}; still to run: {path}")
    details = {"execution_id": execution_id, "window": window.isoformat(),
               "evaluated_at": now.isoformat(), "missed": missed,
               "p50_finish_at": p50.finish_at.isoformat(),
               "p95_finish_at": p95.finish_at.isoformat(),
               "p95_slack_seconds": p95.slack_seconds(window),
               "p50_slack_seconds": p50.slack_seconds(window),
               "path": list(p95.path), "no_history": list(p95.no_history)}
    if unkeepable is not None:
        details |= {"unkeepable_step": unkeepable.step,
                    "unkeepable_reserve_seconds": unkeepable.reserve,
                    "unkeepable_window_left_seconds": unkeepable.window_left}
    return Finding("window_at_risk", execution_id, workflow, severity, message, details,
                   execution_id=execution_id)


def window_resolution(status: str | None, window: datetime | None,
                      finished_at: datetime | None) -> dict[str, Any]:
    """Why a window alert closes, for its details: how its execution ended against its window
    (``status`` None: the execution is gone; ``running``: its forecast is back inside)."""
    if status is None:
        return {"resolution": "execution no longer exists"}
    if status == "running" or finished_at is None:
        return {"resolution": "forecast back inside the window"}
    if window is None or finished_at <= window:
        return {"resolution": f"execution {status} inside its window", "status": status,
                "finished_at": finished_at.isoformat()}
    late = (finished_at - window).total_seconds()
    return {"resolution": f"execution {status} {format_elapsed(late)} after its window",
            "status": status, "finished_at": finished_at.isoformat(), "missed_by_seconds": late}


# -- fan-in wait ---------------------------------------------------------------------------------


def fan_in_findings(alerts: Sequence[FanInAlert]) -> list[Finding]:
    """The fan-in alerts of the stats rule as findings (subject ``workflow/join``); critical when
    the join is still waiting past the threshold right now."""
    found = []
    for a in alerts:
        details = a.to_json()
        found.append(Finding("fan_in_wait", f"{a.workflow}/{a.join}", a.workflow,
                             "critical" if a.waits[-1].waiting else "warning",
                             a.describe(), details))
    return found


# -- time since last success ---------------------------------------------------------------------


def no_success(
    workflow: str, *, threshold: float, now: datetime, last_success_at: datetime | None,
    registered_at: datetime | None,
) -> Finding | None:
    """A finding when ``workflow`` has had no successful execution for more than ``threshold``
    seconds: since its last success, or, never having succeeded, since it was first registered
    (a new workflow gets its threshold's grace)."""
    since = last_success_at or registered_at
    if since is None:
        return None
    quiet = (now - since).total_seconds()
    if quiet <= threshold:
        return None
    what = (f"last success {format_elapsed(quiet)} ago ({_clock(last_success_at)})"
            if last_success_at is not None
            else f"never succeeded since it was registered {format_elapsed(quiet)} ago")
    message = f"{workflow}: no successful execution for more than {format_duration(threshold)}; {what}"
    details = {"threshold_seconds": threshold, "seconds_since": quiet,
               "last_success_at": None if last_success_at is None else last_success_at.isoformat(),
               "registered_at": None if registered_at is None else registered_at.isoformat()}
    return Finding("no_success", workflow, workflow, "warning", message, details)


# -- version unserved ----------------------------------------------------------------------------

DEFAULT_VERSION_UNSERVED = 300.0
"""Seconds a version's running executions may go without a live worker before the alert."""


def version_unserved(workflow: str, version: int, *, running: int,
                     unserved_seconds: float | None, grace: float) -> Finding | None:
    """A finding when ``running`` executions of ``workflow`` at ``version`` have had no live
    worker serving that version for more than ``grace`` seconds (``unserved_seconds``: how long
    so far, None while a worker serves it)."""
    if running <= 0 or unserved_seconds is None or unserved_seconds <= grace:
        return None
    key = f"{workflow}@{version}"
    message = (f"{key}: {running} running execution{'s' if running != 1 else ''} and no live "
               f"worker serving version {version} for {format_elapsed(unserved_seconds)}; start "
               f"a worker that registers it, or migrate them (docs/changing-workflows.md)")
    details = {"version": version, "running": running, "unserved_seconds": unserved_seconds,
               "grace_seconds": grace}
    return Finding("version_unserved", key, workflow, "critical", message, details)


# -- queue unserved ------------------------------------------------------------------------------

DEFAULT_QUEUE_UNSERVED = 5.0
"""Seconds ready tasks may wait on a queue that no live worker takes before the alert."""


def queue_unserved(queue: str, workflow: str, version: int, *, ready: int,
                   executions: Sequence[str], unserved_seconds: float | None,
                   grace: float) -> Finding | None:
    """A finding when ``ready`` tasks of ``workflow`` at ``version`` have waited on ``queue``
    with no live worker serving that version taking the queue, for more than ``grace`` seconds
    (``unserved_seconds``: how long so far). Critical: nothing will run them by itself.
    ``executions``: some of the executions behind them."""
    if ready <= 0 or unserved_seconds is None or unserved_seconds <= grace:
        return None
    key = f"{workflow}@{version}"
    shown = ", ".join(executions)
    message = (f"{key}: {ready}{'+' if ready >= 1000 else ''} ready task"
               f"{'s' if ready != 1 else ''} on queue {queue!r} and no live worker serving "
               f"{key} takes that queue, for {format_elapsed(unserved_seconds)}; start a worker "
               f"with --queue {queue} (executions: {shown or '—'})")
    details = {"queue": queue, "version": version, "ready": ready,
               "executions": list(executions), "unserved_seconds": unserved_seconds,
               "grace_seconds": grace}
    return Finding("queue_unserved", f"{key}/{queue}", workflow, "critical", message, details,
                   queue=(queue, key))


# -- execution stalled ---------------------------------------------------------------------------


def execution_stalled(execution_id: str, workflow: str, *, quiet_seconds: float,
                      replayed: Sequence[str], reasons: Sequence[str], healed: bool,
                      fired: Sequence[str] = ()) -> Finding:
    """The stall the watchdog found in a running execution, quiet for ``quiet_seconds``: the
    uncounted task ends it replayed (``replayed``), what the data cannot decide (``reasons``)
    and whether the re-run fan-in decision ``healed`` it (the alert is then resolved at once).
    Critical while open: nothing of the execution will ever run by itself."""
    quiet = format_elapsed(quiet_seconds)
    if healed:
        message = (f"{workflow} execution {execution_id} was stalled for {quiet}: "
                   f"{'; '.join(replayed)}; the re-run fan-in decision healed it")
        if fired:
            message += f" (fired {', '.join(fired)})"
    else:
        why = "; ".join(reasons) or "the fan-in decision changes nothing that can run"
        message = (f"{workflow} execution {execution_id} is stalled: nothing of it can run "
                   f"for {quiet}: {why}")
    details = {"execution_id": execution_id, "quiet_seconds": quiet_seconds, "healed": healed,
               "replayed": list(replayed), "reasons": list(reasons), "fired": list(fired)}
    return Finding("execution_stalled", execution_id, workflow,
                   "warning" if healed else "critical", message, details,
                   execution_id=execution_id)

# -- the degraded budget -------------------------------------------------------------------------


def degraded_budget(workflow: str, *, budget: float, finished: int, degraded: int,
                    window: float) -> Finding | None:
    """A finding when more than ``budget`` (a fraction) of the ``finished`` executions of the
    last ``window`` seconds went out ``degraded``; else None (none finished: no share). Critical
    past twice the budget."""
    share = degraded_share(finished, degraded)
    if share is None or share <= budget:
        return None
    severity: Severity = "critical" if share > 2 * budget else "warning"
    message = (f"{workflow}: {degraded} of {finished} executions in the last {format_duration(window)} went "
               f"out degraded ({format_share(share)}), past its degraded budget of "
               f"{format_share(budget)}")
    details = {"share": share, "budget": budget, "finished": finished, "degraded": degraded,
               "window_seconds": window}
    return Finding("degraded_budget", workflow, workflow, severity, message, details)
