"""The typed model of a task's attempt: the statuses the schema allows, one attempt at a task,
and how it ended.

Every status and outcome set below is a :class:`enum.StrEnum` whose values are exactly what the
schema's CHECK constraints accept (``db/migrations``; ``tests/test_model.py`` holds them to it).
A member *is* its string (``TaskStatus.READY == "ready"``, same hash, dumped by psycopg and
``json`` as the bare value), so rows read as plain strings compare with members unchanged.

A :class:`TaskAttempt` is built strictly from a row (``row[column]``): a projection that leaves
a column out fails at once instead of handing a handler a silent default. A
:class:`Completion` keeps apart what happens to the task (its :class:`Command`), how it ended
(its :class:`Outcome`, only when it ends) and who writes it under which guard (its
:class:`Transition`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from konduit.core.attempt_logs import AttemptLogs


class ExecutionStatus(enum.StrEnum):
    """``konduit_executions.status``."""

    PENDING = "pending"
    SCHEDULED = "scheduled"  # started with run_at/delay: waits for its time (migration 0024)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class StepStatus(enum.StrEnum):
    """``konduit_steps.status``: waiting (for its join) -> active -> how it ended."""

    WAITING = "waiting"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    DEGRADED = "degraded"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class TaskStatus(enum.StrEnum):
    """``konduit_tasks.status``: ready -> running (leased) [-> waiting] -> how it ended."""

    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    DEGRADED = "degraded"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class Outcome(enum.StrEnum):
    """How a task or a step ended: the terminal statuses of both tables."""

    SUCCEEDED = "succeeded"
    DEGRADED = "degraded"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


class AttemptOutcome(enum.StrEnum):
    """``konduit_attempts.outcome``: how one attempt ended (the task may go on)."""

    SUCCEEDED = "succeeded"
    DEGRADED = "degraded"
    TIMED_OUT = "timed_out"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY = "retry"  # it failed and the task runs again after its backoff
    LOST = "lost"  # its worker died or hung: a rescue ended it
    RELEASED = "released"  # handed back unrun at shutdown: not counted
    OUTRUN = "outrun"  # a hedged task's other attempt finished first
    DROPPED = "dropped"  # it ended without success while the task's other attempt ran on
    WAITING = "waiting"  # an arming attempt: the task waits (event, timer, child)


class OutputSource(enum.StrEnum):
    """``konduit_outputs.source``: where a stored payload came from."""

    HANDLER = "handler"
    FALLBACK = "fallback"
    LATE = "late"  # a handler's result that arrived after its attempt was ended


class WaitKind(enum.StrEnum):
    """``konduit_tasks.wait_kind``: what a waiting task waits for."""

    EVENT = "event"
    TIMER = "timer"
    CHILD = "child"


class DeliveryStatus(enum.StrEnum):
    """``konduit_webhook_deliveries.status``."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    REFUSED = "refused"


class Command(enum.StrEnum):
    """What a completion does to its task. Not stored: only :data:`Command.END` carries an
    :class:`Outcome`; the others move the task (or nothing) and decide nothing about the DAG."""

    END = "end"  # the task ends as the completion's outcome; its join decides
    RETRY = "retry"  # back to ready after the backoff (running -> ready)
    RELEASE = "release"  # back to ready at once, the attempt not counted (shutdown)
    WAIT = "wait"  # the arming attempt ended: running -> waiting
    YIELD = "yield"  # nothing to write: another worker called the task's fallback and ends it


class Transition(enum.StrEnum):
    """Who writes a completion, and so which guard fences it (``engine/transitions.py``)."""

    COMPLETE = "complete"  # the live worker holding the lease (or the hedge's)
    LOSE = "lose"  # a rescue: the lease expired and its worker is gone
    EXPIRE = "expire"  # the deadline sweep
    WAKE = "wake"  # a waiting task's event, timer or child (no lease)


class Recorded(enum.Enum):
    """What recording a completion did."""

    ENDED = "ended"  # outcome recorded and the DAG advanced
    RETRYING = "retrying"  # attempt failed, the task is ready again after its backoff
    RELEASED = "released"  # handed back unrun (shutdown): ready at once, attempt not counted
    LEASE_LOST = "lease_lost"  # the caller no longer held the task: nothing changed
    TOO_LATE = "too_late"  # a retry whose backoff would end past the deadline: nothing changed;
    # the caller ends the task instead (degraded with its fallback, else timed_out)
    DROPPED = "dropped"  # a hedged task's other attempt runs on: only this attempt ended
    WAITING = "waiting"  # an arming attempt: the task waits (event, timer, child), slot freed


MOVES = frozenset({Command.RETRY, Command.RELEASE})
"""Commands that return the task to ready instead of ending it: they decide nothing about the
DAG and take no execution lock."""

_WORDS = {Command.RETRY: "retry", Command.RELEASE: "released", Command.WAIT: "waiting",
          Command.YIELD: "yielded"}


@dataclass(frozen=True)
class Completion:
    """How one attempt ended, addressed to its task and fenced by its lease.

    Values given as plain strings (rows, tests) are made members here; an unknown one raises."""

    task_id: int
    lease_token: UUID | None  # None only for the deadline sweep of a ready task and wakes
    execution_id: UUID
    step: str
    map_index: int
    attempt: int
    command: Command = Command.END
    outcome: Outcome | None = None  # how the task ends: set exactly when command is END
    payload_json: str | None = None  # canonical JSON of the output (succeeded/degraded)
    payload: Any = None  # the output; for WAIT, the :class:`~konduit.core.waits.Armed`
    error: str | None = None
    retry_delay: float = 0.0
    age_seconds: float = 0.0  # how long ago the handler ended, so timings use the DB clock
    attempt_outcome: AttemptOutcome | None = None  # the attempt's, when not `outcome` ("lost")
    routes: tuple[str, ...] | None = None  # downstream steps the handler chose (Route)
    source: OutputSource = OutputSource.HANDLER  # where the payload came from
    transition: Transition = Transition.COMPLETE
    guard_seconds: float = 0.0  # lose: the lease the server must have been up for; expire: grace
    # lose and expire: set when this completion did not run the task's fallback; then it ends
    # no task whose fallback another worker started less than this many seconds ago.
    fallback_settle: float | None = None
    # What the handler logged during the attempt (konduit.core.attempt_logs): None, or empty,
    # when it logged nothing; stored with the attempt's end in the same transaction.
    logs: AttemptLogs | None = None
    # The (name, version) of the workflow the task was claimed under, when the completion comes
    # from an attempt (TaskAttempt.completion): a round reads the join state it will need in its
    # first round trip, before the execution row says which workflow it runs.
    workflow: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if (self.command == Command.END) != (self.outcome is not None):
            raise ValueError(f"a completion that ends its task needs an outcome, and only "
                             f"one that does has one (command {self.command}, outcome "
                             f"{self.outcome})")
        # Members pass as they are (the usual case, and a hot path); strings become members.
        for name, kind in _TYPED:
            value = getattr(self, name)
            if value is not None and type(value) is not kind:
                object.__setattr__(self, name, kind(value))

    @property
    def ends(self) -> bool:
        """Whether this completion ends its task (and so decides its join)."""
        return self.command is Command.END

    @property
    def word(self) -> str:
        """One word for logs and traces: the outcome, else what happened instead (retry,
        released, waiting, yielded)."""
        return _WORDS[self.command] if self.outcome is None else str(self.outcome)


_TYPED: tuple[tuple[str, type[enum.StrEnum]], ...] = (
    ("command", Command), ("outcome", Outcome), ("attempt_outcome", AttemptOutcome),
    ("source", OutputSource), ("transition", Transition))


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt at a task as the runtime holds it: a task a worker claimed (its lease) or
    hedged (the hedge's lease), or one a rescue, the deadline sweep or a wake ends."""

    id: int  # the task's
    execution_id: UUID
    step: str
    map_index: int
    item: Any
    attempt: int
    max_attempts: int
    lease_token: UUID | None  # None: no lease (a ready or waiting task a sweep or wake ends)
    queue: str
    workflow_name: str
    workflow_version: int
    input: Any
    deadline_remaining: float | None = None  # seconds of the task's budget left when read
    generation: int = 1
    scheduled_at: datetime | None = None  # the execution's schedule tick, if a schedule started it
    hedged: bool = False  # a hedge: the second attempt of a straggling task (its own lease)
    # Seconds since the task's fallback was started (None: never). Read by the sweeps: a task
    # whose fallback was started is ended without calling it again (core.outcome.decide).
    fallback_age: float | None = None
    # The revision of its version's policy its creator applied (None: created before migration
    # 0022); a worker on another revision decides its outcomes by that one (worker/created_with).
    policy_revision: int | None = None

    @property
    def fallback_tried(self) -> bool:
        """Whether the task's fallback was started already (by whichever worker)."""
        return self.fallback_age is not None

    @property
    def key(self) -> int:
        """This attempt among a worker's running ones: the task id, negated for a hedge (a
        worker may run a task's primary attempt and its hedge side by side)."""
        return -self.id if self.hedged else self.id

    def completion(self, what: Outcome | Command, **fields: Any) -> Completion:
        """This attempt's end: the task ends as ``what`` (an :class:`Outcome`), or ``what`` is
        the :class:`Command` that moves it instead."""
        if type(what) is Outcome:  # the usual case, without the enum's lookup
            command, outcome = Command.END, what
        elif isinstance(what, Command):
            command, outcome = what, None
        else:
            command, outcome = Command.END, Outcome(what)
        return Completion(
            task_id=self.id,
            lease_token=self.lease_token,
            execution_id=self.execution_id,
            step=self.step,
            map_index=self.map_index,
            attempt=self.attempt,
            command=command,
            outcome=outcome,
            workflow=(self.workflow_name, self.workflow_version),
            **fields,
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskAttempt:
        """The attempt a claimed-row projection describes; every column is required."""
        return cls(
            id=row["id"],
            execution_id=row["execution_id"],
            step=row["step"],
            map_index=row["map_index"],
            item=row["item"],
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            lease_token=row["lease_token"],
            queue=row["queue"],
            workflow_name=row["workflow_name"],
            workflow_version=row["workflow_version"],
            input=row["input"],
            deadline_remaining=row["deadline_remaining"],
            generation=row["generation"],
            scheduled_at=row["scheduled_at"],
            hedged=bool(row["hedged"]),
            fallback_age=row["fallback_age"],
            policy_revision=row["policy_revision"],
        )
