"""One request type per operation: the frozen value every door builds and passes unchanged to
the engine (Temporal's ``*Input`` dataclasses are the model).

The App, ``konduit.Client``, ``konduit.AsyncClient``, the command line and the HTTP API each
turn their own arguments (keywords, options, a JSON body) into one of these, and nothing else
reaches the engine: what an operation means is decided once, here and in the engine function
that takes it, never in a face. Each field's description (:class:`Doc`) is written once, here;
the API's models and the command line's help read it (:func:`doc`).

Pure: no database here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Annotated, Any, get_type_hints
from uuid import UUID

from konduit.core.durations import Duration
from konduit.core.search import ExecutionFilter
from konduit.core.values import check_text
from konduit.errors import KonduitError, blamed

ExecutionId = UUID | str
"""An execution: its id, or text that names it (the whole id, or a unique start or end)."""

@dataclass(frozen=True)
class Doc:
    """A field's description, in its annotation (``Annotated[str, Doc("...")]``): the one
    place the API's models and the command line's help read it from."""

    text: str


def doc(request: type, name: str) -> str:
    """The description of ``request``'s field ``name``."""
    hints = get_type_hints(request, include_extras=True)
    if name not in hints:
        raise KeyError(f"{request.__name__} has no field {name!r}")
    return next((m.text for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, Doc)),
                "")


@dataclass(frozen=True)
class StartRequest:
    """One execution to start: what :meth:`konduit.App.start` takes, and one element of
    :meth:`konduit.App.start_many`.

    ``workflow`` is the workflow's name, started at its latest registered version unless
    ``version`` says which. ``input`` is any JSON value. ``idempotency_key``: a key the workflow
    already used returns that execution's id instead of starting another (with a different
    input it raises :class:`~konduit.IdempotencyConflict`). ``deadline_at`` is the window the
    execution should finish in; ``timeout`` (seconds or ``"10m"``) a hard limit past which it
    ends ``timed_out``. ``tags`` (text to text) are what the execution can be searched by.
    ``run_at`` (an aware datetime) or ``delay`` (``"10m"``) start it later: it waits as
    ``scheduled`` until then. ``priority`` is added to each step's priority in the claim order
    (lower first). ``fair_key`` is the key its workflow's ``fair_by`` would give (for a
    process without the workflow's code when ``fair_by`` is a function; given, it is used
    instead of ``fair_by``: see docs/fairness.md). A plain ``dict`` with these keys is accepted
    in its place.
    """

    workflow: Annotated[str, Doc("The workflow's name")]
    input: Annotated[Any, Doc("Any JSON value; the handlers' ctx.input")] = None
    idempotency_key: Annotated[str | None, Doc(
        "The same key (with the same input) gives the same execution")] = None
    version: Annotated[int | None, Doc(
        "The workflow's version; default: the latest registered")] = None
    deadline_at: Annotated[datetime | None, Doc(
        "The window it should finish in (a moment with a time zone)")] = None
    timeout: Annotated[Duration | None, Doc(
        "A hard limit, in seconds or like \"10m\"; past it the execution ends timed_out")] = None
    tags: Annotated[Mapping[str, str] | None, Doc(
        "Text tags to find it by: at most 32, keys up to 64 characters, values up to 256")] = None
    run_at: Annotated[datetime | None, Doc(
        "Start it at this moment (with a time zone): it is scheduled until then")] = None
    delay: Annotated[Duration | None, Doc(
        "Start it this much later, in seconds or like \"10m\" (not with run_at)")] = None
    priority: Annotated[int, Doc("Added to each step's priority: lower is claimed first")] = 0
    fair_key: Annotated[str | None, Doc(
        "Its fair key, used instead of the workflow's fair_by: ready work is claimed "
        "round-robin across keys")] = None

    @classmethod
    def of(cls, request: StartRequest | Mapping[str, Any]) -> StartRequest:
        """The request itself, or one made from a dict of the same fields."""
        if isinstance(request, StartRequest):
            return request
        if isinstance(request, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(str(k) for k in request if k not in known)
            if unknown:
                raise KonduitError(
                    f"unknown field(s) {', '.join(unknown)}; a start request has "
                    f"{', '.join(sorted(known))}"
                )
            if "workflow" not in request:
                raise KonduitError("a start request needs a 'workflow'")
            return cls(**request)
        raise KonduitError(
            f"a start request is a konduit.StartRequest or a dict, not {type(request).__name__}"
        )


@dataclass(frozen=True)
class CancelRequest:
    """Cancel a running execution (:meth:`konduit.App.cancel`)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]
    reason: Annotated[str, Doc("Why, kept as the execution's error")] = "cancelled"


@dataclass(frozen=True)
class RepairRequest:
    """Re-run a finished execution's degraded and failed steps (:meth:`konduit.App.repair`)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]


@dataclass(frozen=True)
class RedriveRequest:
    """Run a failed, timed-out or cancelled execution again from the steps that did not
    succeed, keeping every succeeded (and degraded) output (:meth:`konduit.App.redrive`)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]


@dataclass(frozen=True)
class ForkRequest:
    """Start a new execution of an execution's workflow (its version) that copies the outputs
    of the steps ``from_step`` depends on and runs ``from_step`` and the rest
    (:meth:`konduit.App.fork`). ``input`` None keeps the origin's input."""

    execution_id: Annotated[ExecutionId, Doc(
        "The origin execution (its id, or a unique start or end of it)")]
    from_step: Annotated[str, Doc(
        "The step to run again: the steps it depends on keep the origin's outputs")]
    input: Annotated[Any, Doc(
        "The fork's input (any JSON value); null or absent keeps the origin's")] = None

    def __post_init__(self) -> None:
        if not isinstance(self.from_step, str) or not self.from_step:
            raise blamed(KonduitError("from_step must be a step's name (non-empty text)"),
                         "from_step")
        check_text(self.from_step, "from_step")


@dataclass(frozen=True)
class StreamRequest:
    """Read a durable stream of an execution (docs/streams.md): its records from
    ``from_offset`` on, in order, each once; with ``follow``, then as they are written until
    the stream ends (its task or its execution ended)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]
    name: Annotated[str | None, Doc(
        "The stream's name (its step's, step[i] for a map item); absent: the execution's only "
        "stream")] = None
    from_offset: Annotated[int, Doc(
        "The first offset to read: 0 for all, the last offset read + 1 to resume")] = 0
    follow: Annotated[bool, Doc(
        "Wait for the records still to come until the stream ends")] = True

    def __post_init__(self) -> None:
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name:
                raise blamed(KonduitError("name must be a stream's name (non-empty text)"),
                             "name")
            check_text(self.name, "name")
        if (isinstance(self.from_offset, bool) or not isinstance(self.from_offset, int)
                or self.from_offset < 0):
            raise blamed(KonduitError(
                f"from_offset must be a whole number >= 0, not {self.from_offset!r}"),
                "from_offset")


BULK_ACTIONS = ("cancel", "redrive")
"""What a bulk operation does to each execution its filter finds."""

MAX_BATCH_SIZE = 1000
"""The most executions one batch (one transaction) of a bulk operation touches."""


@dataclass(frozen=True)
class BulkRequest:
    """Cancel or redrive every execution a search finds (:meth:`konduit.App.bulk`), a batch at
    a time: each batch is one short transaction that locks its executions in id order, so no
    lock is held longer than a batch. ``dry_run`` counts what would be done and changes
    nothing. Executions the action does not apply to (a running one to redrive, a finished
    one to cancel) are skipped and counted by reason."""

    action: Annotated[str, Doc("What to do to each execution found: cancel or redrive")]
    where: Annotated[ExecutionFilter, Doc(
        "Which executions: the search's filter (not an empty one)")]
    dry_run: Annotated[bool, Doc("Count what would be done; change nothing")] = False
    batch_size: Annotated[int, Doc(
        f"Executions per transaction (1 to {MAX_BATCH_SIZE})")] = 100
    reason: Annotated[str, Doc("Why, kept as each cancelled execution's error")] = "cancelled"

    def __post_init__(self) -> None:
        if self.action not in BULK_ACTIONS:
            raise blamed(KonduitError(
                f"action {self.action!r}: one of {', '.join(BULK_ACTIONS)}"), "action")
        if not isinstance(self.where, ExecutionFilter):
            raise blamed(KonduitError(
                f"where is a konduit.ExecutionFilter, not {type(self.where).__name__}"), "where")
        if not isinstance(self.reason, str) or not self.reason:
            raise blamed(KonduitError(f"reason {self.reason!r}: some text"), "reason")
        check_text(self.reason, "reason")
        if not isinstance(self.dry_run, bool):
            raise blamed(KonduitError(f"dry_run {self.dry_run!r}: true or false"), "dry_run")
        if self.where == ExecutionFilter():
            raise blamed(KonduitError(
                "a bulk operation needs a filter: an empty one finds every execution (give a "
                "status, a workflow, tags, a time range...)"), "where")
        if (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                or not 1 <= self.batch_size <= MAX_BATCH_SIZE):
            raise blamed(KonduitError(
                f"batch_size {self.batch_size!r}: a whole number from 1 to {MAX_BATCH_SIZE}"),
                "batch_size")


@dataclass(frozen=True)
class EventRequest:
    """Send an event (:meth:`konduit.App.send_event`): to the step waiting for it by ``key``,
    by ``execution_id`` or both, and to the workflows it starts (``wf.on_event``)."""

    name: Annotated[str, Doc("The event's name")]
    key: Annotated[str | None, Doc(
        "The key the waiting step's key= computed (or the trigger's)")] = None
    execution_id: Annotated[ExecutionId | None, Doc(
        "The execution whose step waits for it")] = None
    payload: Annotated[Any, Doc(
        "Any JSON value: the woken step's output, or the started input")] = None


@dataclass(frozen=True)
class AnswerRequest:
    """Answer a ``wait_for_input`` step (:meth:`konduit.App.answer`): ``value`` is checked
    against the step's model and becomes its output; ``answered_by`` is kept with it."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]
    step: Annotated[str, Doc("The wait_for_input step that waits for the answer")]
    value: Annotated[Any, Doc(
        "The answer: a JSON object matching the step's model; the step's output")] = None
    answered_by: Annotated[str | None, Doc(
        "Who answers (kept with the answer and shown on the execution page)")] = None

    def __post_init__(self) -> None:
        if not isinstance(self.step, str) or not self.step:
            raise blamed(KonduitError(f"step must be a step's name, got {self.step!r}"), "step")
        if self.answered_by is not None:
            if not isinstance(self.answered_by, str):
                raise blamed(KonduitError(f"answered_by must be text, got "
                                          f"{self.answered_by!r:.80}"), "answered_by")
            try:
                check_text(self.answered_by, "answered_by")
            except KonduitError as exc:
                raise blamed(exc, "answered_by") from None
            if len(self.answered_by) > 200:
                raise blamed(KonduitError("answered_by: at most 200 characters"), "answered_by")


@dataclass(frozen=True)
class MigrateRequest:
    """Move one running execution to another version of its workflow
    (:meth:`konduit.App.migrate`; not the schema's ``konduit db migrate``)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]
    to_version: Annotated[int, Doc("The version to move it to")]


@dataclass(frozen=True)
class MigrateWorkflowRequest:
    """Move every running execution of a workflow version to another version
    (:meth:`konduit.App.migrate_workflow`), each on its own."""

    workflow: Annotated[str, Doc("The workflow's name")]
    from_version: Annotated[int, Doc("The version its executions run now")]
    to_version: Annotated[int, Doc("The version to move them to")]


@dataclass(frozen=True)
class RetryNowRequest:
    """Make a task waiting out its retry backoff claimable now (:meth:`konduit.App.retry_now`)."""

    execution_id: Annotated[ExecutionId, Doc(
        "The execution (its id, or a unique start or end of it)")]
    task_id: Annotated[int, Doc("The task (its number, as the execution's tasks list it)")]


@dataclass(frozen=True)
class ScheduleRequest:
    """Pause or resume a stored schedule (:meth:`konduit.App.pause_schedule`,
    :meth:`konduit.App.resume_schedule`)."""

    name: Annotated[str, Doc("The schedule's name")]
    paused: Annotated[bool, Doc("True: stop starting its ticks; False: start them again")] = True


@dataclass(frozen=True)
class PruneRequest:
    """Delete executions that finished long ago with every row of theirs
    (:meth:`konduit.App.prune`)."""

    older_than: Annotated[Duration, Doc("Finished more than this long ago (\"7d\", or seconds)")]
    include_dead_letters: Annotated[bool, Doc(
        "Delete executions held by a dead letter that no repair superseded too")] = False
    batch_size: Annotated[int, Doc("Executions deleted per transaction")] = 500


@dataclass(frozen=True)
class HistoryMoveRequest:
    """Move executions that finished long ago out of the tables the workers write into the
    history, tables partitioned by day (:meth:`konduit.App.move_to_history`)."""

    older_than: Annotated[Duration, Doc("Finished more than this long ago (\"1d\", or seconds)")]
    batch_size: Annotated[int, Doc("Executions moved per transaction")] = 500


@dataclass(frozen=True)
class RetryWebhookRequest:
    """Send a failed or refused webhook delivery again now
    (:meth:`konduit.App.retry_webhook_delivery`)."""

    delivery_id: Annotated[UUID | str, Doc("The delivery's id")]


@dataclass(frozen=True)
class SearchRequest:
    """Find executions (:meth:`konduit.App.search`, :meth:`konduit.App.list`): a filter and a
    page of it, newest first, older than ``before`` (the ``(created_at, id)`` of the previous
    page's last execution)."""

    where: Annotated[ExecutionFilter, Doc("What to find")] = field(default_factory=ExecutionFilter)
    before: Annotated[tuple[datetime, UUID] | None, Doc(
        "The (created_at, id) of the previous page's last execution")] = None
    limit: Annotated[int, Doc("At most this many")] = 50


COMMANDS: tuple[type, ...] = (
    StartRequest, CancelRequest, RepairRequest, RedriveRequest, ForkRequest, BulkRequest,
    EventRequest,
    MigrateRequest,
    MigrateWorkflowRequest, RetryNowRequest, ScheduleRequest, PruneRequest, HistoryMoveRequest,
    RetryWebhookRequest,
)
"""The request types of the operations that change something."""
