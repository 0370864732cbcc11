"""Plans: the latency composition of a workflow, made explicit.

"Fan-in barriers look like coordination but behave like latency": a join fires after its slowest
branch, so an execution takes as long as its slowest chain of steps. A plan answers, from the
workflow's own history, *which* chain that is (the critical path), how long it takes at p50, p95
and p99, when an execution started now (or at ``start``) would finish, and whether that is inside
its window (the execution's ``deadline_at``).

A step's weight is its **span** in past executions, ``ended_at - fired_at`` of its row in
``konduit_steps``: from the moment its join fired (its tasks were created) to the moment it ended.
That includes queueing, every attempt and retry backoff and, for a map step, all of its tasks; a
degraded step's span ends at its deadline. It is what the step really adds to an execution.

The pure part (:func:`critical_path`, :func:`build_plan`, :func:`judge`, the window parsers) does
no I/O and is unit- and property-tested on its own; :func:`load_plan` reads the history with one
named query (``step_span_quantiles_by_workflow`` in ``db/sql/plans.sql``) and builds the plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from konduit.core.durations import Duration, format_elapsed, parse_duration
from konduit.core.forecast import DEFAULT_HISTORY as DEFAULT_HISTORY
from konduit.core.forecast import QUANTILES as QUANTILES
from konduit.core.forecast import Quantile as Quantile
from konduit.core.forecast import StepQuantiles as StepQuantiles
from konduit.core.forecast import history_seconds as history_seconds
from konduit.core.forecast import quantile_name as quantile_name
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database
from konduit.engine.spans import load_durations as load_durations
from konduit.errors import KonduitError
from konduit.errors import PlanError as PlanError

Verdict = Literal["safe", "at risk", "will miss"]

PLAN_AT_RISK_EXIT_CODE = 3
"""``konduit plan`` exits with this code when the verdict is "at risk" or "will miss"."""


# -- the critical path ---------------------------------------------------------------------------


def critical_path(
    spec: WorkflowSpec, durations: Mapping[str, StepQuantiles], quantile: Quantile | float
) -> tuple[list[str], float]:
    """The longest path through the DAG, each step weighing its duration at ``quantile``.

    Returns the path (a root first, a final step last, each step downstream of the one before)
    and its total in seconds. Steps missing from ``durations`` (no history) weigh 0; a plan
    flags them. Ties are broken deterministically: the first upstream in ``after`` order, the
    first final step in topological order.

    Every join waits for all its branches (a degraded branch ends at its deadline), so the
    execution lasts as long as its longest path; only a ``quorum`` join may fire earlier, and for
    it the longest path is a conservative bound.

    Summing quantiles along a path is a planning approximation, not an exact quantile of the
    sum: the p99 of a chain is not the sum of its steps' p99s (slow runs of different steps do
    not always coincide, so the sum tends to be pessimistic; correlated slowness, like a shared
    downstream API degrading, makes it realistic), and which path is slowest may change from run
    to run. It answers the planning question "if every step on the way is as slow as its p99,
    when do we finish?"
    """
    name = quantile_name(quantile)
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for step in spec.order:
        best: str | None = None
        for up in spec[step].after:
            if best is None or finish[up] > finish[best]:
                best = up
        weight = durations[step].at(name) if step in durations else 0.0
        finish[step] = (finish[best] if best is not None else 0.0) + max(0.0, weight)
        via[step] = best
    end = spec.sinks[0]
    for sink in spec.sinks[1:]:
        if finish[sink] > finish[end]:
            end = sink
    path: list[str] = []
    node: str | None = end
    while node is not None:
        path.append(node)
        node = via[node]
    path.reverse()
    return path, finish[end]


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """The critical path at one quantile and when an execution following it would finish."""

    quantile: Quantile
    path: list[str]
    total_seconds: float
    finish_at: datetime
    slack_seconds: float | None  # window minus finish: negative means late; None without window


@dataclass(frozen=True)
class Plan:
    """A workflow's critical path at p50/p95/p99, predicted finishes and a verdict on the window.

    ``verdict`` is ``"safe"`` when even the p99 path finishes inside the window, ``"at risk"``
    when the p50 path does but the p99 path does not, ``"will miss"`` when not even the p50 path
    does, and ``None`` without a window or without any history. Totals are sums of quantiles along a path: see
    :func:`critical_path` for why that is a planning approximation.
    """

    workflow: str
    version: int
    order: tuple[str, ...]  # every step of the spec, in topological order
    durations: Mapping[str, StepQuantiles]  # steps with history (others weigh 0)
    estimates: Mapping[Quantile, Estimate]
    start: datetime
    window: datetime | None = None
    history_seconds: float | None = None
    final: tuple[str, ...] = field(default=())

    @property
    def no_history(self) -> list[str]:
        """Steps without history: they weigh 0, so the plan may be optimistic."""
        return [s for s in self.order if s not in self.durations]

    @property
    def verdict(self) -> Verdict | None:
        """None without a window, or without any history to judge it by."""
        if self.window is None or not self.durations:
            return None
        return judge(self.window, self.estimates["p50"].finish_at, self.estimates["p99"].finish_at)

    @property
    def samples(self) -> int:
        """Executions in the history (the most samples of any step)."""
        return max((d.samples for d in self.durations.values()), default=0)

    def on_path(self, step: str) -> list[Quantile]:
        """The quantiles whose critical path goes through ``step``."""
        return [q for q in QUANTILES if step in self.estimates[q].path]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings, durations in seconds)."""
        steps = []
        for name in self.order:
            d = self.durations.get(name)
            steps.append({
                "step": name,
                "p50": None if d is None else d.p50,
                "p95": None if d is None else d.p95,
                "p99": None if d is None else d.p99,
                "samples": 0 if d is None else d.samples,
                "degraded": 0 if d is None else d.degraded,
                "no_history": d is None,
                "final": name in self.final,
                "critical": self.on_path(name),
            })
        return {
            "workflow": self.workflow,
            "version": self.version,
            "start": self.start.isoformat(),
            "window": None if self.window is None else self.window.isoformat(),
            "window_seconds": None if self.window is None
            else (self.window - self.start).total_seconds(),
            "history_seconds": self.history_seconds,
            "verdict": self.verdict,
            "steps": steps,
            "no_history": self.no_history,
            "critical_path": {
                q: {
                    "path": e.path,
                    "total_seconds": e.total_seconds,
                    "finish_at": e.finish_at.isoformat(),
                    "slack_seconds": e.slack_seconds,
                }
                for q, e in self.estimates.items()
            },
            "note": "totals sum each step's quantile along the path: a planning approximation, "
                    "not an exact quantile of the execution's duration",
        }


def judge(window: datetime, p50_finish: datetime, p99_finish: datetime) -> Verdict:
    """safe: p99 finish <= window; at risk: p50 <= window < p99; will miss: p50 > window."""
    if p99_finish <= window:
        return "safe"
    if p50_finish <= window:
        return "at risk"
    return "will miss"


def _aware(value: datetime) -> datetime:
    """A naive datetime is local time."""
    return value if value.tzinfo is not None else value.astimezone()


def build_plan(
    spec: WorkflowSpec,
    durations: Mapping[str, StepQuantiles],
    *,
    start: datetime | None = None,
    window: datetime | None = None,
    history_seconds: float | None = None,
) -> Plan:
    """The plan of ``spec`` from step durations: critical path and predicted finish per
    quantile, from ``start`` (default: now), judged against ``window`` when there is one."""
    begin = _aware(start) if start is not None else datetime.now(UTC)
    end = _aware(window) if window is not None else None
    known = {name: d for name, d in durations.items() if name in spec.steps}
    estimates: dict[Quantile, Estimate] = {}
    for q in QUANTILES:
        path, total = critical_path(spec, known, q)
        finish = begin + timedelta(seconds=total)
        estimates[q] = Estimate(
            quantile=q,
            path=path,
            total_seconds=total,
            finish_at=finish,
            slack_seconds=None if end is None else (end - finish).total_seconds(),
        )
    return Plan(
        workflow=spec.name,
        version=spec.version,
        order=spec.order,
        durations=known,
        estimates=estimates,
        start=begin,
        window=end,
        history_seconds=history_seconds,
        final=spec.sinks,
    )


# -- windows -------------------------------------------------------------------------------------

_TIME_OF_DAY = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def parse_moment(text: str, *, after: datetime | None = None, what: str = "--window") -> datetime:
    """A moment given as a time of day (``"06:00"``, ``"05:30:15"``: its next occurrence, local
    time, after ``after`` (default: now)) or as an ISO 8601 date-time (naive means local)."""
    now = _aware(after) if after is not None else datetime.now().astimezone()
    value = text.strip()
    match = _TIME_OF_DAY.match(value)
    if match:
        hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise PlanError(f"{what}: {text!r} is not a time of day (HH:MM, 00:00 to 23:59)")
        local = now.astimezone()
        moment = local.replace(hour=hour, minute=minute, second=second, microsecond=0)
        if moment <= local:
            moment += timedelta(days=1)
        return moment
    try:
        return _aware(datetime.fromisoformat(value))
    except ValueError:
        raise PlanError(
            f"{what}: cannot read {text!r} as a time of day (HH:MM) or a date-time "
            f"(2026-11-30T06:00)"
        ) from None


def window_from(
    start: datetime, *, window: str | None = None, within: Duration | None = None
) -> datetime | None:
    """The window of an execution starting at ``start``: ``window`` is a time of day or a
    date-time, ``within`` a duration from the start (at most one of them)."""
    if window is not None and within is not None:
        raise PlanError("give the window either as --window HH:MM or as --within DURATION, not both")
    if within is not None:
        try:
            seconds = parse_duration(within, what="--within")
        except KonduitError as exc:
            raise PlanError(str(exc)) from None
        return _aware(start) + timedelta(seconds=seconds)
    if window is not None:
        return parse_moment(window, after=start, what="--window")
    return None


# -- history -------------------------------------------------------------------------------------


async def load_plan(
    db: Database,
    spec: WorkflowSpec,
    *,
    history: Duration = DEFAULT_HISTORY,
    start: datetime | None = None,
    window: datetime | None = None,
) -> Plan:
    """Read the history of ``spec``'s workflow and build its plan (see :func:`build_plan`)."""
    durations = await load_durations(db, spec.name, history=history)
    return build_plan(spec, durations, start=start, window=window,
                      history_seconds=history_seconds(history))


# -- presentation --------------------------------------------------------------------------------


def _clock(moment: datetime, precise: bool) -> str:
    local = moment.astimezone()
    return local.strftime("%H:%M:%S.%f")[:-3] if precise else local.strftime("%H:%M:%S")


def _slack(seconds: float) -> str:
    if seconds >= 0:
        return f"[green]{format_elapsed(seconds)} to spare[/green]"
    return f"[red]{format_elapsed(-seconds)} late[/red]"


VERDICT_STYLES: dict[str, str] = {"safe": "green", "at risk": "yellow", "will miss": "red"}


def verdict_text(plan: Plan) -> str:
    """One line (Rich markup) on the window: the verdict and why."""
    if plan.window is None:
        return "no window given (--window HH:MM or --within DURATION): no verdict"
    if plan.verdict is None:
        return "[yellow]no history to judge the window by: no verdict[/yellow]"
    p50, p99 = plan.estimates["p50"], plan.estimates["p99"]
    assert p50.slack_seconds is not None and p99.slack_seconds is not None
    style = VERDICT_STYLES[plan.verdict]
    head = f"[bold {style}]{plan.verdict}[/bold {style}]"
    if plan.verdict == "safe":
        why = f"even the p99 path finishes {format_elapsed(p99.slack_seconds)} inside the window"
    elif plan.verdict == "at risk":
        why = (f"the p50 path makes it with {format_elapsed(p50.slack_seconds)} to spare, the p99 "
               f"path misses by {format_elapsed(-p99.slack_seconds)}")
    else:
        why = f"even the p50 path misses the window by {format_elapsed(-p50.slack_seconds)}"
    return f"window {_clock(plan.window, precise=p99.total_seconds < 60)}: {head} — {why}"


def plan_renderables(plan: Plan, *, steps_table: bool = True) -> list[Any]:
    """Rich renderables: the step table, the critical path per quantile with its predicted
    finish, and the verdict."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    out: list[Any] = []
    precise = plan.estimates["p99"].total_seconds < 60
    if steps_table:
        history = "" if plan.history_seconds is None else \
            f" over the last {format_elapsed(plan.history_seconds)}"
        out.append(f"[bold]{escape(plan.workflow)}[/bold] v{plan.version}: step spans (fired → "
                   f"ended){history}, {plan.samples} execution(s)")
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
        table.add_column("step", no_wrap=True)
        for header in ("p50", "p95", "p99", "samples"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("critical path", no_wrap=True)
        for name in plan.order:
            d = plan.durations.get(name)
            on = plan.on_path(name)
            mark = "" if not on else "[bold]●[/bold]" if len(on) == len(QUANTILES) \
                else f"[bold]●[/bold] {', '.join(on)}"
            if d is None:
                table.add_row(escape(name), "—", "—", "—", "[yellow]no history[/yellow]", mark)
                continue
            samples = str(d.samples)
            if d.degraded:
                samples += f" [yellow]({d.degraded} degraded)[/yellow]"
            table.add_row(escape(name), format_elapsed(d.p50), format_elapsed(d.p95),
                          format_elapsed(d.p99), samples, mark)
        out.append(table)
    out.append(f"critical path and predicted finish, starting {_clock(plan.start, precise)}")
    paths = Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    paths.add_column("", no_wrap=True)
    paths.add_column("critical path")
    paths.add_column("takes", justify="right", no_wrap=True)
    paths.add_column("finishes", justify="right", no_wrap=True)
    if plan.window is not None:
        paths.add_column("vs window", justify="right", no_wrap=True)
    for q in QUANTILES:
        e = plan.estimates[q]
        cells = [q, " → ".join(escape(s) for s in e.path), format_elapsed(e.total_seconds),
                 _clock(e.finish_at, precise)]
        if e.slack_seconds is not None:
            cells.append(_slack(e.slack_seconds))
        paths.add_row(*cells)
    out.append(paths)
    out.append(verdict_text(plan))
    if plan.no_history:
        out.append(f"[yellow]no history for {', '.join(escape(s) for s in plan.no_history)}: "
                   "counted as 0 s, so the plan may be optimistic[/yellow]")
    return out


PLAN_NOTE = ("Totals sum each step's quantile along the path: a planning approximation, not an "
             "exact quantile of the execution's duration.")

