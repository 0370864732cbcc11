"""What the execution page says about *why* each unfinished step is where it is.

For a waiting step: the event's name, key and deadline, the timer's time, or the child
execution; for a running one: its worker, how long ago that worker was heard from, the attempt,
and the step's usual p95 (from the stats of recent executions) beside its elapsed time; for one
in backoff: when it tries again (and a "retry now"). Pure: the page loads the rows
(``Client.open_tasks``, ``Client.stats``) and this turns them into what the template shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.waits import is_input_event
from konduit.core.words import step_word
from konduit.reads import ReadModel
from konduit.records import OpenTask

OPEN = ("ready", "running", "waiting")


@dataclass(frozen=True)
class Why:
    """One unfinished task of a step, as the page explains it."""

    step: str
    word: str  # pending, ready, retrying, running, waiting (konduit.core.words)
    task_id: int
    map_index: int
    attempt: int
    max_attempts: int
    wait_kind: str | None = None
    event: str | None = None
    key: str | None = None
    until: datetime | None = None  # a timer's time
    child: UUID | None = None
    received: bool = False  # the event came and is being applied
    deadline_at: datetime | None = None
    worker: str | None = None  # host:pid of the worker running it
    heartbeat_age: float | None = None
    elapsed: float | None = None  # seconds the running attempt has run
    usual_p95: float | None = None  # the step's p95 over recent executions
    retry_at: datetime | None = None  # backoff: the next try


def task_word(task: OpenTask) -> str:
    return "retrying" if task.in_backoff else task.status


def explain(tasks: Iterable[OpenTask], p95: Mapping[str, float | None], now: datetime) -> list[Why]:
    """One :class:`Why` per unfinished task (a map step's items: the first few only)."""
    shown: dict[str, int] = {}
    found = []
    for t in tasks:
        if t.status not in OPEN:
            continue
        shown[t.step] = shown.get(t.step, 0) + 1
        if shown[t.step] > 3:  # a map's items: its row on the page has the counts
            continue
        word = task_word(t)
        found.append(Why(
            step=t.step, word=word, task_id=t.id, map_index=t.map_index, attempt=t.attempt,
            max_attempts=t.max_attempts, wait_kind=t.wait_kind if word == "waiting" else None,
            event=t.wait_event, key=t.wait_key,
            until=t.wait_until if t.wait_kind == "timer" else None,
            child=t.wait_child, received=t.wait_kind == "event" and t.wait_until is not None,
            deadline_at=t.deadline_at,
            worker=None if t.worker_hostname is None else f"{t.worker_hostname}:{t.worker_pid}",
            heartbeat_age=t.heartbeat_age if word == "running" else None,
            elapsed=(now - t.started_at).total_seconds()
            if word == "running" and t.started_at else None,
            usual_p95=p95.get(t.step), retry_at=t.run_at if word == "retrying" else None))
    return found


def step_words(steps: Sequence[Mapping[str, Any]], tasks: Iterable[OpenTask]) -> dict[str, str]:
    """step -> the word shown for it (konduit.core.words.step_word)."""
    open_by_step: dict[str, list[tuple[str, bool]]] = {}
    for t in tasks:
        if t.status in OPEN:
            open_by_step.setdefault(t.step, []).append((t.status, t.in_backoff))
    return {s["step"]: step_word(str(s["status"]), open_by_step.get(s["step"], ()))
            for s in steps}


@dataclass(frozen=True)
class WaitSpan:
    """A durable wait on the timeline: from the arming attempt's end to the wake (or now)."""

    step: str
    kind: str
    started_at: datetime
    ended_at: datetime | None
    what: str  # event 'x' key 'y', timer, child ...


def wait_spans(tasks: Iterable[OpenTask]) -> list[WaitSpan]:
    spans = []
    for t in tasks:
        if t.wait_kind is None or t.waiting_since is None:
            continue
        if t.wait_kind == "event":
            what = ("a person's answer" if is_input_event(t.wait_event) else
                    f"event {t.wait_event!r}" + (f" key {t.wait_key!r}" if t.wait_key else ""))
        elif t.wait_kind == "timer":
            what = "timer"
        else:
            what = f"child {t.wait_child}"
        spans.append(WaitSpan(t.step, t.wait_kind, t.waiting_since,
                              None if t.status == "waiting" else t.finished_at, what))
    return sorted(spans, key=lambda s: s.started_at)


@dataclass(frozen=True)
class Reasons:
    """What the execution page adds about its unfinished steps."""

    words: dict[str, str]  # step -> the word shown
    whys: list[Why]
    waits: list[WaitSpan]

    def of(self, step: str) -> list[Why]:
        return [w for w in self.whys if w.step == step]


async def load_reasons(model: ReadModel, result: Any, steps: Sequence[Mapping[str, Any]],
                       now: datetime, *, with_p95: bool = True) -> Reasons:
    """Read the open tasks of ``result`` (and, when one runs, its workflow's recent p95s; not
    for the page's polls, every 2 s: the stats read a day of attempts)."""
    tasks = await model.open_tasks(result.id)
    p95: dict[str, float | None] = {}
    if with_p95 and any(t.status == "running" for t in tasks):
        stats = await model.stats(result.workflow)
        p95 = {b.step: b.p95 for b in stats.branches if b.workflow == result.workflow}
    return Reasons(step_words(steps, tasks), explain(tasks, p95, now), wait_spans(tasks))
