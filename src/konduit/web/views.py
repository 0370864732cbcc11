"""The dashboard's pictures, without I/O: the DAG laid out in columns by topological depth, and the
Gantt timeline of attempts with each join's fan-in wait (first branch ended -> join fired) and
its straggler, which is what makes the latency composition of an execution visible.

Everything here turns rows into coordinates and labels; the templates only draw them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from konduit.core.durations import format_elapsed
from konduit.core.payloads import is_sealed
from konduit.core.words import STEP_WORDS, step_word
from konduit.db.sealing import sealed_words

STEP_STATUSES = STEP_WORDS  # the words the page shows (konduit.core.words), not the stored ones
ATTEMPT_OUTCOMES = ("running", "waiting", "succeeded", "degraded", "retry", "failed", "timed_out", "lost",
                    "released", "cancelled")
FINISHED = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
REPAIRABLE = frozenset({"degraded", "failed", "timed_out", "cancelled"})
REDRIVABLE = frozenset({"failed", "timed_out", "cancelled"})  # a redrive keeps degraded steps


def secs(value: float | None) -> str:
    """Seconds as people read them (``0.412s``, ``12.3s``, ``4m05s``), ``—`` for nothing."""
    return format_elapsed(None if value is None else max(value, 0.0))


def from_now(moment: datetime | None) -> str:
    """``in 4m05s`` or ``12.3s ago`` (``—`` for nothing): a deadline or a timer, read at once."""
    if moment is None:
        return "—"
    delta = (moment - datetime.now(UTC)).total_seconds()
    return f"in {secs(delta)}" if delta >= 0 else f"{secs(-delta)} ago"


def between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def last_line(text: str | None) -> str:
    """The last non-empty line of an error (a traceback's is the exception itself)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# -- the DAG -------------------------------------------------------------------------------------

NODE_W, NODE_H, COL_GAP, ROW_GAP, PAD = 160, 38, 60, 18, 12


@dataclass(frozen=True)
class Node:
    name: str
    status: str
    x: float
    y: float
    label: str  # the step's name, shortened to fit
    detail: str  # "degraded", "3/5 degraded" for a map step, ...
    join: str | None  # the join policy of a step with several upstreams


@dataclass(frozen=True)
class Dag:
    nodes: list[Node]
    edges: list[tuple[float, float, float, float]]  # x1, y1, x2, y2
    width: float
    height: float
    node_w: int = NODE_W
    node_h: int = NODE_H


def depths(spec_steps: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each step's column: 0 for a root, else one more than its deepest upstream (the stored spec
    lists steps in topological order)."""
    depth: dict[str, int] = {}
    for step in spec_steps:
        depth[step["name"]] = 1 + max((depth.get(u, 0) for u in step["after"]), default=-1)
    return depth


def dag_layout(spec_steps: Sequence[Mapping[str, Any]], steps: Mapping[str, Mapping[str, Any]]) -> Dag:
    """Nodes in columns by depth (in spec order within a column), edges from the right side of an
    upstream to the left side of its downstream, colored by the live status in ``steps``."""
    depth = depths(spec_steps)
    columns: dict[int, list[str]] = {}
    for step in spec_steps:
        columns.setdefault(depth[step["name"]], []).append(step["name"])
    tallest = max((len(c) for c in columns.values()), default=1)
    height = PAD * 2 + tallest * NODE_H + (tallest - 1) * ROW_GAP
    where: dict[str, tuple[float, float]] = {}
    for col, names in columns.items():
        top = (height - (len(names) * NODE_H + (len(names) - 1) * ROW_GAP)) / 2
        for i, name in enumerate(names):
            where[name] = (PAD + col * (NODE_W + COL_GAP), top + i * (NODE_H + ROW_GAP))
    nodes = []
    for step in spec_steps:
        name, row = step["name"], steps.get(step["name"], {})
        # The word shown (pending, waiting, running...): the caller may have put it in "word".
        status = str(row.get("word") or step_word(str(row.get("status", "waiting"))))
        detail = status
        total = row.get("tasks_total")
        if step.get("map") and total is not None:
            detail = f"{int(row.get('tasks_ok') or 0) + int(row.get('tasks_degraded') or 0)}/{total} {status}"
        join = step.get("join") or {}
        policy = str(join.get("kind", "")) if len(step["after"]) > 1 else None
        label = name if len(name) <= 20 else name[:19] + "…"
        nodes.append(Node(name, status, *where[name], label, detail, policy or None))
    edges = [(where[u][0] + NODE_W, where[u][1] + NODE_H / 2, where[s["name"]][0],
              where[s["name"]][1] + NODE_H / 2) for s in spec_steps for u in s["after"] if u in where]
    width = PAD * 2 + (max(columns, default=0) + 1) * NODE_W + max(columns, default=0) * COL_GAP
    return Dag(nodes, edges, width, height)


# -- the Gantt timeline --------------------------------------------------------------------------

LABEL_W, CHART_W, ROW_H, AXIS_H = 190, 760, 22, 28


@dataclass(frozen=True)
class Bar:
    y: float
    x: float
    w: float
    step: str
    attempt: int
    outcome: str
    label: str
    title: str
    took: str
    straggler: bool  # its step was a straggler of a join
    generation: int = 1  # > 1: an attempt of a repair's or a redrive's run (the Nth run)


@dataclass(frozen=True)
class Band:
    """A join's fan-in wait: from its first branch ending to the join firing (or now)."""

    join: str
    y: float
    x: float
    w: float
    wait: float
    straggler: str | None
    waiting: bool
    text: str


@dataclass(frozen=True)
class WaitBar:
    """A durable wait (event, timer, child) drawn from its arming to its wake, or to now."""

    step: str
    kind: str
    y: float
    x: float
    w: float
    waiting: bool  # still waiting
    text: str


@dataclass(frozen=True)
class Gantt:
    bars: list[Bar]
    bands: list[Band]
    ticks: list[tuple[float, str]]  # x, label
    width: float
    height: float
    span: float  # seconds shown
    window: float | None = None  # x of the execution's deadline_at when it falls on the chart
    waits: tuple[WaitBar, ...] = ()
    label_w: int = LABEL_W
    row_h: int = ROW_H
    axis_h: int = AXIS_H


def nice_step(span: float, target: int = 8) -> float:
    """A round tick interval that cuts ``span`` seconds into about ``target`` parts."""
    raw = max(span / target, 1e-3)
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 5.0, 10.0) if m * power >= raw)


def gantt(attempts: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]],
          origin: datetime, now: datetime, deadline_at: datetime | None = None,
          waits: Sequence[Any] = (), finished: bool = False) -> Gantt:
    """One row per attempt (running ones end at ``now``), then one band per join that has seen a
    branch end, then one bar per durable wait (``waits``: :class:`konduit.web.why.WaitSpan`);
    x is seconds since ``origin`` (the execution's start). ``finished``: the execution has
    ended (``now`` is its end), so what had not fired or ended never will ("so far" otherwise)."""
    unfired, unended = (", never fired", ", never ended") if finished else (" so far", " so far")
    joins = sorted((s for s in steps if int(s["up_total"]) > 1 and s["first_upstream_at"]),
                   key=lambda s: s["first_upstream_at"])
    ends = [a["finished_at"] or now for a in attempts] + [s["fired_at"] or now for s in joins] \
        + [w.ended_at or now for w in waits]
    span = max([between(origin, e) or 0.0 for e in ends] + [0.001])
    scale = CHART_W / span

    def x(moment: datetime) -> float:
        return LABEL_W + max(0.0, (moment - origin).total_seconds()) * scale

    stragglers = {s["straggler"] for s in joins if s["straggler"]}
    bars = []
    for i, a in enumerate(attempts):
        end = a["finished_at"] or now
        outcome = a["outcome"] or "running"
        took = between(a["started_at"], end)
        where = a["step"] + (f"[{a['map_index']}]" if a["map_index"] else "")
        # A collapsed map step comes as one row with its own label (see summaries.map_bars).
        generation = int(a.get("generation") or 1)
        # Generation 2 and later: the run of a repair or a redrive.
        rerun = f" gen {generation}" if generation > 1 else ""
        label = a.get("label") or f"{where} #{a['attempt']}{rerun}"
        what = a.get("what") or f"{where} attempt {a['attempt']}{rerun}"
        title = f"{what}: {outcome} after {secs(took)}"
        if a["error"]:
            title += f" ({last_line(a['error'])})"
        bars.append(Bar(AXIS_H + i * ROW_H, x(a["started_at"]), max(2.0, x(end) - x(a["started_at"])),
                        a["step"], int(a["attempt"]), outcome, label, title,
                        secs(took), a["step"] in stragglers, generation))
    bands = []
    for j, s in enumerate(joins, start=len(attempts)):
        fired = s["fired_at"]
        wait = between(s["first_upstream_at"], fired or now) or 0.0
        who = f", straggler: {s['straggler']}" if s["straggler"] else ""
        text = f"fan-in wait {secs(wait)}{unfired if fired is None else ''}{who}"
        left = x(s["first_upstream_at"])
        bands.append(Band(s["step"], AXIS_H + j * ROW_H, left, max(2.0, x(fired or now) - left),
                          wait, s["straggler"], fired is None, text))
    step = nice_step(span)
    ticks = [(LABEL_W + k * step * scale, f"{k * step:.4g}s" if k * step < 60 else secs(k * step))
             for k in range(int(span / step + 1e-9) + 1)]
    to_window = between(origin, deadline_at)
    window = x(deadline_at) if deadline_at and to_window is not None and 0 <= to_window <= span else None
    wait_bars = []
    for k, w in enumerate(waits, start=len(attempts) + len(bands)):
        left = x(w.started_at)
        took = between(w.started_at, w.ended_at or now)
        text = f"waits for {w.what}: {secs(took)}{unended if w.ended_at is None else ''}"
        wait_bars.append(WaitBar(w.step, w.kind, AXIS_H + k * ROW_H, left,
                                 max(2.0, x(w.ended_at or now) - left), w.ended_at is None, text))
    rows = len(attempts) + len(bands) + len(wait_bars)
    return Gantt(bars, bands, ticks, LABEL_W + CHART_W + 16, AXIS_H + rows * ROW_H + 8, span,
                 window, tuple(wait_bars))


def unsealed(value: Any) -> Any:
    """``value`` with each payload envelope this server could not open (it lacks the codec's
    keys, or the payload store) shown as what it is: ``"encrypted (key k1)"``, never its bytes
    (docs/payload-codecs.md)."""
    if is_sealed(value):
        return sealed_words(value)
    if type(value) is dict:
        return {k: unsealed(v) for k, v in value.items()}
    if type(value) is list:
        return [unsealed(v) for v in value]
    return value
