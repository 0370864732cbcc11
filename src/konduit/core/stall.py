"""Why a stalled execution cannot move, and which fan-in decisions would move it (pure).

A running execution is *stalled* when none of its tasks is ready, running or waiting, yet not
every step ended: nothing will ever call the fan-in decision again (a silent stall, whatever
its cause: a lost decision, a manual edit, a restored backup). The watchdog
(:mod:`konduit.engine.stalls`) then reads the execution's join state and the tasks of its
current generation under the execution lock, and :func:`diagnose` compares the two:

- a task that **ended** while its step's counters still count it pending is an end whose
  fan-in decision never ran: the data decides it, so it is replayed as a :class:`TaskEnded`
  event through the ordinary decision (:func:`konduit.core.advance.advance`), which fires the
  join exactly once (the step's counters stop a second replay: a duplicate end is ignored);
- a step that waits for tasks that neither exist nor can run, a map step that fired without
  items, a join whose counters disagree with its upstream steps: the data cannot say what
  should have happened, so those are the reasons an open ``execution_stalled`` alert gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from konduit.core.advance import (
    FAILURE_OUTCOMES,
    OUTCOMES,
    StepState,
    TaskEnded,
    join_verdict,
)
from konduit.core.model import Outcome, StepStatus, TaskStatus
from konduit.core.workflow import WorkflowSpec


@dataclass(frozen=True)
class EndedTasks:
    """Tasks of one step (current generation) in one status: a row of the tasks' tally."""

    step: str
    status: TaskStatus
    count: int
    routes: tuple[str, ...] | None = None
    finished_at: datetime | None = None


@dataclass
class Diagnosis:
    """What :func:`diagnose` found."""

    replay: list[tuple[TaskEnded, datetime | None]] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)  # the replayed ends, in words
    reasons: list[str] = field(default_factory=list)  # what the data cannot decide

    @property
    def decidable(self) -> bool:
        """True when replaying the uncounted ends is all the execution needs."""
        return bool(self.replay) and not self.reasons


def _group(status: str) -> Outcome:
    if status == Outcome.SUCCEEDED:
        return Outcome.SUCCEEDED
    if status == Outcome.DEGRADED:
        return Outcome.DEGRADED
    if status in FAILURE_OUTCOMES:
        return Outcome.FAILED
    return Outcome.SKIPPED


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def diagnose(spec: WorkflowSpec, states: Mapping[str, StepState],
             tasks: Sequence[EndedTasks]) -> Diagnosis:
    """Compare the join state of a stalled execution (``states``, by step) with its ended tasks
    (``tasks``: only terminal statuses count; call it when no task is ready, running or
    waiting) and say which ends to replay and what cannot be decided."""
    found = Diagnosis()
    ended: dict[str, list[EndedTasks]] = {}
    for row in tasks:
        if row.status in OUTCOMES and row.count > 0:
            ended.setdefault(row.step, []).append(row)
    for name in spec.order:
        st = states.get(name)
        if st is None:
            found.reasons.append(f"step {name!r} has no join state")
        elif st.status == StepStatus.ACTIVE:
            _active(name, st, ended.get(name, []), found)
        elif st.status == StepStatus.WAITING and spec[name].after:
            _waiting(spec, name, st, states, found)
    return found


def _active(name: str, st: StepState, rows: list[EndedTasks], found: Diagnosis) -> None:
    if st.tasks_total is None:
        found.reasons.append(f"map step {name!r} fired, but its items were never counted")
        return
    counted_ends = st.tasks_total - st.tasks_pending
    # What the counters already hold, per kind of end (as advance() counts them).
    counted = {Outcome.SUCCEEDED: st.tasks_ok - st.tasks_degraded,
               Outcome.DEGRADED: st.tasks_degraded, Outcome.FAILED: st.tasks_failed,
               Outcome.SKIPPED: counted_ends - st.tasks_ok - st.tasks_failed}
    budget = st.tasks_pending
    replayed = 0
    by_group: dict[Outcome, list[EndedTasks]] = {}
    for row in rows:
        by_group.setdefault(_group(row.status), []).append(row)
    for group, group_rows in by_group.items():
        uncounted = sum(r.count for r in group_rows) - counted[group]
        for row in group_rows:
            extra = min(row.count, uncounted, budget)
            if extra <= 0:
                continue
            routes = None if row.routes is None else frozenset(row.routes)
            ended = TaskEnded(name, Outcome(row.status), routes)
            found.replay += [(ended, row.finished_at)] * extra
            found.replayed.append(f"{_plural(extra, 'task')} of step {name!r} ended "
                                  f"{row.status} without its fan-in decision")
            uncounted -= extra
            budget -= extra
            replayed += extra
    missing = st.tasks_pending - replayed
    if missing > 0:
        found.reasons.append(
            f"step {name!r} waits for {_plural(missing, 'task')} that neither exist nor can run "
            f"(none is ready, running or waiting, none ended uncounted)")


def _waiting(spec: WorkflowSpec, name: str, st: StepState, states: Mapping[str, StepState],
             found: Diagnosis) -> None:
    after = spec[name].after
    if st.up_pending == 0:
        verdict = join_verdict(spec, name, st)
        found.reasons.append(f"join {name!r}: every upstream step ended and its policy says "
                             f"{verdict!r}, but the step still waits")
        return
    upstream = [states.get(u) for u in after]
    if all(u is not None and u.status in OUTCOMES for u in upstream):
        found.reasons.append(
            f"join {name!r} still counts {_plural(st.up_pending, 'upstream step')} pending, but "
            f"all of {', '.join(repr(u) for u in after)} ended")

