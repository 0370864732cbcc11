"""Every exception the package raises derives from :class:`KonduitError`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from konduit.masking import mask_password

if TYPE_CHECKING:
    from konduit.core.results import ExecutionResult


class KonduitError(Exception):
    """Base class of every error raised by konduit.

    An error carries its facts as attributes, for programs (the HTTP API reads them; no face
    parses a message): ``code``, the error's kind as text (``"input_validation_error"``: its
    class's name, in snake case); ``field``, the field of the request at fault when one is
    (``"input"``, ``"fair_key"``, ``"timeout"``), else None; ``index``, the position of the
    request at fault in a batch (``start_many``), else None."""

    code: str = "konduit_error"
    field: str | None = None
    index: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


E = TypeVar("E", bound=KonduitError)

# What a program may catch (the API reference documents these); the rest are the command line's
# and the tools' own, reported in one line and never raised by the App or the clients.
__all__ = [
    "AlertError", "AmbiguousExecutionId", "CodecError", "DatabaseConflict", "DatabaseError",
    "DatabaseUnavailable",
    "DefinitionWarning", "DeterminismError", "ExecutionFailed", "ExecutionInHistory",
    "ExecutionNotFound",
    "IdempotencyConflict",
    "InputValidationError", "JournalUnavailable", "KeyNeedsCode", "KonduitError", "LeaseLost",
    "LimitKeyError", "MigrationRefused",
    "NonRetryableError", "NotAnswerable", "NotForkable", "NotRedrivable", "NothingToRepair",
    "OutputInvalid",
    "PayloadError", "PayloadStoreError", "PayloadTooLarge", "PoolExhausted",
    "ScheduleNotFound", "SchemaConflict", "SchemaGap", "SchemaOutdated", "SettingsError",
    "StreamError", "StreamFull",
    "StreamLeaseLost", "StreamNotFound", "UserCodeInterrupted", "UserCodeStuck",
    "WorkerUnhealthy", "WorkflowDefinitionError", "WorkflowNotFound", "WorkflowVersionConflict",
]


def blamed(exc: E, field: str, *, index: int | None = None) -> E:
    """``exc`` with ``field`` (unless it names one already) and ``index`` set: who is at fault
    is decided where the fault is found, not read back from its message."""
    if exc.field is None:
        exc.field = field
    if index is not None:
        exc.index = index
    return exc


@contextmanager
def blame(field: str) -> Iterator[None]:
    """Whatever :class:`KonduitError` the block raises names ``field`` (unless it names one
    already)."""
    try:
        yield
    except KonduitError as exc:
        raise blamed(exc, field) from exc.__cause__


class WorkflowDefinitionError(KonduitError):
    """A workflow definition is invalid; the message names the step at fault."""

    def __init__(self, message: str, *, workflow: str | None = None, step: str | None = None):
        self.workflow = workflow
        self.step = step
        prefix = ""
        if workflow:
            prefix += f"workflow {workflow!r}"
        if step:
            prefix += (", " if prefix else "") + f"step {step!r}"
        super().__init__(f"{prefix}: {message}" if prefix else message)


class DefinitionWarning(KonduitError, UserWarning):
    """A workflow definition that works but can misbehave at run time (an optional branch with no
    deadline under ``Join.required()`` can hold its join forever); issued with
    :func:`warnings.warn` when the definition is made, pointing at the user's line. Silence or
    escalate it with the usual warning filters."""


class WorkflowNotFound(KonduitError):
    """No workflow with that name (and version) is registered."""


class WorkflowVersionConflict(WorkflowDefinitionError):
    """A definition whose shape differs from the one registered under the same (name, version):
    the message says what changed (``step 'x' added``, ``edge a->b removed``). A policy-only
    change is no conflict: it re-registers the version (docs/changing-workflows.md)."""


class MigrationRefused(KonduitError):
    """A running execution cannot move to another version of its workflow: its past (a step that
    started or ended) does not exist as it was in the target version, or the move is not
    possible now. ``step`` names the step at fault (None when no step is)."""

    def __init__(self, message: str, *, step: str | None = None):
        super().__init__(message)
        self.step = step


class IdempotencyConflict(KonduitError):
    """An idempotency key was reused with a different input."""

    field = "idempotency_key"


class ExecutionNotFound(KonduitError):
    """No execution has that id."""


class ExecutionInHistory(KonduitError):
    """A write (cancel, repair, redrive, answer, an event sent to it, retry_now, migrate) to an
    execution that finished and was moved into the history (``App(history_after=)``,
    docs/retention.md): it reads as it did, but nothing acts on it any more. ``execution_id``
    names it; ``status``, ``finished_at`` and ``moved_at`` (None when unknown) say how it
    ended and when it moved. The HTTP API answers 409."""

    def __init__(self, message: str, *, execution_id: Any = None, status: str | None = None,
                 finished_at: Any = None, moved_at: Any = None):
        super().__init__(message)
        self.execution_id = execution_id
        self.status = status
        self.finished_at = finished_at
        self.moved_at = moved_at


class AmbiguousExecutionId(KonduitError):
    """A piece of an id (its start or its end) matches several executions; ``candidates`` are
    some of them (the message lists them), so the caller can type more of the one meant."""

    def __init__(self, message: str, candidates: list[str]):
        self.candidates = candidates
        super().__init__(message)


class ScheduleNotFound(KonduitError):
    """No stored schedule has that name (schedules are stored when a worker defining them
    starts)."""


class PayloadError(KonduitError):
    """A payload (input or output) cannot be stored: not JSON, or too large."""


class PayloadTooLarge(PayloadError):
    """A payload is over the size limit (``App(payload_limit=)``, ``KONDUIT_PAYLOAD_LIMIT``):
    refused where it enters, before anything is written. ``what`` names the payload (``output
    of step 'render'``), ``step`` its step when it is a step's output (else None), ``size`` and
    ``limit`` are bytes of its JSON text. A step's output over the limit fails its attempt at
    once (retrying would make the same payload)."""

    def __init__(self, message: str, *, what: str, size: int, limit: int,
                 step: str | None = None):
        super().__init__(message)
        self.what = what
        self.size = size
        self.limit = limit
        self.step = step


class CodecError(KonduitError):
    """A stored payload cannot be decoded here, or a payload cannot be encoded: no codec is
    configured where the payload is encrypted, the key it was sealed with (``key_id``) is not in
    this process's key ring, or its data does not decrypt (a wrong key under that id, or bytes
    changed in the database). A worker fails the attempt that needed the payload with this
    error; it never stops the worker. ``key_id`` is None when the fault is not a key's."""

    def __init__(self, message: str, *, key_id: str | None = None):
        super().__init__(message)
        self.key_id = key_id


class PayloadStoreError(KonduitError):
    """A payload kept outside PostgreSQL (``App(payload_store=)``) cannot be written, read or
    removed: ``ref`` names the object (None when the store itself is at fault)."""

    def __init__(self, message: str, *, ref: str | None = None):
        super().__init__(message)
        self.ref = ref


class InputValidationError(KonduitError):
    """A start's input does not match the workflow's declared ``input=`` (a Pydantic model or a
    JSON Schema): nothing was written. ``errors`` maps each field at fault (a dotted path such
    as ``items.0.name``, ``(root)`` for the input itself) to what is wrong with it (the first
    100 faults); the message names the first 20."""

    def __init__(self, message: str, errors: dict[str, str] | None = None, *,
                 workflow: str | None = None):
        super().__init__(message)
        self.errors: dict[str, str] = dict(errors or {})
        self.workflow = workflow


class DatabaseError(KonduitError):
    """The database failed; the driver's error is in ``__cause__``. The message never holds a
    database URL's password (a driver that cannot parse a URL quotes all of it)."""

    def __init__(self, *args: object):
        super().__init__(*(mask_password(a) if isinstance(a, str) else a for a in args))


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached."""


class DatabaseConflict(DatabaseError):
    """A transient conflict between transactions (deadlock, serialization failure, lock timeout)
    that did not clear after the boundary retried it."""


class PoolExhausted(DatabaseError):
    """No pooled connection became free in time although the server answers: too many callers
    for the pool's size."""


class WorkerUnhealthy(KonduitError):
    """A worker stopped itself: too many handler threads ignored their deadline. Its supervisor
    should start a fresh process."""


class UserCodeInterrupted(KonduitError):
    """User code the engine called (a key function, ``fair_by``, an input model's validator, a
    trigger's ``input=``/``key=``, a map's ``over()``...) raised a ``BaseException`` that is no
    ``Exception``: ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``, a
    ``CancelledError`` of its own. It ends that operation only (the start is refused, the event
    fails, the attempt fails), never the process or the loop that waited for it; the original
    is its ``__cause__``."""


class UserCodeStuck(KonduitError):
    """Calls of user code that did not return within their limit are still running, as many as
    their pool allows (start-time input checks and key functions, a trigger's code, a map's
    ``over()``): what needs one more is refused until some of them return, rather than leave
    one more thread behind each time."""


class SchemaOutdated(KonduitError):
    """The database schema is older than this version of konduit expects."""


class SchemaGap(SchemaOutdated):
    """The database recorded a migration newer than one it never applied (a build with other
    migrations, a development branch's, migrated it): the migrator applies nothing there, since
    the missing one, run after those that came later, could undo them. ``versions`` are the
    missing migrations' numbers, ``files`` their file names (``0041_history.sql``), ``newest``
    the newest migration the database recorded."""

    def __init__(self, message: str, *, versions: tuple[int, ...], files: tuple[str, ...],
                 newest: int):
        super().__init__(message)
        self.versions = versions
        self.files = files
        self.newest = newest


class SchemaConflict(SchemaOutdated):
    """The database recorded a migration under a number at which this konduit has another name
    (a migration file renamed, or another build's migration under the same number: a
    development branch's): konduit cannot tell the two apart, and if it is another migration,
    this konduit's under that number was never applied, so the migrator applies nothing there
    and workers refuse to start. ``versions`` are the numbers, ``recorded`` the names the
    database recorded under them, ``files`` this konduit's migrations there
    (``0041_history.sql``)."""

    def __init__(self, message: str, *, versions: tuple[int, ...], recorded: tuple[str, ...],
                 files: tuple[str, ...]):
        super().__init__(message)
        self.versions = versions
        self.recorded = recorded
        self.files = files


class ExecutionFailed(KonduitError):
    """An execution ended failed, timed out or cancelled; ``result`` carries the details."""

    def __init__(self, result: ExecutionResult):
        self.result = result
        super().__init__(
            f"execution {result.id} ended {result.status}"
            + (f": {result.error}" if result.error else "")
        )


class NonRetryableError(KonduitError):
    """Raise (or subclass) in a handler to fail the task without further attempts."""

    def __init__(self, message: str = "", *args: Any):
        super().__init__(message, *args)


class DeterminismError(NonRetryableError):
    """A durable call (``ctx.call``, docs/journal.md) does not match the journal its task
    recorded: the call at position ``seq`` of the step's handler is named ``name`` now, and was
    ``recorded`` when it first ran (the handler's calls changed order, or a call was added or
    removed before it). Replaying another call's result would be a silent wrong answer, so the
    attempt fails at once, without retries. Carries ``step``, ``map_index``, ``name``, ``seq``
    and ``recorded``."""

    def __init__(self, message: str, *, step: str | None = None, map_index: int | None = None,
                 name: str | None = None, seq: int | None = None, recorded: str | None = None):
        super().__init__(message)
        self.step = step
        self.map_index = map_index
        self.name = name
        self.seq = seq
        self.recorded = recorded


class LeaseLost(KonduitError):
    """A durable call's result could not be recorded because its attempt no longer holds the
    task's lease (it was rescued by another worker, ended by its deadline, cancelled or outrun
    by a hedge): the attempt ends here, and whatever it returns would be fenced off anyway.
    Carries ``step``, ``name`` (the call's) and ``seq``."""

    def __init__(self, message: str, *, step: str | None = None, name: str | None = None,
                 seq: int | None = None):
        super().__init__(message)
        self.step = step
        self.name = name
        self.seq = seq


class JournalUnavailable(KonduitError):
    """A durable call (``ctx.call_sync``) made where no journal can be written: in a handler
    that a worker runs with ``--isolation process`` (its child process has no database
    connection), or ``ctx.call_sync`` on the event loop of an async handler (use ``await
    ctx.call``)."""


class OutputInvalid(KonduitError):
    """A handler's payload does not match the step's declared output type."""


class NothingToRepair(KonduitError):
    """The execution has no degraded, failed, timed-out or cancelled step."""


class NotRedrivable(KonduitError):
    """A redrive of an execution that did not end failed, timed out or cancelled: one that
    still runs, or one that succeeded (:meth:`konduit.App.repair` re-runs the degraded steps of
    a succeeded execution)."""


class NotForkable(KonduitError):
    """A fork from a step some upstream step of which (a step it depends on, directly or not)
    did not succeed or degrade in the origin: there is no output of it to copy
    (:meth:`konduit.App.fork`; fork from an earlier step)."""


class NotAnswerable(KonduitError):
    """An answer to a step that does not wait for one (:meth:`konduit.App.answer`): not a
    ``wait_for_input`` step, not reached yet, answered already, past its deadline, or of an
    execution that no longer runs. ``step`` names it."""

    def __init__(self, message: str, *, step: str | None = None):
        super().__init__(message)
        self.step = step


class StreamError(KonduitError):
    """A durable stream refused a write or a read (docs/streams.md). ``step`` names the step
    whose stream it is (None when unknown), ``stream`` the stream's name."""

    def __init__(self, message: str, *, step: str | None = None, stream: str | None = None):
        super().__init__(message)
        self.step = step
        self.stream = stream


class StreamFull(StreamError):
    """A ``ctx.stream.write`` past the stream's bound: ``limit`` is ``"chunks"`` or
    ``"bytes"``, ``maximum`` the bound (``KONDUIT_STREAM_MAX_CHUNKS``,
    ``KONDUIT_STREAM_MAX_BYTES``). Nothing of the refused chunk is kept."""

    def __init__(self, message: str, *, step: str, stream: str, limit: str, maximum: int):
        super().__init__(message, step=step, stream=stream)
        self.limit = limit
        self.maximum = maximum


class StreamLeaseLost(StreamError):
    """A ``ctx.stream.write`` from an attempt that no longer holds its task's lease (the task
    was reclaimed, ended or cancelled): nothing was written. ``attempt`` is that attempt."""

    def __init__(self, message: str, *, step: str, stream: str, attempt: int):
        super().__init__(message, step=step, stream=stream)
        self.attempt = attempt


class StreamNotFound(StreamError):
    """A read of a stream that cannot be chosen: the name belongs to no stream of the
    execution while others exist, or several exist and no name was given. ``names`` lists the
    execution's streams."""

    def __init__(self, message: str, *, stream: str | None = None,
                 names: list[str] | None = None):
        super().__init__(message, stream=stream)
        self.names = names or []


class SettingsError(KonduitError, ValueError):
    """A ``KONDUIT_*`` environment variable holds a value konduit cannot use; the message names
    it (:mod:`konduit.settings`)."""


class CliError(KonduitError):
    """A usage problem the command line reports in one line (bad APP, bad JSON, ...)."""


class StatsError(KonduitError):
    """Stats cannot be computed as asked (a threshold that is not a duration, say)."""


class PlanError(KonduitError):
    """A plan cannot be made as asked (a window that cannot be read, say)."""


class MetricsError(KonduitError):
    """The exporter cannot start as asked (the port is taken, say)."""


class DashboardError(KonduitError):
    """The dashboard cannot start as asked (the port is taken, say)."""


class BenchError(KonduitError):
    """The engine did something a benchmark did not expect (the numbers would be meaningless)."""


class AlertError(KonduitError):
    """Bad alert options (``konduit alerts``, ``app.alerts()``), such as an unknown kind."""


class LimitKeyError(KonduitError):
    """A limit's key function (``konduit.Limit(key=)``, ``konduit.Rate(key=)``,
    ``Workflow(key=)``) raised or returned something other than a string: the start is refused,
    and the message names the workflow, the step and the function."""


class KeyNeedsCode(LimitKeyError):
    """A start-time key of the workflow (a step's per-key limit, ``max_running``'s ``key=``,
    ``fair_by=``) is a function, and this process started it by name without the workflow's
    code: it is refused rather than started without its key (which made a per-customer limit
    one limit for everybody). The fix is a key declared as a path into the input
    (``key="input.customer"``), or a start from a process with the code. Carries ``workflow``,
    ``step`` (None for the workflow's own keys), ``function`` and ``role``."""

    def __init__(self, message: str, *, workflow: str | None = None, step: str | None = None,
                 function: str | None = None, role: str | None = None):
        super().__init__(message)
        self.workflow = workflow
        self.step = step
        self.function = function
        self.role = role
