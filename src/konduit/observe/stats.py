"""Stats: instrument the slowest branch, not the pipeline.

Per step (branch) of recent executions: p50/p95/p99 of its successful attempts (``finished_at -
started_at``), its attempts, retries and lost attempts, how its executions ended and the time since
its last success. Per join (a step with two upstreams or more): the **fan-in wait** (first branch
ended → join fired), the join's dispatch latency (last branch ended → join fired) and which branch
was the straggler how often. And the page to send: a join whose fan-in wait exceeded a threshold
(20 s) in each of its last N (2) executions raises an :class:`Alert`.

The rule is :func:`~konduit.core.fan_in.fan_in_alert`, pure; a join still waiting past the
threshold in a running execution counts as exceeding it (that is the moment to page, before the
window is at risk).
:func:`load_stats` reads the history with three named queries (``db/sql/stats.sql``) and
:func:`build_stats` turns their rows into a :class:`Stats`, also without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from konduit.core.durations import Duration, format_duration, format_elapsed
from konduit.core.fan_in import DEFAULT_HISTORY as DEFAULT_HISTORY
from konduit.core.fan_in import Alert as Alert
from konduit.core.fan_in import Wait as Wait
from konduit.core.fan_in import durable_steps, fan_in_threshold, split_wait, thresholds_of, upstream_of
from konduit.core.fan_in import fan_in_alert as fan_in_alert
from konduit.core.fan_in import fan_in_alerts as fan_in_alerts
from konduit.core.fan_in import seconds_option as seconds_option
from konduit.db.database import Database, Row
from konduit.errors import StatsError as StatsError
from konduit.errors import blamed

DEFAULT_FAN_IN_ALERT = "20s"
DEFAULT_CONSECUTIVE = 2
ALERT_EXIT_CODE = 3
"""``konduit stats`` exits with this code when an alert fires (0 otherwise, 1 on an error)."""

OUTCOMES = ("succeeded", "degraded", "failed", "timed_out", "skipped", "cancelled")


# -- the stats -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BranchStats:
    """One step of one workflow over the history: attempt durations (succeeded attempts, in
    seconds; None without any), tries, and how its executions ended."""

    workflow: str
    step: str
    p50: float | None
    p95: float | None
    p99: float | None
    attempts: int  # every try but those handed back unrun at a graceful stop
    retries: int  # tries that failed and were retried
    lost: int  # tries whose worker vanished (lease expired)
    outcomes: Mapping[str, int]  # executions of the step by how it ended (OUTCOMES)
    unfinished: int = 0  # executions in which the step has not ended yet
    last_success_at: datetime | None = None
    since_last_success: float | None = None  # seconds
    hedges: int = 0  # hedge attempts started beside a straggler (hedge=)
    hedges_won: int = 0  # ... that finished first and ended their task

    def to_json(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class JoinStats:
    """One join of one workflow over the executions in which it fired (seconds)."""

    workflow: str
    join: str
    samples: int
    wait_p50: float
    wait_p95: float
    wait_max: float
    dispatch_p50: float | None
    dispatch_p95: float | None
    stragglers: Mapping[str, int] = field(default_factory=dict)  # branch -> times it straggled

    @property
    def usual_straggler(self) -> str | None:
        """The branch that straggled most often (ties: the first by name)."""
        if not self.stragglers:
            return None
        return min(self.stragglers, key=lambda s: (-self.stragglers[s], s))

    def to_json(self) -> dict[str, Any]:
        return _plain(self) | {"usual_straggler": self.usual_straggler}


TOP_KEYS = 10
"""Keys shown per step limited per key (``konduit stats``, the dashboard): the busiest ones."""


@dataclass(frozen=True)
class KeyStats:
    """One key of a step limited per key, now: its running tasks and throttled time."""

    key: str
    running: int
    throttled_seconds: float
    throttled_now: bool


@dataclass(frozen=True)
class FlowStats:
    """A step with fleet-wide limits (``concurrency=``, ``rate=``), now. ``throttled_seconds``:
    wall-clock time during which claims left ready tasks of the step for its limit (measured at
    each claim that saw the step: from the first such claim to the next claim that was not held
    back); ``throttled_claims``: how many claims left tasks for it."""

    workflow: str
    version: int
    step: str
    concurrency: int | None
    rate: str | None
    running: int
    ready: int
    throttled_seconds: float
    throttled_now: bool
    throttled_claims: int
    # Limits per key (konduit.Limit/Rate(key=)): the limits apply to each key; the counts and
    # times above are the step's in all; `keys`: keys with a row (recent work), `top_keys`: the
    # busiest (at most TOP_KEYS).
    keyed: bool = False
    keys: int = 0
    keys_throttled: int = 0
    top_keys: tuple[KeyStats, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return _plain(self) | {"top_keys": [_plain(k) for k in self.top_keys]}


@dataclass(frozen=True)
class StoredEvents:
    """Events of one name sent before any task waited for them, kept for a task to come (not
    consumed, not expired): how many, and when the first of them expires (None: never)."""

    name: str
    events: int
    next_expiry: datetime | None

    def to_json(self) -> dict[str, Any]:
        return _plain(self)


@dataclass(frozen=True)
class Stats:
    workflow: str | None  # None: every workflow
    history_seconds: float
    threshold: float
    consecutive: int
    branches: list[BranchStats]
    joins: list[JoinStats]
    alerts: list[Alert]
    flow: list[FlowStats] = field(default_factory=list)
    stored_events: list[StoredEvents] = field(default_factory=list)
    # Recent fan-in waits on durable waits alone (an approval, a timer, a child workflow): their
    # own kind of wait, shown, never counted by the rule.
    durable_waits: list[DurableWait] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return ALERT_EXIT_CODE if self.alerts else 0

    @property
    def workflows(self) -> list[str]:
        return sorted({b.workflow for b in self.branches} | {j.workflow for j in self.joins})

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "history_seconds": self.history_seconds,
                "fan_in_alert_seconds": self.threshold, "consecutive": self.consecutive,
                "branches": [b.to_json() for b in self.branches],
                "joins": [j.to_json() for j in self.joins],
                "alerts": [a.to_json() for a in self.alerts],
                "flow": [f.to_json() for f in self.flow],
                "stored_events": [e.to_json() for e in self.stored_events],
                "durable_waits": [d.to_json() for d in self.durable_waits]}


@dataclass(frozen=True)
class DurableWait:
    """A join's fan-in wait, in one recent execution, on durable branches alone (seconds)."""

    workflow: str
    join: str
    execution_id: str | None
    seconds: float
    durable: str | None  # the durable branch (a wait step, or one behind it) it waited on
    waiting: bool

    def to_json(self) -> dict[str, Any]:
        return _plain(self)


def _plain(obj: Any) -> dict[str, Any]:
    """A dataclass as a JSON-ready dict (times as ISO 8601 strings)."""
    out = {f.name: getattr(obj, f.name) for f in fields(obj)}
    return {k: v.isoformat() if isinstance(v, datetime) else dict(v) if isinstance(v, Mapping)
            else v for k, v in out.items()}


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def build_stats(
    step_rows: Sequence[Row], join_rows: Sequence[Row], wait_rows: Sequence[Row], *,
    workflow: str | None, history_seconds: float, threshold: float, consecutive: int,
    flow_rows: Sequence[Row] = (), key_rows: Sequence[Row] = (),
    stored_rows: Sequence[Row] = (),
    specs: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> Stats:
    """Stats from the rows of the three queries (``wait_rows`` oldest first per join), of
    ``flow_limit_list`` (and ``flow_limit_list_top_keys``) and of ``event_count_stored``.
    ``specs``: the stored definitions of the waits' workflow versions, by (name, version):
    with them, durable waits are taken out of the waits the rule judges (and listed), and a
    join's own threshold (or its workflow's) replaces ``threshold``."""
    branches = [BranchStats(
        workflow=r["workflow_name"], step=r["step"], p50=_float(r["p50"]), p95=_float(r["p95"]),
        p99=_float(r["p99"]), attempts=int(r["attempts"]), retries=int(r["retries"]),
        lost=int(r["lost"]), outcomes={o: int(r[o]) for o in OUTCOMES},
        unfinished=int(r["unfinished"]), last_success_at=r["last_success_at"],
        since_last_success=_float(r["since_last_success"]),
        hedges=int(r.get("hedges") or 0), hedges_won=int(r.get("hedges_won") or 0),
    ) for r in step_rows]
    joins = [JoinStats(
        workflow=r["workflow_name"], join=r["step"], samples=int(r["samples"]),
        wait_p50=float(r["wait_p50"]), wait_p95=float(r["wait_p95"]),
        wait_max=float(r["wait_max"]), dispatch_p50=_float(r["dispatch_p50"]),
        dispatch_p95=_float(r["dispatch_p95"]),
        stragglers={str(k): int(v) for k, v in sorted(dict(r["stragglers"] or {}).items())},
    ) for r in join_rows]
    recent: dict[tuple[str, str], list[Wait]] = {}
    thresholds: dict[tuple[str, str], float] = {}
    durable_waits = []
    for r in wait_rows:
        key = (r["workflow_name"], r["step"])
        wait = Wait(float(r["wait"]), r["straggler"], bool(r["waiting"]), str(r["execution_id"]))
        spec = (specs or {}).get((r["workflow_name"], int(r.get("workflow_version") or 0)))
        if spec is not None:
            wait = split_wait(wait, upstream_of(spec, r["step"]), r.get("ends") or {},
                              durable_steps(spec))
            thresholds[key] = fan_in_threshold(spec, r["step"], threshold)
            if wait.durable_seconds > 0:
                durable_waits.append(DurableWait(key[0], key[1], wait.execution_id,
                                                 wait.durable_seconds, wait.durable,
                                                 wait.waiting))
        recent.setdefault(key, []).append(wait)
    alerts = fan_in_alerts(recent, threshold=threshold, consecutive=consecutive,
                           thresholds=thresholds)
    top: dict[tuple[str, str], list[KeyStats]] = {}
    for r in key_rows:
        top.setdefault((r["workflow"], r["step"]), []).append(KeyStats(
            str(r["key"]), int(r["running"]), float(r["throttled_seconds"]),
            bool(r["throttled_now"])))
    flow = [flow_stats(r, top.get((r["workflow"], r["step"]), [])) for r in flow_rows]
    flow = [f for f in flow if workflow is None or f.workflow == workflow]
    stored = [StoredEvents(r["name"], int(r["events"]), r["next_expiry"]) for r in stored_rows]
    return Stats(workflow, history_seconds, threshold, consecutive, branches, joins, alerts, flow,
                 stored, durable_waits)


def flow_stats(r: Row, top_keys: Sequence[KeyStats] = ()) -> FlowStats:
    """One row of ``flow_limit_list`` (its workflow is ``name@version``)."""
    from konduit.core.flow import FlowLimit

    name, _, version = str(r["workflow"]).rpartition("@")
    limit = FlowLimit(r["concurrency"], r["rate_count"], _float(r["rate_seconds"]))
    return FlowStats(workflow=name, version=int(version), step=r["step"],
                     concurrency=r["concurrency"], rate=limit.rate, running=int(r["running"]),
                     ready=int(r["ready"]), throttled_seconds=float(r["throttled_seconds"]),
                     throttled_now=bool(r["throttled_now"]),
                     throttled_claims=int(r["throttled_claims"]),
                     keyed=bool(r.get("keyed", False)), keys=int(r.get("keys") or 0),
                     keys_throttled=int(r.get("keys_throttled") or 0), top_keys=tuple(top_keys))


async def load_stats(
    db: Database, workflow: str | None = None, *, history: Duration = DEFAULT_HISTORY,
    fan_in_alert: Duration = DEFAULT_FAN_IN_ALERT, consecutive: int = DEFAULT_CONSECUTIVE,
) -> Stats:
    """Stats of ``workflow`` (None: every workflow) over the executions created within
    ``history``, with the alerts of the rule (``fan_in_alert`` seconds, ``consecutive`` runs)."""
    history_s = seconds_option(history, "--history")
    threshold = seconds_option(fan_in_alert, "--fan-in-alert")
    if consecutive < 1:
        raise blamed(StatsError(f"--consecutive must be at least 1, got {consecutive}"),
                     "consecutive")
    if workflow is not None:
        known = sorted({r["name"] for r in await db.all("workflow_list")})
        if workflow not in known:
            raise blamed(StatsError(f"unknown workflow {workflow!r} (known: "
                                    f"{', '.join(known) or 'none'})"), "workflow")
    params: dict[str, Any] = {"workflow_name": workflow, "history_seconds": history_s}
    steps = await db.all("step_attempt_stats_by_workflow", **params)
    joins = await db.all("step_join_stats_by_workflow", **params)
    # More of each join's last waits than the rule needs: an open one under its join's own
    # threshold is not judged yet. The stored definitions of their versions tell the durable
    # branches and the thresholds (read again past a smaller threshold, if one is set).
    per_join = 2 * consecutive + 2
    waits = await db.all("step_join_waits_recent", threshold_seconds=threshold,
                         per_join=per_join, **params)
    specs: dict[tuple[str, int], Mapping[str, Any]] = {}
    for name, version in sorted({(r["workflow_name"], r["workflow_version"]) for r in waits}):
        row = await db.one("workflow_get", name=name, version=version)
        if row is not None and row["spec"]:
            specs[(name, version)] = row["spec"]
    smallest = min([threshold, *thresholds_of(specs.values())])
    if smallest < threshold:
        waits = await db.all("step_join_waits_recent", threshold_seconds=smallest,
                             per_join=per_join, **params)
    flow = await db.all("flow_limit_list")
    keys = (await db.all("flow_limit_list_top_keys", per_step=TOP_KEYS)
            if any(r["keyed"] for r in flow) else [])
    stored = await db.all("event_count_stored")
    return build_stats(steps, joins, waits, workflow=workflow, history_seconds=history_s,
                       threshold=threshold, consecutive=consecutive, flow_rows=flow,
                       key_rows=keys, stored_rows=stored, specs=specs)


# -- presentation --------------------------------------------------------------------------------

_STYLES = {"succeeded": "green", "degraded": "yellow", "failed": "red", "timed_out": "red",
           "skipped": "dim", "cancelled": "magenta"}


def key_line(f: FlowStats) -> str:
    """The busiest keys of a step limited per key, on one line (rich markup)."""
    from rich.markup import escape

    shown = ", ".join(
        f"{escape(k.key)} {k.running} running"
        + (f" throttled {format_elapsed(k.throttled_seconds)}" if k.throttled_seconds else "")
        + (" [yellow](now)[/yellow]" if k.throttled_now else "")
        for k in f.top_keys) or "none running"
    return (f"{escape(f'{f.workflow}@{f.version}/{f.step}')}: {f.keys} key(s), "
            f"{f.keys_throttled} throttled now; busiest: {shown}")


def stats_renderables(stats: Stats) -> list[Any]:
    """Rich renderables: per workflow a table of its branches and one of its joins; then the
    alerts, in red (or a green line saying there are none)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    def table(*headers: str) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        t.add_column(headers[0], no_wrap=True)
        for header in headers[1:]:
            t.add_column(header, justify="right", no_wrap=True)
        return t

    out: list[Any] = []
    over = f"over the last {format_duration(stats.history_seconds)}"
    if not stats.workflows:
        out.append(f"no executions {over}" + (f" of {escape(stats.workflow)}" if stats.workflow else ""))
    for name in stats.workflows:
        branches = [b for b in stats.branches if b.workflow == name]
        runs = max((sum(b.outcomes.values()) + b.unfinished for b in branches), default=0)
        out.append(f"[bold]{escape(name)}[/bold]: {runs} execution(s) {over}")
        ended = [o for o in OUTCOMES if o == "succeeded" or any(b.outcomes.get(o) for b in branches)]
        running = any(b.unfinished for b in branches)
        lost = any(b.lost for b in branches)  # a column only when a worker vanished
        hedged = any(b.hedges for b in branches)  # a column only when a step was hedged
        t = table("branch", "p50", "p95", "p99", "tries", "retries", *(["lost"] if lost else []),
                  *(["hedges\nwon/started"] if hedged else []),
                  *("ok" if o == "succeeded" else o for o in ended), *(["running"] if running else []),
                  "last\nsuccess")
        for b in branches:
            cells = [escape(b.step), *map(format_elapsed, (b.p50, b.p95, b.p99)), str(b.attempts),
                     f"[yellow]{b.retries}[/yellow]" if b.retries else "0"]
            if lost:
                cells.append(f"[red]{b.lost}[/red]" if b.lost else "0")
            if hedged:
                cells.append(f"{b.hedges_won}/{b.hedges}")
            for o in ended:
                n = b.outcomes.get(o, 0)
                cells.append(f"[{_STYLES[o]}]{n}[/{_STYLES[o]}]" if n and o != "succeeded" else str(n))
            if running:
                cells.append(str(b.unfinished))
            cells.append("—" if b.since_last_success is None
                         else f"{format_elapsed(b.since_last_success)} ago")
            t.add_row(*cells)
        out.append(t)
        joins = [j for j in stats.joins if j.workflow == name]
        if not joins:
            continue
        t = table("join", "runs", "fan-in\nwait p50", "fan-in\nwait p95", "fan-in\nwait max",
                  "dispatch\np50", "dispatch\np95", "straggler\n(times)")
        for j in joins:
            ranked = sorted(j.stragglers.items(), key=lambda kv: (-kv[1], kv[0]))
            stragglers = "\n".join(f"{escape(s)} {n}" for s, n in ranked) or "—"
            worst = format_elapsed(j.wait_max)
            if j.wait_max > stats.threshold:
                worst = f"[red]{worst}[/red]"
            t.add_row(escape(j.join), str(j.samples), format_elapsed(j.wait_p50),
                      format_elapsed(j.wait_p95), worst, format_elapsed(j.dispatch_p50),
                      format_elapsed(j.dispatch_p95), stragglers)
        out.append(t)
    if stats.flow:
        t = table("flow limit", "concurrency", "rate", "running", "ready", "throttled",
                  "throttled\nclaims")
        for f in stats.flow:
            throttled = format_elapsed(f.throttled_seconds) + (" [yellow](now)[/yellow]"
                                                               if f.throttled_now else "")
            per_key = " per key" if f.keyed else ""
            t.add_row(escape(f"{f.workflow}@{f.version}/{f.step}"),
                      "—" if f.concurrency is None else f"{f.concurrency}{per_key}",
                      f"{f.rate}{per_key}" if f.rate else "—",
                      str(f.running), str(f.ready), throttled, str(f.throttled_claims))
        out.append(t)
        for f in stats.flow:
            if f.keyed:
                out.append(key_line(f))
    if stats.stored_events:
        t = table("stored event", "kept", "next expiry")
        for e in stats.stored_events:
            t.add_row(escape(e.name), str(e.events),
                      "never" if e.next_expiry is None else e.next_expiry.isoformat(" ", "seconds"))
        out.append(t)
    out.append("[dim]branch durations: succeeded attempts (started → finished); fan-in wait: first "
               "branch ended → join fired; dispatch: last branch ended → join fired[/dim]")
    for d in stats.durable_waits:
        out.append(f"[dim]{escape(d.workflow)}/{escape(d.join)}: waited "
                   f"{format_elapsed(d.seconds)}{' so far' if d.waiting else ''} on a durable "
                   f"wait ({escape(d.durable or '—')}) in execution {d.execution_id}: not a "
                   "straggler, not counted[/dim]")
    for alert in stats.alerts:
        out.append(f"[bold red]ALERT[/bold red] [red]{escape(alert.describe())}[/red]")
    if not stats.alerts:
        out.append(f"[green]no fan-in alert[/green] (no join waited more than "
                   f"{format_duration(stats.threshold)} in each of its last {stats.consecutive} "
                   "execution(s))")
    return out
