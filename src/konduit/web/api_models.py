"""The request and response bodies of ``/api/v1`` (they make its OpenAPI description)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, create_model

from konduit.core.requests import (
    MAX_BATCH_SIZE,
    AnswerRequest,
    BulkRequest,
    CancelRequest,
    EventRequest,
    ForkRequest,
    MigrateRequest,
    StartRequest,
    doc,
)
from konduit.records import WorkerRecord

ExecutionStatus = Literal["pending", "scheduled", "running", "succeeded", "failed", "timed_out", "cancelled"]

MAX_BATCH = 1000


def request_body(request: type, *, path: tuple[str, ...] = (),
                 schema_extra: dict[str, Any] | None = None, **http: Any) -> type[BaseModel]:
    """The body of an operation, made of its request type (:mod:`konduit.core.requests`): the
    fields' names, defaults and descriptions come from there, each field's JSON type and limits
    (``Annotated[str, Field(max_length=200)]``) from ``http``. Every field of the request but
    those the URL's ``path`` carries must be in ``http``, and nothing else may be: a field
    added to a request and not to its body (or the other way round) fails at import."""
    wanted = [f for f in fields(request) if f.name not in path]
    missing = sorted({f.name for f in wanted} - set(http))
    unknown = sorted(set(http) - {f.name for f in wanted})
    if missing or unknown:
        raise TypeError(f"the body of {request.__name__}: no HTTP type for {missing}, "
                        f"not a field of the request: {unknown}")
    body: dict[str, Any] = {}
    for f in wanted:
        if f.default is not MISSING:
            default: Any = Field(f.default, description=doc(request, f.name))
        elif f.default_factory is not MISSING:
            default = Field(default_factory=f.default_factory, description=doc(request, f.name))
        else:
            default = Field(description=doc(request, f.name))
        body[f.name] = (http[f.name], default)
    return create_model(f"{request.__name__}Body", __config__=ConfigDict(
        extra="forbid", json_schema_extra=schema_extra), **body)


class StartBody(request_body(  # type: ignore[misc]
        StartRequest,
        workflow=Annotated[str, Field(min_length=1, max_length=200)],
        input=Any,
        idempotency_key=Annotated[str | None, Field(min_length=1, max_length=500)],
        version=Annotated[int | None, Field(ge=1)],
        deadline_at=AwareDatetime | None,
        timeout=float | str | None,
        tags=Annotated[dict[str, str] | None, Field(max_length=32)],
        run_at=AwareDatetime | None,
        delay=float | str | None,
        priority=Annotated[int, Field(ge=-1_000_000, le=1_000_000)],
        fair_key=Annotated[str | None, Field(min_length=1, max_length=200)])):
    """One execution to start."""


class BatchBody(BaseModel):
    """Many executions to start in one transaction: all of them, or none."""

    model_config = ConfigDict(extra="forbid")

    requests: list[StartBody] = Field(max_length=MAX_BATCH)


class CancelBody(request_body(  # type: ignore[misc]
        CancelRequest, path=("execution_id",),
        reason=Annotated[str, Field(min_length=1, max_length=2000)])):
    """Why an execution is cancelled (optional: the body may be left out)."""


class Started(BaseModel):
    """A started execution (or the one its idempotency key already named)."""

    id: UUID
    status: ExecutionStatus


class StartedMany(BaseModel):
    executions: list[Started] = Field(description="In request order")


class ExecutionSummary(BaseModel):
    id: UUID
    workflow: str
    version: int
    status: ExecutionStatus
    error: str | None = None
    idempotency_key: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    tags: dict[str, str] = Field(default_factory=dict, description="Its tags")
    run_at: datetime | None = Field(None, description="When it starts (None: it started at "
                                    "once)")
    priority: int = Field(0, description="Added to its steps' priorities")


class ExecutionPage(BaseModel):
    """Executions, newest first; ``next_cursor`` fetches the ones after (None: no more)."""

    items: list[ExecutionSummary]
    next_cursor: str | None = None


class StepState(BaseModel):
    step: str
    status: str
    up_total: int | None = None
    up_pending: int | None = None
    up_ok: int | None = None
    up_failed: int | None = None
    up_skipped: int | None = None
    tasks_total: int | None = None
    tasks_pending: int | None = None
    tasks_ok: int | None = None
    tasks_degraded: int | None = None
    tasks_failed: int | None = None
    first_upstream_at: datetime | None = None
    last_upstream_at: datetime | None = None
    straggler: str | None = None
    fired_at: datetime | None = None
    ended_at: datetime | None = None


class Attempt(BaseModel):
    """One attempt of one task, with its whole error (traceback included) when it failed."""

    task_id: int
    step: str
    map_index: int | None = None
    generation: int
    attempt: int
    worker_id: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    outcome: str | None = None
    error: str | None = None
    hedge: bool | None = None


class LogRecord(BaseModel):
    """One line a handler logged during an attempt (masked like errors)."""

    at: float  # seconds since the epoch
    level: str
    logger: str
    message: str


class AttemptLog(BaseModel):
    """What a handler logged during one attempt; ``dropped`` records past the per-attempt
    bounds (200 records, 64 KiB) were counted, not kept."""

    step: str
    map_index: int
    generation: int
    attempt: int
    started_at: datetime
    outcome: str | None = None
    records: list[LogRecord]
    dropped: int


class JournalEntry(BaseModel):
    """One recorded durable call (``ctx.call``, docs/journal.md): where and when it ran live,
    how long it took, and how often later attempts replayed it instead of calling again."""

    step: str
    map_index: int
    seq: int
    name: str
    generation: int
    attempt: int
    duration_seconds: float
    recorded_at: datetime
    replays: int
    last_replayed_attempt: int | None = None
    last_replayed_at: datetime | None = None
    content_hash: str
    result_bytes: int


class OutputVersion(BaseModel):
    version: int
    status: str
    output: Any = None
    degraded: list[str] | None = None
    created_at: datetime


class StreamOut(BaseModel):
    """A durable stream of an execution (``ctx.stream``, docs/streams.md)."""

    name: str = Field(description="Its name: its step's, step[i] for an item of a map step")
    step: str = Field(description="The step whose task writes it")
    map_index: int
    next_offset: int = Field(description="Records so far (offsets are 0 to next_offset - 1), "
                             "restart records included")
    chunks: int = Field(description="Data chunks kept")
    bytes: int = Field(description="Bytes of chunk JSON kept")
    writer_attempt: int = Field(description="The attempt that wrote last")
    restarts: int = Field(description="Restart records: times a retried attempt started again")
    created_at: datetime
    updated_at: datetime


class AnswerOut(BaseModel):
    """The answer recorded: the step's output, who answered and when."""

    execution_id: UUID
    step: str
    value: Any
    answered_by: str | None
    answered_at: datetime


class ExecutionDetail(BaseModel):
    id: UUID
    workflow: str
    version: int
    status: ExecutionStatus
    input: Any = None
    output: Any = None
    error: str | None = None
    outcomes: dict[str, str] = Field(description="Each step's outcome")
    idempotency_key: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    deadline_at: datetime | None = None
    timeout_at: datetime | None = None
    output_version: int | None = None
    tags: dict[str, str] = Field(default_factory=dict, description="Its tags")
    run_at: datetime | None = Field(None, description="When it starts (None: it started at "
                                    "once); status scheduled until then")
    priority: int = Field(0, description="Added to its steps' priorities")
    fair_key: str | None = Field(None, description="Its workflow's fair_by key of its input: "
                                 "ready work is claimed round-robin across keys")
    steps: list[StepState]
    attempts: list[Attempt]
    output_versions: list[OutputVersion]
    stalled: AlertOut | None = Field(
        None, description="The open execution_stalled alert of a running execution in which "
        "nothing can run (details.reasons says why), else null")
    streams: list[StreamOut] = Field(
        default_factory=list, description="Its durable streams (GET .../streams/{name} follows "
        "one as server-sent events)")
    answers: list[AnswerOut] = Field(
        default_factory=list, description="The answers given to its wait_for_input steps: the "
        "value, who answered and when, oldest first")
    auto_repair: str | None = Field(
        None, description="How its automatic repair (repair_within) stands, as one line; null "
        "when it has none")


class EventBody(request_body(  # type: ignore[misc]
        EventRequest,
        # key, execution_id or both: said in the schema too, so clients and fuzzers know it.
        schema_extra={"anyOf": [{"required": ["key"]}, {"required": ["execution_id"]}]},
        name=Annotated[str, Field(min_length=1, max_length=200,
                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")],
        key=Annotated[str | None, Field(min_length=1, max_length=500)],
        execution_id=UUID | None,
        payload=Any)):
    """An event for the step that waits for it (``wf.wait_for_event``)."""


class AnswerBody(request_body(  # type: ignore[misc]
        AnswerRequest, path=("execution_id", "step"),
        value=Any,
        answered_by=Annotated[str | None, Field(min_length=1, max_length=200)])):
    """An answer to a ``wait_for_input`` step. ``answered_by`` is the person's own name for
    it: the server records it with the token that sent it (``ada via op token 1a2b3c4d``)."""


class InboxItem(BaseModel):
    """A ``wait_for_input`` step waiting for a person's answer."""

    execution_id: UUID
    workflow: str
    version: int
    step: str
    waiting_since: datetime | None
    deadline_at: datetime | None = Field(description="Past it the step takes its fallback "
                                                     "(or times out); null: no deadline")
    who: str | None = Field(description="Who may answer, as the step says (not a permission)")
    answer_schema: dict[str, Any] = Field(description="The JSON Schema an answer must match")


class EventSent(BaseModel):
    result: Literal["woke", "started", "stored", "no match"] = Field(
        description="woke: a waiting task took it; started: a workflow's on_event trigger took "
                    "it (docs/events.md); stored: kept for a step that may still wait "
                    "for it; no match: nothing could take it (nothing kept; docs/durable-waits.md)")


class Cancelled(BaseModel):
    id: UUID
    cancelled: bool = Field(description="False when it had already finished")
    status: ExecutionStatus


class Repaired(BaseModel):
    id: UUID
    rerun: list[str] = Field(description="The steps re-run")
    status: ExecutionStatus


class Redriven(BaseModel):
    id: UUID
    rerun: list[str] = Field(description="The steps re-run (what did not succeed and what "
                             "depends on it)")
    status: ExecutionStatus


class ForkBody(request_body(  # type: ignore[misc]
        ForkRequest, path=("execution_id",),
        from_step=Annotated[str, Field(min_length=1, max_length=200)],
        input=Any)):
    """Fork an execution from one of its steps (docs/recovering-executions.md)."""


class Forked(BaseModel):
    id: UUID = Field(description="The fork: a new execution")
    forked_from: UUID = Field(description="The origin execution")
    from_step: str = Field(description="The step the fork runs from")
    status: ExecutionStatus


class FilterBody(BaseModel):
    """Which executions: the search's parts, in the text forms ``GET /api/v1/executions``
    takes as its query (at least one)."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str | None, Field(max_length=36, description=(
        "The start or the end of the id (at least 4 hex digits)"))] = None
    key: Annotated[str | None, Field(max_length=500, description="The idempotency key")] = None
    tag: Annotated[list[str] | None, Field(max_length=32, description=(
        "key=value: carries this tag (all of them)"))] = None
    input: Annotated[list[str] | None, Field(max_length=32, description=(
        "field=value: the input has this field (the value is JSON, else text)"))] = None
    status: ExecutionStatus | None = None
    workflow: Annotated[str | None, Field(max_length=200, description=(
        "name or name@version"))] = None
    since: Annotated[str | None, Field(max_length=64, description=(
        "Created since: a duration ago (1h) or an ISO 8601 date-time"))] = None
    until: Annotated[str | None, Field(max_length=64, description=(
        "Created before: a duration ago (1h) or an ISO 8601 date-time"))] = None
    fair_key: Annotated[str | None, Field(max_length=200, description=(
        "Started with this fair key"))] = None


class BulkBody(request_body(  # type: ignore[misc]
        BulkRequest,
        action=Literal["cancel", "redrive"],
        where=FilterBody,
        dry_run=bool,
        batch_size=Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)],
        reason=Annotated[str, Field(min_length=1, max_length=2000)])):
    """Cancel or redrive every execution a filter finds, a batch per transaction."""


MAX_BULK_IDS = 1000
"""The most execution ids a bulk operation's answer lists (the counts are whole)."""


class BulkDone(BaseModel):
    """What a bulk cancel or redrive did, or with ``dry_run`` would do."""

    action: Literal["cancel", "redrive"]
    dry_run: bool
    matched: int = Field(description="Executions the filter found")
    done: int = Field(description="Of them cancelled or redriven (would be, in a dry run)")
    skipped: dict[str, int] = Field(description="The others, by reason: the status the action "
                                    "does not apply to, or the refusal's code")
    batches: int = Field(description="Transactions run, one per batch")
    seconds: float
    longest_batch_seconds: float = Field(description="No lock was held longer than this")
    ids: list[UUID] = Field(description=f"The executions done, the first {MAX_BULK_IDS}")


class MigrateBody(request_body(  # type: ignore[misc]
        MigrateRequest, path=("execution_id",),
        to_version=Annotated[int, Field(ge=1, le=2**31 - 1)])):
    """Move a running execution to another version of its workflow."""


class Migrated(BaseModel):
    """What a migration did (docs/migrating-executions.md)."""

    id: UUID
    workflow: str
    from_version: int
    to_version: int
    migrated: bool = Field(description="False when it was at that version already")
    added: list[str] = Field(description="Steps only the target version has")
    dropped: list[str] = Field(description="Steps of the old version that never started")
    started: list[str] = Field(description="Steps whose join was satisfied: their tasks are "
                               "ready now")
    skipped: list[str] = Field(description="Steps every upstream routed away from")
    status: ExecutionStatus


class DeadLetter(BaseModel):
    task_id: int
    execution_id: UUID
    workflow: str
    step: str
    map_index: int | None = None
    attempt: int
    error: str | None = None
    finished_at: datetime | None = None


class JoinPolicy(BaseModel):
    kind: str
    k: int | None = None


class StepDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    after: list[str] = Field(default_factory=list)
    join: JoinPolicy | None = None
    required: bool = True
    map: bool = False
    queue: str | None = None
    priority: int | None = None
    deadline: Any = None
    retry: dict[str, Any] | None = None


class Join(BaseModel):
    """A step with more than one upstream branch, and the policy that fires it."""

    step: str
    upstream: list[str]
    policy: JoinPolicy


class TriggerOut(BaseModel):
    event: str
    mode: Literal["start", "debounce", "batch"] = Field(
        description="start: one execution per event; debounce: one per burst; batch: one per batch")
    description: str = Field(description="Its settings in words")
    open_groups: int = Field(description="Bursts or batches gathering events now")
    pending: int = Field(description="Events waiting for a worker with the workflow's code")
    last_event_at: datetime | None


class WorkflowOut(BaseModel):
    name: str
    version: int
    spec_hash: str
    created_at: datetime
    served: bool = Field(description="Whether this server has its code (can start it)")
    steps: list[StepDefinition]
    edges: list[tuple[str, str]] = Field(description="[from, to] pairs")
    joins: list[Join]
    policy_revision: int = Field(default=1, description="How many policies this version has had: a "
                                 "policy-only change re-registers it (docs/changing-workflows.md)")
    running: int = Field(default=0, description="Its running executions")
    workers: list[str] = Field(default_factory=list,
                               description="The live workers serving it (their ids)")
    unserved: bool = Field(default=False, description="Running executions and no live worker serving it")
    unserved_since: datetime | None = Field(
        default=None, description="Since when its running executions have had no live worker")
    triggers: list[TriggerOut] = Field(
        default_factory=list, description="The events that start it (wf.on_event; docs/events.md)")


# The fields of the record the Client returns, declared once there (the columns are NOT NULL:
# queues, workflows and isolation are required in the schema, as they always were in the JSON).
@dataclass(frozen=True)
class WorkerOut(WorkerRecord):
    """A worker that is up: what it serves and runs."""


class ScheduleOut(BaseModel):
    name: str
    workflow: str
    workflow_version: int | None = None
    schedule: str
    cron: str | None = None
    every_seconds: float | None = None
    timezone: str | None = None
    missed: str
    window_seconds: float | None = None
    input: Any = None
    paused: bool
    paused_at: datetime | None = None
    last_tick: datetime | None = None
    next_tick: datetime | None = None
    behind: bool
    last_execution_id: UUID | None = None
    last_status: str | None = None
    last_scheduled_at: datetime | None = None
    last_started_at: datetime | None = None


class AlertOut(BaseModel):
    id: int
    kind: str
    subject: str
    workflow: str
    severity: str
    message: str
    details: dict[str, Any]
    raised_at: datetime
    last_seen_at: datetime
    resolved_at: datetime | None = None
    open: bool


class StatsOut(BaseModel):
    """``konduit stats --json``: per branch and per join, the alerts, flow-limited steps."""

    workflow: str | None = None
    history_seconds: float
    fan_in_alert_seconds: float
    consecutive: int
    branches: list[dict[str, Any]]
    joins: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    flow: list[dict[str, Any]]
    stored_events: list[dict[str, Any]] = Field(
        default_factory=list, description="Events sent before any step waited for them, kept "
        "for one to come, by name: events, next_expiry")


class BulkJobOut(BaseModel):
    """A bulk operation running in the background, and how far it got (the counts of the
    batches done so far; ``error`` when it failed)."""

    id: UUID
    state: Literal["running", "succeeded", "failed"]
    action: Literal["cancel", "redrive"]
    dry_run: bool
    matched: int = Field(description="Executions the filter found so far")
    done: int = Field(description="Of them cancelled or redriven so far")
    skipped: dict[str, int]
    batches: int
    seconds: float
    longest_batch_seconds: float
    error: str | None = None
