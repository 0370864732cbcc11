"""The fan-in alert rule, pure: a join whose fan-in wait exceeded a threshold in each of its
last executions (``konduit stats`` shows it, :mod:`konduit.engine.alerting` raises it as the
``fan_in_wait`` alert, :mod:`konduit.observe.stats` reads the waits for the stats).

A branch that is a durable wait (an event, a timer, a child workflow: a step of
``wf.wait_for_event``, ``wf.sleep``, ``wf.subworkflow``) or that runs behind one is no straggler:
a join waiting for a person's approval waits as designed. :func:`split_wait` splits a fan-in
wait into the part its other branches held it (the one the rule judges) and the part it waited
on durable waits alone (shown, never paging). The threshold may be set per workflow
(``Workflow(alert_fan_in_wait=)``) and per join (``Join.all_succeeded(alert_fan_in_wait=)``),
as policy in the stored definition (:func:`fan_in_threshold`), so a reader without the code
knows them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from konduit.core.durations import Duration, format_duration, format_elapsed, parse_duration
from konduit.errors import KonduitError, StatsError, blamed

DEFAULT_HISTORY = "24h"
"""How far back fan-in waits are read by default."""


@dataclass(frozen=True)
class Wait:
    """One execution's fan-in wait at one join, in seconds."""

    seconds: float
    straggler: str | None = None  # the branch that ended last before the join fired
    waiting: bool = False  # the join has not fired yet: ``seconds`` is the wait so far
    execution_id: str | None = None
    # The part of the wait spent on durable waits alone (not in ``seconds``, never judged), and
    # the durable branch (a wait step, or a step behind one) that ended last or still holds it.
    durable_seconds: float = 0.0
    durable: str | None = None


@dataclass(frozen=True)
class Alert:
    """A join whose fan-in wait exceeded the threshold in each of its last executions."""

    workflow: str
    join: str
    waits: tuple[Wait, ...]  # the last executions' waits, oldest first
    threshold: float

    @property
    def straggler(self) -> str | None:
        """The most recent straggler known (a join still waiting has none yet)."""
        return next((w.straggler for w in reversed(self.waits) if w.straggler), None)

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "join": self.join, "waits": [w.seconds for w in self.waits],
                "straggler": self.straggler, "still_waiting": self.waits[-1].waiting,
                "executions": [w.execution_id for w in self.waits],
                "threshold_seconds": self.threshold,
                # The time the join waited on durable waits alone, beside each judged wait.
                "durable_waits": [w.durable_seconds for w in self.waits],
                "durable": next((w.durable for w in reversed(self.waits) if w.durable), None)}

    def describe(self) -> str:
        waits = ", ".join(format_elapsed(w.seconds) + (" so far" if w.waiting else "")
                          for w in self.waits)
        straggler = f"; straggler: {self.straggler}" if self.straggler else ""
        durable = [w for w in self.waits if w.durable_seconds > 0]
        if durable:
            straggler += (f"; not counted: {', '.join(format_elapsed(w.durable_seconds) for w in durable)} "
                          f"waiting on durable waits ({durable[-1].durable})")
        return (f"{self.workflow}/{self.join}: fan-in wait above {format_duration(self.threshold)} "
                f"in the last {len(self.waits)} execution(s) ({waits}){straggler}")


def durable_steps(spec: Mapping[str, Any]) -> frozenset[str]:
    """The steps of a stored definition (``spec_json``) that are durable waits or run behind
    one (downstream of a wait step, however far)."""
    steps = list(spec.get("steps") or ())
    durable = {s["name"] for s in steps if s.get("wait")}
    grew = True
    while grew:  # the stored steps are in topological order: one pass, but stay safe
        grew = False
        for s in steps:
            if s["name"] not in durable and any(u in durable for u in s.get("after") or ()):
                durable.add(s["name"])
                grew = True
    return frozenset(durable)


def upstream_of(spec: Mapping[str, Any], join: str) -> tuple[str, ...]:
    """The upstream steps of ``join`` in a stored definition (none when it has no such step)."""
    for s in spec.get("steps") or ():
        if s["name"] == join:
            return tuple(s.get("after") or ())
    return ()


def fan_in_threshold(spec: Mapping[str, Any], join: str, default: float) -> float:
    """The fan-in wait threshold of ``join``: its own (``Join.*(alert_fan_in_wait=)``), else its
    workflow's (``Workflow(alert_fan_in_wait=)``), else ``default`` (the worker's)."""
    for s in spec.get("steps") or ():
        if s["name"] == join and s.get("alert_fan_in_wait") is not None:
            return float(s["alert_fan_in_wait"])
    own = spec.get("alert_fan_in_wait")
    return default if own is None else float(own)


def thresholds_of(specs: Iterable[Mapping[str, Any]]) -> list[float]:
    """Every threshold some definitions set (per workflow and per join)."""
    found = []
    for spec in specs:
        if spec.get("alert_fan_in_wait") is not None:
            found.append(float(spec["alert_fan_in_wait"]))
        found += [float(s["alert_fan_in_wait"]) for s in spec.get("steps") or ()
                  if s.get("alert_fan_in_wait") is not None]
    return found


def split_wait(wait: Wait, upstream: Sequence[str], ends: Mapping[str, float | None],
               durable: AbstractSet[str]) -> Wait:
    """``wait`` with the part its durable branches held it alone taken out of ``seconds``.

    ``upstream``: the join's branches; ``ends``: when each step ended, in seconds after the
    join's first branch ended (None: not yet); ``durable``: the steps that are durable waits or
    behind one. The judged part runs to the end of the last other branch (to now while one still
    runs), never past the wait; the rest waited on durable waits alone. A join without a
    durable branch keeps its wait as it is."""
    held = [u for u in upstream if u in durable]
    if not held:
        return wait
    part, last = 0.0, None
    for u in upstream:
        if u in durable:
            continue
        end = ends.get(u)
        if end is None:
            if not wait.waiting:
                continue  # the join fired without it (a quorum): it held nothing
            end = wait.seconds
        end = min(max(end, 0.0), wait.seconds)
        if last is None or end >= part:
            part, last = end, u
    latest, durable_branch = -1.0, None
    for u in held:
        end = ends.get(u)
        if end is None and wait.waiting:
            end = wait.seconds
        if end is not None and end >= latest:
            latest, durable_branch = end, u
    rest = max(0.0, wait.seconds - part)
    return Wait(part, last if part > 0 else None, wait.waiting, wait.execution_id,
                durable_seconds=rest, durable=durable_branch if rest > 0 else None)


def fan_in_alert(waits: Sequence[Wait], *, threshold: float, consecutive: int) -> tuple[Wait, ...] | None:
    """The last ``consecutive`` waits (oldest first, as given) when every one of them exceeded
    ``threshold`` seconds, else None. Fewer executions than ``consecutive`` never alert; one
    fast execution among the last ``consecutive`` resets the count."""
    if consecutive < 1:
        raise blamed(StatsError(f"--consecutive must be at least 1, got {consecutive}"),
                     "consecutive")
    # A join still waiting counts once its wait passed the threshold (until then it is not
    # judged yet); a wait on durable waits alone never passes it.
    waits = [w for w in waits if not (w.waiting and w.seconds <= threshold)]
    last = tuple(waits[-consecutive:])
    if len(last) < consecutive or any(w.seconds <= threshold for w in last):
        return None
    return last


def fan_in_alerts(
    recent: Mapping[tuple[str, str], Sequence[Wait]], *, threshold: float, consecutive: int,
    thresholds: Mapping[tuple[str, str], float] | None = None,
) -> list[Alert]:
    """Apply :func:`fan_in_alert` to every ``(workflow, join)``'s waits (oldest first), with
    the join's own threshold in ``thresholds`` if there is one, else ``threshold``."""
    alerts = []
    for (workflow, join), waits in sorted(recent.items()):
        limit = (thresholds or {}).get((workflow, join), threshold)
        last = fan_in_alert(waits, threshold=limit, consecutive=consecutive)
        if last is not None:
            alerts.append(Alert(workflow, join, last, limit))
    return alerts


def seconds_option(value: Duration, what: str) -> float:
    """A duration option in seconds (a :class:`StatsError` naming it when it is not one; its
    ``field`` is the option's name, ``history`` for ``--history``)."""
    try:
        return parse_duration(value, what=what)
    except KonduitError as exc:
        raise blamed(StatsError(str(exc)), what.lstrip("-").replace("-", "_")) from None
