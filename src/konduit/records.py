"""The typed records the methods of :class:`konduit.App`, :class:`konduit.Client` and
:class:`konduit.AsyncClient` return.

Each is a frozen dataclass whose fields carry the names the dict rows of earlier releases had,
so JSON built from them keeps its shape. A record is read by attribute (``task.status``).

Reading one like a dict (``task["status"]``, ``record.get("status")``, ``dict(record)``) still
works for this release, with a :class:`DeprecationWarning`, so code written against the dict
rows keeps running while it moves to attributes; it goes in the next release.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime
from typing import Any, Self
from uuid import UUID

from konduit.core.payloads import is_sealed

# The records (``plain`` is the JSON faces' helper, not part of the API).
__all__ = [
    "AlertRecord",
    "AttemptLog",
    "AttemptRecord",
    "BulkResult",
    "ChildExecution",
    "DeadLetter",
    "DeadLetterWithStatus",
    "ExecutionFound",
    "ExecutionProgress",
    "ExecutionRecord",
    "ExecutionSummary",
    "FailedAttempt",
    "JournalEntry",
    "MapItem",
    "MapStepCounts",
    "MigrationRecord",
    "OpenAttempt",
    "OpenTask",
    "OutputVersion",
    "ParentLink",
    "Payload",
    "QueueDepth",
    "QueueLoad",
    "Record",
    "ScheduleRecord",
    "StepBudget",
    "StepMark",
    "StepRecord",
    "StreamChunk",
    "StreamRecord",
    "TaskPolicy",
    "TaskRecord",
    "TriggerRecord",
    "VersionState",
    "WebhookDelivery",
    "WorkerRecord",
    "WorkerState",
    "WorkflowRecord",
]


@dataclass(frozen=True)
class Record:
    """What every record shares: built from a row by field name, turned back into a dict."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """The record of a row read by the statement it belongs to (extra columns ignored)."""
        record = object.__new__(cls)
        # row[...] rather than row.get: a query that lost a column must fail here, loudly,
        # not hand out a silent None (that bug class was once found in the claim projection).
        # Straight into __dict__: a frozen dataclass's __init__ sets each field through
        # object.__setattr__, which made a 300-task read 1.7x slower than the dict rows.
        record.__dict__.update({name: row[name] for name in _field_names(cls)})
        return record

    def to_dict(self) -> dict[str, Any]:
        """The fields as a (shallow) dict: what ``dict(row)`` gave in earlier releases."""
        return {name: self.__dict__[name] for name in _field_names(type(self))}

    # -- the dict face, deprecated (one release) ------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        _deprecated(type(self), key)
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        _deprecated(type(self), key)
        return getattr(self, key) if key in self._names() else default

    def keys(self) -> list[str]:
        # dict(record) reads keys() then record[key]: kept working with the warning above.
        return list(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return _field_names(cls)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    # Read once per class: dataclasses.fields() costs more than building a small record.
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names


def _deprecated(kind: type, key: str) -> None:
    warnings.warn(f"{kind.__name__}[{key!r}] is deprecated: read the attribute "
                  f"(.{key}); records stop being dicts in the next release",
                  DeprecationWarning, stacklevel=3)


def plain(value: Any) -> Any:
    """``value`` with records (and other dataclasses) turned into dicts, for ``json.dumps``."""
    if isinstance(value, Record):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        to_json = getattr(value, "to_json", None)
        if callable(to_json):
            return to_json()
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return value


# -- executions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskRecord(Record):
    """One task of an execution (every generation, so repairs show too)."""

    id: int
    step: str
    map_index: int
    generation: int
    status: str
    attempt: int
    max_attempts: int
    worker_id: str | None
    error: str | None
    routes: list[str] | None
    deadline_seconds: float | None
    deadline_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    run_at: datetime | None
    wait_kind: str | None
    wait_event: str | None
    wait_key: str | None
    wait_until: datetime | None
    wait_child: UUID | None


@dataclass(frozen=True)
class OpenTask(Record):
    """Why a step of an execution is where it is: an unfinished task (ready, in backoff,
    running on a worker, waiting) or one that made a durable wait, for the execution page."""

    id: int
    step: str
    map_index: int
    generation: int
    status: str
    attempt: int
    max_attempts: int
    worker_id: str | None
    run_at: datetime | None
    deadline_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    wait_kind: str | None  # event, timer or child
    wait_event: str | None
    wait_key: str | None
    wait_until: datetime | None  # a timer's time; for an event, when it was received
    wait_child: UUID | None
    waiting_since: datetime | None  # when its arming attempt ended
    worker_hostname: str | None  # the worker running it, when it runs
    worker_pid: int | None
    heartbeat_age: float | None  # seconds since that worker was heard from
    in_backoff: bool  # ready again after a failed attempt, not before run_at

@dataclass(frozen=True)
class QueueLoad(Record):
    """Unfinished tasks of one queue and workflow version (``name@version``): ready (``due``:
    not waiting out a backoff), running, waiting durably, and the oldest due one's wait."""

    queue: str
    workflow: str
    ready: int
    due: int
    running: int
    waiting: int
    oldest_age: float | None

@dataclass(frozen=True)
class StepRecord(Record):
    """One step of an execution: its status, join counters and timings (fan-in wait)."""

    step: str
    status: str
    up_total: int
    up_pending: int
    up_ok: int
    up_failed: int
    up_skipped: int
    tasks_total: int | None
    tasks_pending: int
    tasks_ok: int
    tasks_degraded: int
    tasks_failed: int
    first_upstream_at: datetime | None
    last_upstream_at: datetime | None
    straggler: str | None
    fired_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True)
class OutputVersion(Record):
    """One version of an execution's output (a repair adds one)."""

    version: int
    status: str
    output: Any
    degraded: list[str]
    created_at: datetime


@dataclass(frozen=True)
class Payload(Record):
    """One payload a task produced: from the handler, its fallback, or late (``source``)."""

    step: str
    map_index: int
    content_hash: str
    payload: Any
    source: str
    created_at: datetime
    current: bool


@dataclass(frozen=True)
class DeadLetter(Record):
    """A task that failed for good and that no repair re-ran."""

    id: int
    execution_id: UUID
    workflow_name: str
    step: str
    map_index: int
    attempt: int
    error: str | None
    finished_at: datetime | None


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRecord(Record):
    """A live worker; ``heartbeat_age`` in seconds; ``leader``: it runs its deployment's
    maintenance."""

    id: str
    hostname: str
    pid: int
    concurrency: int
    queues: list[str]
    workflows: list[str]
    isolation: str
    running: int
    abandoned: int
    started_at: datetime
    last_heartbeat_at: datetime
    lease_seconds: float
    heartbeat_age: float
    leader: bool
    """It runs the maintenance of its deployment (one elected worker: docs/scaling.md)."""


@dataclass(frozen=True)
class ScheduleRecord(Record):
    """A stored schedule, its next tick, and the execution of its latest started tick."""

    name: str
    workflow_name: str
    workflow_version: int
    cron: str | None
    every_seconds: float | None
    timezone: str | None
    missed: str
    window_seconds: float | None
    input: Any
    paused: bool
    paused_at: datetime | None
    last_tick: datetime
    last_execution_id: UUID | None
    last_status: str | None
    last_scheduled_at: datetime | None
    last_started_at: datetime | None
    created_at: datetime
    updated_at: datetime
    schedule: str
    """The timing in words (``cron 0 5 * * * Europe/Berlin``, ``every 10s``)."""
    next_tick: datetime | None
    behind: bool
    """Ticks are due that no worker started for longer than they may be late."""


@dataclass(frozen=True)
class TriggerRecord(Record):
    """A stored event trigger (``wf.on_event``) and what it is doing now."""

    workflow_name: str
    workflow_version: int
    event: str
    mode: str
    """``start`` (one execution per event), ``debounce`` or ``batch``."""
    description: str
    """Its settings in words (``debounced 5s; keyed``)."""
    open_groups: int
    """Bursts or batches gathering events now."""
    pending: int
    """Events waiting for a worker with the workflow's code to apply them."""
    last_event_at: datetime | None


@dataclass(frozen=True)
class OpenInput(Record):
    """A ``wait_for_input`` step waiting for a person's answer: one row of the inbox."""

    execution_id: UUID
    workflow_name: str
    workflow_version: int
    step: str
    waiting_since: datetime | None
    """When its execution reached the step."""
    deadline_at: datetime | None
    """Past it the step takes its fallback (or times out); None: it waits for ever."""
    who: str | None
    """Who may answer, as the step's ``who=`` says (text shown, not a permission)."""
    schema: dict[str, Any]
    """The JSON Schema an answer must match (the step's ``model=``)."""


@dataclass(frozen=True)
class Answer(Record):
    """An answer given to a ``wait_for_input`` step: the value (the step's output), who gave
    it and when it was taken."""

    execution_id: UUID
    step: str
    generation: int
    value: Any
    answered_by: str | None
    answered_at: datetime

    @classmethod
    def from_event_row(cls, row: Mapping[str, Any]) -> Answer:
        """An answer from ``event_list_answers_by_execution``'s row: the event's payload,
        ``{"value": ..., "answered_by": ...}``, or an envelope this process cannot open (its
        value is the envelope then, who answered unknown)."""
        payload = row["payload"]
        opened = isinstance(payload, dict) and not is_sealed(payload)
        return cls(execution_id=row["execution_id"], step=row["step"],
                   generation=row["generation"],
                   value=payload.get("value") if opened else payload,
                   answered_by=payload.get("answered_by") if opened else None,
                   answered_at=row["answered_at"])


@dataclass(frozen=True)
class WebhookDelivery(Record):
    """One webhook delivery of the outbox; ``next_attempt_at`` only while pending."""

    id: UUID
    event: str
    url: str
    status: str
    attempts: int
    last_error: str | None
    last_status_code: int | None
    execution_id: UUID | None
    alert_id: int | None
    created_at: datetime
    last_attempt_at: datetime | None
    delivered_at: datetime | None
    next_attempt_at: datetime | None


# -- what the pages and the API read ------------------------------------------------------------


@dataclass(frozen=True)
class ExecutionSummary(Record):
    """An execution as a list shows it (no input or output)."""

    id: UUID
    workflow_name: str
    workflow_version: int
    status: str
    error: str | None
    idempotency_key: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class ExecutionFound(ExecutionSummary):
    """An execution a search found: a list's columns, with its tags, when it starts (``run_at``:
    None when it started at once) and its priority."""

    tags: dict[str, str] | None
    run_at: datetime | None
    priority: int
    fair_key: str | None = None  # Workflow(fair_by=)'s key of its input (docs/fairness.md)


@dataclass(frozen=True)
class ExecutionRecord(Record):
    """An execution whole: input, output, window, hard limit and output version; its tags, when
    it starts (``run_at``: None when it started at once) and its priority."""

    id: UUID
    workflow_name: str
    workflow_version: int
    status: str
    input: Any
    output: Any
    error: str | None
    idempotency_key: str | None
    steps_pending: int
    deadline_at: datetime | None
    timeout_at: datetime | None
    generation: int
    output_version: int | None
    created_at: datetime
    finished_at: datetime | None
    tags: dict[str, str] | None = None
    run_at: datetime | None = None
    priority: int = 0
    fair_key: str | None = None  # Workflow(fair_by=)'s key of its input (docs/fairness.md)


@dataclass(frozen=True)
class ExecutionProgress(Record):
    """How an execution stands now; ``took`` in seconds (so far, while unfinished)."""

    id: UUID
    status: str
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    took: float


@dataclass(frozen=True)
class StepMark(Record):
    """A step of an execution that degraded or failed (the marks on the executions list)."""

    execution_id: UUID
    step: str
    status: str


@dataclass(frozen=True)
class WorkflowRecord(Record):
    """A registered workflow version; ``spec`` is its stored definition (None when not read)."""

    name: str
    version: int
    spec_hash: str
    spec: Any
    created_at: datetime


@dataclass(frozen=True)
class AttemptRecord(Record):
    """One attempt of a task (the timeline's bars)."""

    task_id: int
    step: str
    map_index: int
    generation: int
    attempt: int
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None
    hedge: bool


@dataclass(frozen=True)
class AttemptLog(Record):
    """What a handler logged during one attempt (``logging`` records and ``ctx.log`` lines),
    bounded per attempt: ``records`` are dicts of ``at`` (seconds since the epoch), ``level``,
    ``logger`` and ``message``; ``dropped`` counts the records past the bounds."""

    step: str
    map_index: int
    generation: int
    attempt: int
    started_at: datetime
    outcome: str | None
    records: list[dict[str, Any]]
    dropped: int


@dataclass(frozen=True)
class JournalEntry(Record):
    """One recorded durable call of an execution (``ctx.call``, docs/journal.md): the step and
    item that made it, its position (``seq``, from 1) and ``name``, the generation and attempt
    that ran it live, how long it took, and how often later attempts replayed it
    (``replays``, the last by ``last_replayed_attempt``). The result itself is stored once per
    execution under ``content_hash``; ``result_bytes`` is its size as JSON."""

    step: str
    map_index: int
    seq: int
    name: str
    generation: int
    attempt: int
    duration_seconds: float
    recorded_at: datetime
    replays: int
    last_replayed_attempt: int | None
    last_replayed_at: datetime | None
    content_hash: str
    result_bytes: int


@dataclass(frozen=True)
class FailedAttempt(Record):
    """An attempt that ended with an error; ``failed_in_step`` counts all of its step's."""

    task_id: int
    step: str
    map_index: int
    generation: int
    attempt: int
    outcome: str | None
    error: str | None
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    failed_in_step: int


@dataclass(frozen=True)
class MapStepCounts(Record):
    """One map step's tasks of one generation: how many in each status, tries, durations."""

    step: str
    generation: int
    tasks: int
    tries: int | None
    ready: int
    running: int
    succeeded: int
    degraded: int
    failed: int
    timed_out: int
    cancelled: int
    skipped: int
    first_started_at: datetime | None
    last_finished_at: datetime | None
    p50: float | None
    p95: float | None
    longest: float | None
    creating: int = 0
    """Items of the step still waiting in chunks to be created (a big map being fanned out):
    ``tasks`` of ``tasks + creating`` exist so far."""


@dataclass(frozen=True)
class MapItem(Record):
    """One item (task) of a map step, with how long it took (so far)."""

    id: int
    map_index: int
    generation: int
    status: str
    attempt: int
    max_attempts: int
    worker_id: str | None
    item: Any
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    took: float | None


@dataclass(frozen=True)
class DeadLetterWithStatus(DeadLetter):
    """A dead letter with its execution's status now (the dead-letters page)."""

    execution_status: str


@dataclass(frozen=True)
class ParentLink(Record):
    """The execution (and its child-workflow step) that started a child execution."""

    execution_id: UUID
    step: str


@dataclass(frozen=True)
class ChildExecution(Record):
    """An execution a child-workflow step started."""

    step: str
    id: UUID
    status: str
    workflow_name: str


@dataclass(frozen=True)
class StepBudget(Record):
    """A step's time budget, and what an execution window cut it from."""

    step: str
    deadline_seconds: float
    deadline_uncut_seconds: float | None
    deadline_reserve_seconds: float | None


@dataclass(frozen=True)
class QueueDepth(Record):
    """Ready tasks of one queue and workflow, how many are due, the oldest due one's wait."""

    queue: str
    workflow: str
    ready: int
    due: int
    oldest_due_at: datetime | None
    oldest_age: float | None


@dataclass(frozen=True)
class WorkerState(WorkerRecord):
    """A worker heard from recently, live or not: ``state`` alive, stopped or dead."""

    stopped_at: datetime | None
    state: str


@dataclass(frozen=True)
class OpenAttempt(Record):
    """An attempt running now, with the worker running it."""

    worker_id: str
    task_id: int
    execution_id: UUID
    step: str
    map_index: int
    attempt: int
    hedge: bool
    started_at: datetime
    running_for: float


@dataclass(frozen=True)
class MigrationRecord(Record):
    """What migrating one running execution to another version of its workflow did
    (:meth:`konduit.App.migrate`). ``migrated`` is False when it was refused (``reason``, and
    the ``step`` at fault when one is) or already at that version (nothing changed)."""

    execution_id: UUID
    workflow: str
    from_version: int
    to_version: int
    migrated: bool
    added: tuple[str, ...] = ()  # steps only the target version has
    dropped: tuple[str, ...] = ()  # steps of the old version that never started
    started: tuple[str, ...] = ()  # steps whose join the migration found satisfied: now ready
    skipped: tuple[str, ...] = ()  # steps every upstream routed away from: ended skipped
    reason: str | None = None
    step: str | None = None


@dataclass(frozen=True)
class BulkResult(Record):
    """What a bulk cancel or redrive did (:meth:`konduit.App.bulk`), or with ``dry_run`` would
    do: ``matched`` executions the filter found, ``done`` of them cancelled or redriven,
    ``skipped`` the others by reason (``{"succeeded": 3}``: the status the action does not
    apply to, or why it was refused). ``batches`` transactions were run, the longest of them
    ``longest_batch_seconds`` (no lock of the operation is held longer), ``seconds`` in all;
    ``ids`` are the executions done (or that would be)."""

    action: str
    dry_run: bool
    matched: int
    done: int
    skipped: dict[str, int]
    batches: int
    seconds: float
    longest_batch_seconds: float
    ids: tuple[UUID, ...] = ()


@dataclass(frozen=True)
class VersionState(Record):
    """One registered workflow version as it runs now (``konduit versions``): its running
    executions, the live workers serving it, and since when its running executions have had no
    live worker (``unserved_since``; None while one serves it or none runs)."""

    name: str
    version: int
    policy_revision: int  # how many policies the version has had (1: never re-registered)
    created_at: datetime
    policy_updated_at: datetime | None
    running: int
    workers: list[str]
    last_served_at: datetime | None  # the last moment a worker serving it was alive
    unserved_since: datetime | None
    unserved_seconds: float | None

    @property
    def key(self) -> str:
        """``name@version``, as workers list what they serve."""
        return f"{self.name}@{self.version}"

    @property
    def unserved(self) -> bool:
        """Whether it has running executions and no live worker serving it."""
        return self.unserved_since is not None


@dataclass(frozen=True)
class TaskPolicy(Record):
    """The policy tasks of one step were created with (a map's items grouped): what each task
    stores (tries, budget, queue, priority) and the revision of its version's policy then."""

    step: str
    generation: int
    tasks: int
    first_index: int
    max_attempts: int
    deadline_seconds: float | None
    queue: str
    priority: int
    policy_revision: int | None
    created_at: datetime


@dataclass(frozen=True)
class AlertRecord:
    """A stored alert: open while ``resolved_at`` is None."""

    id: int
    kind: str
    subject: str
    workflow: str
    severity: str
    message: str
    details: Mapping[str, Any]
    raised_at: datetime
    last_seen_at: datetime
    resolved_at: datetime | None = None

    @property
    def open(self) -> bool:
        """True until the alert is resolved."""
        return self.resolved_at is None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AlertRecord:
        """An alert from a row of ``konduit_alerts``."""
        return cls(id=int(row["id"]), kind=row["kind"], subject=row["subject"],
                   workflow=row["workflow"], severity=row["severity"], message=row["message"],
                   details=dict(row["details"] or {}), raised_at=row["raised_at"],
                   last_seen_at=row["last_seen_at"], resolved_at=row["resolved_at"])

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO 8601 strings)."""
        return {"id": self.id, "kind": self.kind, "subject": self.subject,
                "workflow": self.workflow, "severity": self.severity, "message": self.message,
                "details": dict(self.details), "raised_at": self.raised_at.isoformat(),
                "last_seen_at": self.last_seen_at.isoformat(),
                "resolved_at": None if self.resolved_at is None else self.resolved_at.isoformat(),
                "open": self.open}



# -- streams ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamChunk(Record):
    """One record of a durable stream (docs/streams.md), at ``offset`` (dense from 0 in each
    stream). ``kind`` is ``"data"``: ``data`` is what ``ctx.stream.write`` wrote, by attempt
    ``attempt``; or ``"restart"``: attempt ``attempt`` of the task started writing again after
    attempt ``previous_attempt`` wrote the records before this one (they stay; what follows is
    the new attempt's), and ``data`` is None. A reader resumes with ``from_offset=offset + 1``."""

    stream: str
    offset: int
    kind: str
    attempt: int
    previous_attempt: int | None
    data: Any
    written_at: datetime

    @property
    def restart(self) -> bool:
        """True for a restart record: an attempt started writing again here."""
        return self.kind == "restart"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the time as ISO 8601), the shape of the API's events."""
        return {"stream": self.stream, "offset": self.offset, "kind": self.kind,
                "attempt": self.attempt, "previous_attempt": self.previous_attempt,
                "data": self.data, "written_at": self.written_at.isoformat()}


@dataclass(frozen=True)
class StreamRecord(Record):
    """A durable stream of an execution: ``name``, the task writing it (``step``,
    ``map_index``), the attempt that wrote last, ``next_offset`` (records so far, restart
    records included), the data ``chunks`` and their ``bytes``, and ``restarts``."""

    name: str
    step: str
    map_index: int
    next_offset: int
    chunks: int
    bytes: int
    writer_attempt: int
    restarts: int
    created_at: datetime
    updated_at: datetime
