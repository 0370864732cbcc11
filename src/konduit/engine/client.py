"""The async client core: register workflows, start, wait for, cancel, repair and migrate
executions, send events. What the faces only show is read above it (:mod:`konduit.reads`)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from uuid import UUID

from konduit.core.inputs import SchemaChecker
from konduit.core.model import ExecutionStatus
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.requests import (
    AnswerRequest,
    BulkRequest,
    CancelRequest,
    EventRequest,
    ForkRequest,
    HistoryMoveRequest,
    MigrateRequest,
    MigrateWorkflowRequest,
    PruneRequest,
    RedriveRequest,
    RepairRequest,
    RetryNowRequest,
    RetryWebhookRequest,
    ScheduleRequest,
    StartRequest,
    StreamRequest,
)
from konduit.core.results import FINISHED, ExecutionResult
from konduit.core.values import check_text
from konduit.core.waits import INPUT_EVENT_PREFIX, answer_of, input_event, is_input_event
from konduit.core.webhooks import Webhook
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, translate_errors
from konduit.db.replica import Reads
from konduit.engine import forks, history, migration, retention, streams, waits, webhooks
from konduit.engine.bulk import Progress, run_bulk
from konduit.engine.finish import stop_execution
from konduit.engine.history import refuse_if_moved
from konduit.engine.ids import resolve_execution_id
from konduit.engine.registration import register_in
from konduit.engine.registry import Registry, workflow_key
from konduit.engine.repairs import repair_in
from konduit.engine.schedules import Schedules
from konduit.engine.starts import requests_of, start_requests
from konduit.engine.stored import StoredSpecs, refuse_map_repair_without_code
from konduit.engine.waits import SendResult
from konduit.errors import (
    ExecutionFailed,
    ExecutionNotFound,
    InputValidationError,
    KonduitError,
    NotAnswerable,
    blame,
    blamed,
)
from konduit.records import (
    Answer,
    BulkResult,
    MigrationRecord,
    StreamChunk,
)
from konduit.tracing import TraceContext, Tracing, capture


def coerce_execution_id(execution_id: UUID | str) -> UUID:
    """An execution's id from a UUID, its text, or anything carrying it as ``.id`` (a handle)."""
    if isinstance(execution_id, UUID):
        return execution_id
    carried = getattr(execution_id, "id", None)
    if isinstance(carried, UUID):
        return carried
    try:
        return UUID(str(execution_id))
    except ValueError:
        raise ExecutionNotFound(f"{execution_id!r} is not an execution id") from None


def execution_result(row: Row, outcomes: dict[str, str]) -> ExecutionResult:
    """The result of an execution from its row (``execution_get``,
    ``execution_list_older_than_cursor``) and the outcome of each step."""
    return ExecutionResult(
        id=UUID(str(row["id"])),
        workflow=row["workflow_name"],
        version=row["workflow_version"],
        status=row["status"],
        output=row.get("output"),
        error=row.get("error"),
        outcomes=outcomes,
        created_at=row.get("created_at"),
        finished_at=row.get("finished_at"),
    )


class Client:
    """Everything an application does to executions, as coroutines: the commands and the reads
    a caller acts on.

    Two ways to the database: ``db``, the primary, for every write, every read inside a write's
    transaction and every read a caller acts on (the status :meth:`get` and :meth:`wait` read,
    the answer of a start, what a command checks first); ``reads`` for what the pages, the API
    and the command line only show, which may trail the primary by at most the read replica's
    lag bound (:mod:`konduit.db.replica`; without a replica ``reads`` runs on the primary too).
    Those reads are not made here: the read model above the engine makes them on this client's
    ``reads`` (:class:`konduit.reads.ReadModel`)."""

    def __init__(self, db: Database, registry: Registry, *, max_payload_bytes: int = DEFAULT_MAX_BYTES,
                 tracing: Tracing = None, reads: Reads | None = None,
                 event_retention: float | None = None):
        self.db = db
        self.reads = reads if reads is not None else Reads(db)
        self.registry = registry
        self.max_payload_bytes = max_payload_bytes
        # How long a stored event is kept when its step declares no retention= (None: the
        # KONDUIT_EVENT_RETENTION variable, else 24 h).
        self.event_retention = waits.event_retention(event_retention)
        self.tracing = tracing  # see konduit.tracing: None follows the tracer provider
        self._registered: set[str] = set()
        # The workflows a start or repair may name: the registry's code, else the definitions
        # workers registered (a code-less client: konduit.Client, the API without --app).
        self.specs = StoredSpecs(registry)

    async def register(self, spec: WorkflowSpec) -> None:
        """Record a workflow version. The same definition is a no-op; one that differs only in
        policy (retries, deadlines, queue, ...) re-registers the version, its policy applying to
        tasks created from then on; one whose shape (steps, edges, joins, maps, waits) differs
        is refused, saying what changed (docs/changing-workflows.md)."""
        key = workflow_key(spec.name, spec.version)
        if key in self._registered:
            return
        async with self.db.transaction() as tx:
            revision = await register_in(tx, spec)
        # The tasks this process creates carry the revision of the policy it applies.
        spec.policy_revision = revision
        self._registered.add(key)

    async def register_all(self) -> None:
        for spec in self.registry:
            await self.register(spec)

    async def start(
        self,
        workflow: StartRequest | str,
        input: Any = None,
        *,
        trace_context: TraceContext | None = None,
        **options: Any,
    ) -> UUID:
        """Start an execution and return its id; the same idempotency key returns the same id.

        ``timeout`` is a hard limit (seconds or ``"10m"``): past it the execution ends
        ``timed_out`` and its unfinished tasks are cancelled. ``deadline_at`` is the window the
        execution should finish in, which plans are checked against. ``tags`` (text to text,
        at most 32) are stored with it for :meth:`konduit.reads.ReadModel.search`. ``run_at``
        (an aware datetime) or ``delay`` (``"10m"``) start it later: it is ``scheduled`` until
        then, and a worker's maintenance pass starts it within its interval. ``priority`` is
        added to each of its steps' priorities in the claim order (lower is claimed first).

        One statement creates the execution, its steps and all its root tasks, however many
        roots the workflow has. With tracing on it stores ``trace_context`` (default: the
        current span's) with the execution: see :mod:`konduit.tracing`.

        A workflow this client has no code of is started from the definition registered in
        the database (its newest version unless ``version`` says which); an unknown name
        raises :class:`~konduit.WorkflowNotFound` naming the registered ones. An input that
        does not match the workflow's ``input=`` raises :class:`~konduit.InputValidationError`
        naming each field; nothing is written then.

        The start is a :class:`~konduit.StartRequest`, passed unchanged by every face; the
        workflow's name, ``input`` and the request's other fields as keywords build one."""
        request = (workflow if isinstance(workflow, StartRequest)
                   else StartRequest(workflow, input, **options))
        if trace_context is None:
            trace_context = capture(self.tracing, request.workflow)
        [eid] = await start_requests(self.db, self.specs, [request], register=self.register,
                                     max_bytes=self.max_payload_bytes, trace=trace_context,
                                     one=True)
        return eid

    async def start_many(
        self, requests: Iterable[StartRequest | Mapping[str, Any]],
        *, trace_context: TraceContext | None = None,
    ) -> builtins.list[UUID]:
        """Start many executions at once and return their ids in request order.

        Each request is a :class:`~konduit.StartRequest` (or a dict of its fields: ``workflow``,
        ``input``, ``idempotency_key``, ``version``, ``deadline_at``, ``timeout``, ``tags``,
        ``run_at``, ``delay``, ``priority``), meaning what
        the same arguments mean to :meth:`start`. Every request is checked before anything is
        written, and all of them are started in one transaction with a few set-based
        statements: either every execution is started or none is. A bad request (unknown
        workflow, input that is not JSON or too big, bad timeout) raises the error
        :meth:`start` would, its message starting with ``start request <index>:``.

        Idempotency keys behave as in :meth:`start`: a key the workflow already used gives that
        execution's id; a key repeated within the call gives every request the first one's
        execution. A key reused with a different input raises
        :class:`~konduit.IdempotencyConflict` naming the key, and nothing is started. An empty
        list starts nothing and returns ``[]``. With tracing on, every execution carries
        ``trace_context`` (default: the current span's)."""
        checked = requests_of(requests)
        if trace_context is None and checked:
            trace_context = capture(self.tracing, checked[0].workflow)
        return await start_requests(self.db, self.specs, checked, register=self.register,
                                    max_bytes=self.max_payload_bytes, trace=trace_context)

    async def resolve(self, execution_id: UUID | str) -> UUID:
        """The execution an id names: the whole id, or any unique prefix or tail of it (the
        tail is what every face shows, see :func:`konduit.core.ids.short_id`). Raises
        :class:`ExecutionNotFound` when none matches (or the text cannot be an id) and
        :class:`AmbiguousExecutionId`, listing candidates, when several do."""
        return await resolve_execution_id(self.db, execution_id)

    async def get(self, execution_id: UUID | str) -> ExecutionResult:
        """An execution's status and result, by its id or a unique prefix or tail of it (one
        moved into the history too: it reads as it did)."""
        eid = await self.resolve(execution_id)
        # The hot tables first: what wait() polls is running, and a read through the history's
        # views probes every day's partition. An execution has a step from its start, so no
        # steps means it moved in between: read both again where they are.
        row = await self.db.one("execution_get", id=eid)
        steps = [] if row is None else await self.db.all("step_get_all", execution_id=eid)
        if not steps:
            row = await self.db.one("execution_get_with_history", id=eid)
            if row is None:
                raise ExecutionNotFound(f"no execution with id {eid}")
            steps = await self.db.all("step_get_all_with_history", execution_id=eid)
        assert row is not None
        return execution_result(row, {s["step"]: s["status"] for s in steps})

    async def wait(self, execution_id: UUID | str, timeout: float | None = None) -> ExecutionResult:
        """Wait for the execution to finish. Returns the result when it succeeded; raises
        :class:`ExecutionFailed` when it failed, timed out or was cancelled, and
        :class:`TimeoutError` when it is still running after ``timeout`` seconds."""
        eid = await self.resolve(execution_id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        conn = await self.db.listen_connection()
        try:
            with translate_errors():
                await conn.execute("LISTEN konduit_finished")
            # Listening first, then saying we wait, then reading the status: a finish that
            # commits before the mark is read below, one after it notifies.
            await self.db.run("execution_mark_waited_if_unfinished", id=eid)
            while True:
                result = await self.get(eid)
                if result.finished:
                    if result.status != ExecutionStatus.SUCCEEDED:
                        raise ExecutionFailed(result)
                    return result
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"execution {eid} is still {result.status} after {timeout} s"
                    )
                # Notifications wake us at once; the short timeout is the polling fallback.
                step = 1.0 if remaining is None else min(1.0, remaining)
                with translate_errors():
                    async for note in conn.notifies(timeout=step, stop_after=1):
                        if note.payload == str(eid):
                            break
        finally:
            await conn.close()

    async def cancel(self, request: CancelRequest) -> bool:
        """Cancel a running execution: its ready tasks are never claimed after this commits and
        running handlers lose their lease. Returns False when it had already finished."""
        check_text(request.reason, "reason")
        eid = await self.resolve(request.execution_id)
        try:
            async with self.db.transaction() as tx:
                finished = await stop_execution(tx, eid, ExecutionStatus.CANCELLED,
                                                request.reason)
        except ExecutionNotFound:
            await refuse_if_moved(self.db, eid, "cancel")
            raise
        if finished is not None and finished.child_ended is not None:
            # A child workflow: fail (or leave to a worker's fallback) its parent's step now.
            await waits.wake_parents(self.db, self.registry, finished.child_ended,
                                     max_payload_bytes=self.max_payload_bytes)
        return finished is not None

    async def repair(self, request: RepairRequest) -> list[str]:
        """Re-run the degraded, failed, timed-out or cancelled steps of a finished execution and
        everything downstream of them, as a new generation of their tasks. When it finishes, its
        output becomes a new version; earlier versions stay in
        :meth:`konduit.reads.ReadModel.outputs`. Returns the steps that will run again."""
        return await self._run_again(request.execution_id, redrive=False)

    async def redrive(self, request: RedriveRequest) -> list[str]:
        """Run a failed, timed-out or cancelled execution again from the steps that did not
        succeed: the failed, timed-out and cancelled ones and everything downstream of them,
        as a new generation of their tasks, on the repair's path
        (:func:`~konduit.engine.repairs.repair_in`). Every succeeded and degraded step keeps
        its output. Raises :class:`~konduit.NotRedrivable` for an execution that runs or
        succeeded. Returns the steps that will run again."""
        return await self._run_again(request.execution_id, redrive=True)

    async def _run_again(self, execution_id: UUID | str, *, redrive: bool) -> list[str]:
        """Repair or redrive (``redrive``) one execution: one path, ``repair_in``'s."""
        eid = await self.resolve(execution_id)
        row = await self.db.one("execution_get", id=eid)
        if row is None:
            await refuse_if_moved(self.db, eid, "redrive" if redrive else "repair")
            raise ExecutionNotFound(f"no execution with id {eid}")
        # Without the workflow's code, from its registered definition.
        await self.specs.load(self.db, row["workflow_name"], row["workflow_version"])
        refuse_map_repair_without_code(self.specs, row["workflow_name"], row["workflow_version"])
        async with self.db.transaction() as tx:
            return await repair_in(tx, self.specs, eid, max_payload_bytes=self.max_payload_bytes,
                                   redrive=redrive)

    async def stream(self, request: StreamRequest) -> AsyncIterator[StreamChunk]:
        """The records of a durable stream (:mod:`konduit.engine.streams`), read on the primary:
        a follower waits for what is written next."""
        eid = await self.resolve(request.execution_id)
        async for chunk in streams.follow(self.db, eid, request.name,
                                          from_offset=request.from_offset, live=request.follow):
            yield chunk

    async def fork(self, request: ForkRequest) -> UUID:
        """Start a new execution of an execution's workflow and version that copies the outputs
        of the steps ``from_step`` depends on (its ancestors, which must have succeeded or
        degraded in the origin) and runs ``from_step`` and every other step. Its input is
        ``request.input``, or the origin's when None. The fork remembers its origin and the
        step (``forked_from``, ``forked_at_step``). See :mod:`konduit.engine.forks`; returns
        the fork's id."""
        return await forks.fork(self, request)

    async def bulk(self, request: BulkRequest, *,
                   progress: Progress | None = None) -> BulkResult:
        """Cancel or redrive every execution a search finds, a batch (one short transaction)
        at a time; ``progress`` is told the counts so far after each batch. See
        :mod:`konduit.engine.bulk`."""
        return await run_bulk(self, request, progress=progress)

    async def migrate(self, request: MigrateRequest) -> MigrationRecord:
        """Move a running execution to version ``to_version`` of its workflow, in one
        transaction; raises :class:`~konduit.MigrationRefused` naming the step at fault (see
        :mod:`konduit.engine.migration`, docs/migrating-executions.md)."""
        return await migration.migrate(self.db, self.registry,
                                       await self.resolve(request.execution_id),
                                       request.to_version, register=self.register,
                                       max_payload_bytes=self.max_payload_bytes)

    async def migrate_workflow(self, request: MigrateWorkflowRequest,
                               ) -> builtins.list[MigrationRecord]:
        """Migrate every running execution of ``workflow`` at ``from_version``, each in its own
        transaction; a refused one comes back with ``migrated=False`` and the reason."""
        return await migration.migrate_all(self.db, self.registry, request.workflow,
                                           request.from_version, request.to_version,
                                           register=self.register,
                                           max_payload_bytes=self.max_payload_bytes)

    async def retry_webhook_delivery(self, request: RetryWebhookRequest) -> bool:
        """Send a failed or refused delivery again now; False when it is not one."""
        return await webhooks.retry(self.db, request.delivery_id)

    async def register_webhooks(self, hooks: Iterable[Webhook]) -> None:
        """Store webhooks so every transaction that ends an execution writes their deliveries
        (idempotent; an App registers its own before its first call)."""
        await webhooks.register(self.db, builtins.list(hooks))

    async def unregister_webhooks(self, hooks: Iterable[Webhook]) -> int:
        """Stop writing deliveries for webhooks an App no longer has; returns how many were
        registered."""
        return await webhooks.unregister(self.db, builtins.list(hooks))

    # -- events ---------------------------------------------------------------------------------

    async def send_event(self, request: EventRequest) -> SendResult:
        """Send the event ``name`` to the step waiting for it, by ``key``, by ``execution_id``
        or both: ``"woke"``, ``"started"``, ``"stored"`` or ``"no match"`` (see
        :meth:`konduit.App.send_event` and docs/durable-waits.md)."""
        if isinstance(request.name, str) and is_input_event(request.name):
            raise blamed(KonduitError(
                f"event names starting {INPUT_EVENT_PREFIX!r} are kept for wait_for_input "
                "steps: answer them with answer(execution_id, step, value)"), "name")
        with blame("execution_id"):
            eid = (None if request.execution_id is None
                   else await self.resolve(request.execution_id))
        if eid is not None:
            await refuse_if_moved(self.db, eid, f"send event {request.name!r} to")
        # This process's workflows are known to the database before it decides: an event sent
        # by key for one of them is kept even when no worker or start registered it yet.
        await self.register_all()
        waits.check_event_address(request.name, request.key)
        payload = request.payload
        if hasattr(payload, "model_dump"):  # a model instance: its JSON form
            payload = payload.model_dump(mode="json")
        await self.check_event_payload(request.name, payload, key=request.key, execution_id=eid)
        return await waits.send_event(self.db, self.registry, request.name, key=request.key,
                                      execution_id=eid, payload=payload,
                                      max_payload_bytes=self.max_payload_bytes,
                                      retention=self.event_retention)

    async def event_payload_models(self, name: str, *, key: str | None = None,
                                   execution_id: UUID | None = None) -> list[Row]:
        """The payload models declared for event ``name`` (``wait_for_event(payload=...)``
        steps that may take it, ``on_event(payload=...)`` triggers), as registered: rows of
        ``workflow_name``, ``workflow_version``, ``step`` (None for a trigger) and ``schema``."""
        return await self.db.all("event_list_payload_models", name=name, key=key,
                                 execution_id=execution_id)

    async def check_event_payload(self, name: str, payload: Any, *, key: str | None = None,
                                  execution_id: UUID | None = None) -> None:
        """Check ``payload`` against every payload model declared for the event (the
        registered ones: a process without the workflows' code checks alike); raises
        :class:`InputValidationError` naming the taker and each field at fault. Nothing is
        written before."""
        for row in await self.event_payload_models(name, key=key, execution_id=execution_id):
            schema = row["schema"]
            if not isinstance(schema, dict):
                continue
            workflow = row["workflow_name"]
            errors = SchemaChecker(schema, workflow=workflow).errors(payload)
            if errors:
                taker = (f"step {row['step']!r}" if row["step"] is not None else "the on_event "
                         "trigger") + f" of workflow {workflow!r} version {row['workflow_version']}"
                listed = "; ".join(f"{f}: {m}" for f, m in list(errors.items())[:20])
                raise blamed(InputValidationError(
                    f"the payload of event {name!r} does not match what {taker} declares: "
                    f"{listed}", errors, workflow=workflow), "payload")

    async def answer(self, request: AnswerRequest) -> Answer:
        """Answer a ``wait_for_input`` step: check ``value`` against the step's JSON Schema
        (the code's, else the registered one: both are the model's JSON Schema, so a
        process with the workflow's code and one without check alike), then send its
        internal event to that execution, recording who answered. Raises
        :class:`InputValidationError` naming each field at fault (nothing is written) and
        :class:`NotAnswerable` when the step does not wait for an answer now."""
        with blame("execution_id"):
            eid = await self.resolve(request.execution_id)
        step = request.step
        row = await self.db.one("task_get_for_answer", execution_id=eid, step=step)
        if row is None:
            await refuse_if_moved(self.db, eid, f"answer step {step!r} of")
            raise ExecutionNotFound(f"no execution with id {eid}")
        name, version = row["workflow_name"], row["workflow_version"]
        await self.specs.load(self.db, name, version)
        spec = self.specs.get(name, version)
        step_spec = next((s for s in spec.spec_json.get("steps", []) if s.get("name") == step),
                         None)
        found = answer_of(step_spec)
        if found is None:
            what = "has no step" if step_spec is None else "has no wait_for_input step"
            raise blamed(NotAnswerable(f"workflow {name!r} version {version} {what} {step!r}",
                                       step=step), "step")
        if row["execution_status"] != ExecutionStatus.RUNNING:
            raise NotAnswerable(f"execution {eid} is {row['execution_status']}: its step "
                                f"{step!r} waits for no answer", step=step)
        if row["id"] is None or row["status"] in ("ready", "running"):
            raise NotAnswerable(f"step {step!r} of execution {eid} does not wait for an answer "
                                "yet (its upstream steps run)", step=step)
        if row["status"] != "waiting" or row["wait_until"] is not None:
            raise NotAnswerable(f"step {step!r} of execution {eid} was answered or ended "
                                f"already ({row['status']})", step=step)
        if not row["before_deadline"]:
            raise NotAnswerable(f"step {step!r} of execution {eid} is past its deadline: it "
                                "takes its fallback or times out", step=step)
        value = request.value
        if hasattr(value, "model_dump"):  # the model instance itself
            value = value.model_dump(mode="json")
        errors = SchemaChecker(found.get("schema") or {}, workflow=name).errors(value)
        if errors:
            listed = "; ".join(f"{f}: {m}" for f, m in list(errors.items())[:20])
            raise blamed(InputValidationError(
                f"the answer to step {step!r} of execution {eid} is invalid: {listed}", errors,
                workflow=name), "value")
        result = await waits.send_event(
            self.db, self.registry, input_event(step), execution_id=eid,
            payload={"value": value, "answered_by": request.answered_by},
            max_payload_bytes=self.max_payload_bytes, retention=self.event_retention)
        if result != "woke":
            raise NotAnswerable(f"step {step!r} of execution {eid} no longer waits for an "
                                "answer (answered or ended meanwhile)", step=step)
        answers = [a for a in await self.db.all("event_list_answers_by_execution",
                                                execution_id=eid) if a["step"] == step]
        return Answer.from_event_row(answers[-1])

    # -- schedules ------------------------------------------------------------------------------

    async def set_schedule_paused(self, request: ScheduleRequest) -> bool:
        """Pause (``paused``) or resume a schedule's ticks; False when it was so already."""
        schedules = Schedules(self.db, self.registry, max_payload_bytes=self.max_payload_bytes)
        return await schedules.set_paused(request.name, request.paused)

    # -- retention and repair -------------------------------------------------------------------

    async def prune(self, request: PruneRequest) -> int:
        """Delete executions that finished more than ``older_than`` ago with their rows;
        returns how many were deleted (see :mod:`konduit.engine.retention`)."""
        return await retention.prune(self.db, request.older_than,
                                     include_dead_letters=request.include_dead_letters,
                                     batch_size=request.batch_size)

    async def move_to_history(self, request: HistoryMoveRequest) -> int:
        """Move executions that finished more than ``older_than`` ago (holding no dead letter)
        into the history; returns how many moved (see :mod:`konduit.engine.history`)."""
        return await history.move_finished(self.db, request.older_than,
                                           batch_size=request.batch_size)

    async def retry_now(self, request: RetryNowRequest) -> bool:
        """Make a task waiting out its backoff (ready again after a failed attempt) claimable
        now, and wake its queue's workers. False when it is not in backoff any more (a worker
        claimed it, it ended, or it was never of this execution)."""
        eid = await self.resolve(request.execution_id)
        async with self.db.transaction() as tx:
            row = await tx.one("task_retry_now_if_in_backoff", id=request.task_id,
                               execution_id=eid)
            if row is not None:
                await tx.one("task_notify_ready", queue=row["queue"])
        if row is None:
            await refuse_if_moved(self.db, eid, "retry a task of")
        return row is not None

    def with_registry(self, registry: Registry, *, max_payload_bytes: int,
                      event_retention: float | None = None) -> Client:
        """A client on the same connections that runs another registry's workflow code (the
        dashboard's API and repair, given the App's)."""
        return Client(self.db, registry, max_payload_bytes=max_payload_bytes,
                      tracing=self.tracing, reads=self.reads,
                      event_retention=event_retention or self.event_retention)

    def on_primary(self) -> Client:
        """This client with every read on the primary: for what a command answers right after
        writing (the status of executions just started), which a replica may not have yet."""
        return Client(self.db, self.registry, max_payload_bytes=self.max_payload_bytes,
                      tracing=self.tracing, reads=Reads(self.db),
                      event_retention=self.event_retention)

    @property
    def database_url(self) -> str:
        return self.db.url

    async def close(self) -> None:
        """Close the client's connections (the read replica's too)."""
        await self.reads.close()
        await self.db.close()

__all__ = ["FINISHED", "Client", "ExecutionFailed", "ExecutionResult", "KonduitError"]
