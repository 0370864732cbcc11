"""The async client core: register workflows, start, inspect, wait for and cancel executions."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from konduit.core import shape
from konduit.core.advance import ExecutionState
from konduit.core.durations import Duration
from konduit.core.model import ExecutionStatus
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.repair import plan_repair
from konduit.core.repair_contract import AutoRepairState, RepairContract
from konduit.core.repair_contract import describe as describe_auto_repair
from konduit.core.results import FINISHED, ExecutionResult
from konduit.core.search import ExecutionFilter
from konduit.core.triggers import describe as describe_trigger
from konduit.core.webhooks import Webhook
from konduit.core.workflow import WorkflowSpec
from konduit.db.database import Database, Row, Tx, translate_errors
from konduit.db.replica import Reads
from konduit.engine import migration, retention, triggers, waits, webhooks
from konduit.engine.advancer import Advancer
from konduit.engine.alerting import list_alerts
from konduit.engine.finish import stop_execution
from konduit.engine.flow import register_flow_limits
from konduit.engine.ids import resolve_execution_id
from konduit.engine.registry import Registry, workflow_key
from konduit.engine.retention import BATCH_SIZE, Prunable
from konduit.engine.schedules import Schedules
from konduit.engine.search import search_executions
from konduit.engine.stalls import open_stall
from konduit.engine.starts import (
    StartRequest,
    at_request,
    collapse_repeated_keys,
    insert_executions,
    prepare_many_off_loop,
    prepare_off_loop,
    requests_of,
)
from konduit.engine.step_rows import state_columns
from konduit.engine.stored import SpecSource, StoredSpecs, refuse_map_repair_without_code
from konduit.engine.versions import VersionReads
from konduit.engine.waits import SendResult
from konduit.errors import (
    ExecutionFailed,
    ExecutionNotFound,
    KonduitError,
    WorkflowVersionConflict,
)
from konduit.observe.budgets import own_budgets
from konduit.observe.plan import Plan, load_plan
from konduit.observe.stats import Stats, load_stats
from konduit.records import (
    AlertRecord,
    AttemptLog,
    AttemptRecord,
    ChildExecution,
    DeadLetter,
    DeadLetterWithStatus,
    ExecutionFound,
    ExecutionProgress,
    ExecutionRecord,
    ExecutionSummary,
    FailedAttempt,
    MapItem,
    MapStepCounts,
    MigrationRecord,
    OpenAttempt,
    OpenTask,
    OutputVersion,
    ParentLink,
    Payload,
    QueueDepth,
    QueueLoad,
    ScheduleRecord,
    StepBudget,
    StepMark,
    StepRecord,
    TaskRecord,
    TriggerRecord,
    WebhookDelivery,
    WorkerRecord,
    WorkerState,
    WorkflowRecord,
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


class Client(VersionReads):
    """Everything an application does with executions, as coroutines.

    Two ways to the database, chosen here and nowhere else: ``db``, the primary, for every
    write, every read inside a write's transaction and every read a caller acts on (the status
    :meth:`get` and :meth:`wait` read, the answer of a start, what a command checks first);
    ``reads`` for the lists, details and stats the pages and the API show, which may trail the
    primary by at most the read replica's lag bound (:mod:`konduit.db.replica`; without a
    replica ``reads`` runs on the primary too)."""

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
            inserted = await tx.run(
                "workflow_insert_if_absent",
                name=spec.name,
                version=spec.version,
                spec_hash=spec.spec_hash,
                shape_hash=spec.shape_hash,
                spec=Jsonb(spec.spec_json),
            )
            row = await tx.one("workflow_get_for_update", name=spec.name, version=spec.version)
            if row is None:  # deleted between the two statements: nothing to compare with
                raise WorkflowVersionConflict(f"workflow {spec.name!r} version {spec.version} "
                                              "was removed while it was being registered")
            revision = int(row["policy_revision"])
            if row["spec_hash"] != spec.spec_hash:
                changes = shape.shape_diff(shape.shape_of(row["spec"] or {}),
                                           shape.shape_of(spec.spec_json))
                if changes:
                    raise WorkflowVersionConflict(
                        f"workflow {spec.name!r} version {spec.version} is already registered "
                        f"with a different shape ({'; '.join(changes)}); a shape change needs "
                        f"a new version number (a policy change does not)")
                updated = await tx.one("workflow_update_policy_same_shape", name=spec.name,
                                       version=spec.version, spec_hash=spec.spec_hash,
                                       shape_hash=spec.shape_hash, spec=Jsonb(spec.spec_json),
                                       old_spec_hash=row["spec_hash"])
                if updated is None:  # the row is locked: only a stored shape_hash can differ
                    raise WorkflowVersionConflict(
                        f"workflow {spec.name!r} version {spec.version} is registered with "
                        f"a different shape; a shape change needs a new version number")
                revision = int(updated["revision"])
            # The declared input's schema (migration 0023) and how its start-time keys are
            # computed (0030): what code-less starts check and compute. A new
            # row without one has nothing to set (a start's statements stay as they were). After
            # a policy update above, the stored hash is this definition's.
            schema, keys = spec.input_schema, spec.start_keys
            if schema is not None or keys is not None or not inserted:
                await tx.run("workflow_set_input_schema_if_same_hash", name=spec.name,
                             version=spec.version, spec_hash=spec.spec_hash,
                             input_schema=None if schema is None else Jsonb(schema),
                             start_keys=None if keys is None else Jsonb(keys))
            # Limits of a version registered before may have changed (they are not in its
            # hash); a version new here has none to lift.
            if spec.flow_limits or not inserted:
                await register_flow_limits(tx, spec)
            # Its event triggers (wf.on_event): policy too, replaced on re-registration.
            if spec.triggers or not inserted:
                await triggers.register(tx, spec)
        # The tasks this process creates carry the revision of the policy it applies.
        spec.policy_revision = revision
        self._registered.add(key)

    async def register_all(self) -> None:
        for spec in self.registry:
            await self.register(spec)

    async def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        version: int | None = None,
        deadline_at: datetime | None = None,
        timeout: Duration | None = None,
        trace_context: TraceContext | None = None,
        tags: Mapping[str, str] | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        priority: int = 0,
        fair_key: str | None = None,
    ) -> UUID:
        """Start an execution and return its id; the same idempotency key returns the same id.

        ``timeout`` is a hard limit (seconds or ``"10m"``): past it the execution ends
        ``timed_out`` and its unfinished tasks are cancelled. ``deadline_at`` is the window the
        execution should finish in, which plans are checked against. ``tags`` (text to text,
        at most 32) are stored with it for :meth:`search`. ``run_at`` (an aware datetime) or
        ``delay`` (``"10m"``) start it later: it is ``scheduled`` until then, and a worker's
        maintenance pass starts it within its interval. ``priority`` is added to each of its
        steps' priorities in the claim order (lower is claimed first).

        One statement creates the execution, its steps and all its root tasks, however many
        roots the workflow has. With tracing on it stores ``trace_context`` (default: the
        current span's) with the execution: see :mod:`konduit.tracing`.

        A workflow this client has no code of is started from the definition registered in
        the database (its newest version unless ``version`` says which); an unknown name
        raises :class:`~konduit.WorkflowNotFound` naming the registered ones. An input that
        does not match the workflow's ``input=`` raises :class:`~konduit.InputValidationError`
        naming each field; nothing is written then."""
        request = StartRequest(workflow, input, idempotency_key, version, deadline_at, timeout,
                               tags=tags, run_at=run_at, delay=delay, priority=priority,
                               fair_key=fair_key)
        if trace_context is None:
            trace_context = capture(self.tracing, workflow)
        await self.specs.load(self.db, workflow, version)
        prepared = await prepare_off_loop(self.specs, request, max_bytes=self.max_payload_bytes,
                                          trace=trace_context)
        await self._register_unless_stored(prepared.spec)
        [eid] = await self.db.atomic(lambda tx: insert_executions(tx, [prepared]))
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
        loaded: set[tuple[str, int | None]] = set()
        for i, request in enumerate(checked):
            try:
                if (request.workflow, request.version) not in loaded:
                    await self.specs.load(self.db, request.workflow, request.version)
                    loaded.add((request.workflow, request.version))
            except KonduitError as exc:
                raise at_request(i, exc) from exc
        batch = await prepare_many_off_loop(self.specs, checked,
                                            max_bytes=self.max_payload_bytes, trace=trace_context)
        if not batch:
            return []
        owner = collapse_repeated_keys(batch)
        for spec in {workflow_key(p.spec.name, p.spec.version): p.spec for p in batch}.values():
            await self._register_unless_stored(spec)
        distinct = [p for i, p in enumerate(batch) if owner[i] == i]
        ids = await self.db.atomic(lambda tx: insert_executions(tx, distinct))
        by_index = dict(zip((i for i in range(len(batch)) if owner[i] == i), ids, strict=True))
        return [by_index[owner[i]] for i in range(len(batch))]

    async def resolve(self, execution_id: UUID | str) -> UUID:
        """The execution an id names: the whole id, or any unique prefix or tail of it (the
        tail is what every face shows, see :func:`konduit.core.ids.short_id`). Raises
        :class:`ExecutionNotFound` when none matches (or the text cannot be an id) and
        :class:`AmbiguousExecutionId`, listing candidates, when several do."""
        return await resolve_execution_id(self.db, execution_id)

    async def _register_unless_stored(self, spec: WorkflowSpec) -> None:
        """Register a definition of this process's code; one read from the database is."""
        if not self.specs.is_stored(spec):
            await self.register(spec)

    async def get(self, execution_id: UUID | str) -> ExecutionResult:
        """An execution's status and result, by its id or a unique prefix or tail of it."""
        eid = await self.resolve(execution_id)
        row = await self.db.one("execution_get", id=eid)
        if row is None:
            raise ExecutionNotFound(f"no execution with id {eid}")
        steps = await self.db.all("step_get_all", execution_id=eid)
        return self._result(row, {s["step"]: s["status"] for s in steps})

    async def view(self, execution_id: UUID | str) -> ExecutionResult:
        """What :meth:`get` answers, read where the pages' and the API's reads go (a read
        replica within its lag bound): for showing, not for acting on."""
        eid = await self.resolve(execution_id)

        async def read(db: Database) -> ExecutionResult:
            row = await db.one("execution_get", id=eid)
            if row is None:
                raise ExecutionNotFound(f"no execution with id {eid}")
            steps = await db.all("step_get_all", execution_id=eid)
            return self._result(row, {s["step"]: s["status"] for s in steps})

        return await self.reads.call(read)

    @staticmethod
    def _result(row: Row, outcomes: dict[str, str]) -> ExecutionResult:
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

    async def cancel(self, execution_id: UUID | str, reason: str = "cancelled") -> bool:
        """Cancel a running execution: its ready tasks are never claimed after this commits and
        running handlers lose their lease. Returns False when it had already finished."""
        eid = await self.resolve(execution_id)
        async with self.db.transaction() as tx:
            finished = await stop_execution(tx, eid, ExecutionStatus.CANCELLED, reason)
        if finished is not None and finished.child_ended is not None:
            # A child workflow: fail (or leave to a worker's fallback) its parent's step now.
            await waits.wake_parents(self.db, self.registry, finished.child_ended,
                                     max_payload_bytes=self.max_payload_bytes)
        return finished is not None

    async def repair(self, execution_id: UUID | str) -> list[str]:
        """Re-run the degraded, failed, timed-out or cancelled steps of a finished execution and
        everything downstream of them, as a new generation of their tasks. When it finishes, its
        output becomes a new version; earlier versions stay in :meth:`outputs`. Returns the
        steps that will run again."""
        eid = await self.resolve(execution_id)
        row = await self.db.one("execution_get", id=eid)
        if row is None:
            raise ExecutionNotFound(f"no execution with id {eid}")
        # Without the workflow's code, from its registered definition.
        await self.specs.load(self.db, row["workflow_name"], row["workflow_version"])
        refuse_map_repair_without_code(self.specs, row["workflow_name"], row["workflow_version"])
        async with self.db.transaction() as tx:
            return await repair_in(tx, self.specs, eid, max_payload_bytes=self.max_payload_bytes)

    async def migrate(self, execution_id: UUID | str, to_version: int) -> MigrationRecord:
        """Move a running execution to version ``to_version`` of its workflow, in one
        transaction; raises :class:`~konduit.MigrationRefused` naming the step at fault (see
        :mod:`konduit.engine.migration`, docs/migrating-executions.md)."""
        return await migration.migrate(self.db, self.registry, await self.resolve(execution_id),
                                       to_version, register=self.register,
                                       max_payload_bytes=self.max_payload_bytes)

    async def migrate_workflow(self, workflow: str, from_version: int,
                               to_version: int) -> builtins.list[MigrationRecord]:
        """Migrate every running execution of ``workflow`` at ``from_version``, each in its own
        transaction; a refused one comes back with ``migrated=False`` and the reason."""
        return await migration.migrate_all(self.db, self.registry, workflow, from_version,
                                           to_version, register=self.register,
                                           max_payload_bytes=self.max_payload_bytes)

    async def outputs(self, execution_id: UUID | str) -> builtins.list[OutputVersion]:
        """Every output version of an execution (repairs add versions), oldest first."""
        rows = await self.reads.all("execution_output_list", id=await self.resolve(execution_id))
        return [OutputVersion.from_row(r) for r in rows]

    async def payloads(self, execution_id: UUID | str) -> builtins.list[Payload]:
        """Every payload an execution's tasks produced: the handler's, the fallback's, and late
        results that arrived after a deadline ended their attempt (``source``), each marked
        ``current`` when it is the one downstream steps consumed."""
        rows = await self.reads.all("output_list_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [Payload.from_row(r) for r in rows]

    async def search(self, where: ExecutionFilter | None = None, *,
                     before: tuple[datetime, UUID] | None = None,
                     limit: int = 50) -> builtins.list[ExecutionFound]:
        """Executions matching ``where`` (:class:`~konduit.core.search.ExecutionFilter`: id
        start or end, idempotency key, tags, input fields, status, workflow@version, time
        range), newest first, older than ``before`` (the (created_at, id) of the previous
        page's last one). Every part is answered by an index (migration 0024)."""
        return await self.reads.call(lambda db: search_executions(
            db, where or ExecutionFilter(), before=before, limit=limit))

    async def list(
        self, *, status: str | None = None, workflow: str | None = None, limit: int = 50,
        **search: Any,
    ) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first; with any part of a search (``tags``,
        ``idempotency_key``, ``input``, ``since``, ``until``, ``id_prefix``, ``version``: see
        :class:`~konduit.core.search.ExecutionFilter`) the ones :meth:`search` finds."""
        if not search:
            rows = await self.reads.all("execution_list", status=status, workflow_name=workflow,
                                     limit=limit)
            return [self._result(r, {}) for r in rows]
        try:
            where = ExecutionFilter(status=status, workflow=workflow, **search)
        except TypeError as exc:
            raise KonduitError(f"list: {exc}") from None
        return [ExecutionResult(id=r.id, workflow=r.workflow_name, version=r.workflow_version,
                                status=r.status, output=None, error=r.error, outcomes={},
                                created_at=r.created_at, finished_at=r.finished_at)
                for r in await self.search(where, limit=limit)]

    async def tasks(self, execution_id: UUID | str) -> builtins.list[TaskRecord]:
        """Every task of an execution (all generations), with attempts and errors."""
        rows = await self.reads.all("task_list_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [TaskRecord.from_row(r) for r in rows]

    async def steps(self, execution_id: UUID | str) -> builtins.list[StepRecord]:
        """Every step of an execution with its join counters and timings (fan-in wait)."""
        rows = await self.reads.all("step_get_all", execution_id=await self.resolve(execution_id))
        return [StepRecord.from_row(r) for r in rows]

    async def dead_letters(self, limit: int = 50) -> builtins.list[DeadLetter]:
        """Tasks that failed for good (retries exhausted or non-retryable), newest first."""
        return [DeadLetter.from_row(r) for r in await self.reads.all("task_list_dead", limit=limit)]

    async def workers(self, stale_seconds: float | None = None) -> builtins.list[WorkerRecord]:
        """Live workers (not stopped, heard from within ``stale_seconds``, else within their own
        lease): host, pid, queues, workflows served, isolation, slots, running tasks, abandoned
        threads and ``heartbeat_age`` in seconds."""
        rows = await self.reads.all("worker_list_live", stale_seconds=stale_seconds)
        return [WorkerRecord.from_row(r) for r in rows]

    async def alerts(self, *, include_resolved: bool = False, kind: str | None = None,
                     workflow: str | None = None, limit: int = 100) -> builtins.list[AlertRecord]:
        """Stored alerts, newest first: open ones, or resolved ones too (docs/alerts.md)."""
        return await self.reads.call(lambda db: list_alerts(
            db, include_resolved=include_resolved, kind=kind, workflow=workflow, limit=limit))

    async def stall(self, execution_id: UUID | str) -> AlertRecord | None:
        """The open ``execution_stalled`` alert of an execution (nothing of it can run, and the
        watchdog's fan-in decision could not move it), or None."""
        eid = await self.resolve(execution_id)
        return await self.reads.call(lambda db: open_stall(db, eid))

    async def webhook_deliveries(self, *, status: str | None = None,
                                 execution_id: UUID | str | None = None,
                                 limit: int = 100) -> builtins.list[WebhookDelivery]:
        """Webhook deliveries, newest first (docs/webhooks.md), optionally of one status
        (pending, delivered, failed, refused) or of one execution."""
        eid = None if execution_id is None else await self.resolve(execution_id)
        rows = await self.reads.call(lambda db: webhooks.deliveries(
            db, status=status, execution_id=eid, limit=limit))
        return [WebhookDelivery.from_row(r) for r in rows]

    async def retry_webhook_delivery(self, delivery_id: UUID | str) -> bool:
        """Send a failed or refused delivery again now; False when it is not one."""
        return await webhooks.retry(self.db, delivery_id)

    async def register_webhooks(self, hooks: Iterable[Webhook]) -> None:
        """Store webhooks so every transaction that ends an execution writes their deliveries
        (idempotent; an App registers its own before its first call)."""
        await webhooks.register(self.db, builtins.list(hooks))

    async def unregister_webhooks(self, hooks: Iterable[Webhook]) -> int:
        """Stop writing deliveries for webhooks an App no longer has; returns how many were
        registered."""
        return await webhooks.unregister(self.db, builtins.list(hooks))

    # -- events ---------------------------------------------------------------------------------

    async def send_event(self, name: str, *, key: str | None = None,
                         execution_id: UUID | str | None = None, payload: Any = None) -> SendResult:
        """Send the event ``name`` to the step waiting for it, by ``key``, by ``execution_id``
        or both: ``"woke"``, ``"started"``, ``"stored"`` or ``"no match"`` (see
        :meth:`konduit.App.send_event` and docs/durable-waits.md)."""
        eid = None if execution_id is None else await self.resolve(execution_id)
        # This process's workflows are known to the database before it decides: an event sent
        # by key for one of them is kept even when no worker or start registered it yet.
        await self.register_all()
        return await waits.send_event(self.db, self.registry, name, key=key, execution_id=eid,
                                      payload=payload, max_payload_bytes=self.max_payload_bytes,
                                      retention=self.event_retention)

    async def triggers(self, workflow: str | None = None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (of ``workflow``) with their open bursts or batches,
        pending events and last event (docs/events.md)."""
        return [TriggerRecord.from_row({**r, "mode": r["spec"].get("mode", "start"),
                                        "description": describe_trigger(r["spec"])})
                for r in await triggers.list_triggers(self.db, workflow)]

    # -- schedules ------------------------------------------------------------------------------

    def _schedules(self) -> Schedules:
        return Schedules(self.db, self.registry, max_payload_bytes=self.max_payload_bytes)

    async def schedules(self) -> builtins.list[ScheduleRecord]:
        """Every stored schedule with its next tick and the execution of its latest tick."""
        return [ScheduleRecord.from_row(r) for r in await self._schedules().list()]

    async def pause_schedule(self, name: str) -> bool:
        """Stop starting ``name``'s ticks; False when it was paused already."""
        return await self._schedules().set_paused(name, True)

    async def resume_schedule(self, name: str) -> bool:
        """Start ``name``'s ticks again; False when it was not paused."""
        return await self._schedules().set_paused(name, False)

    # -- retention and repair -------------------------------------------------------------------

    async def prune(self, older_than: Duration, *, include_dead_letters: bool = False,
                    batch_size: int = BATCH_SIZE) -> int:
        """Delete executions that finished more than ``older_than`` ago with their rows;
        returns how many were deleted (see :mod:`konduit.engine.retention`)."""
        return await retention.prune(self.db, older_than,
                                     include_dead_letters=include_dead_letters,
                                     batch_size=batch_size)

    async def count_prunable(self, older_than: Duration) -> Prunable:
        """What :meth:`prune` with the same ``older_than`` would consider, deleting nothing."""
        return await retention.count_prunable(self.db, older_than)

    async def auto_repair_status(self, execution_id: UUID | str) -> str | None:
        """How the automatic repair (``repair_within``) of an execution stands, as one line,
        or None when its workflow has no repair contract or it is not covered by it."""
        eid = await self.resolve(execution_id)
        row = await self.db.one("execution_get_auto_repair", id=eid)
        if row is None:
            raise ExecutionNotFound(f"no execution with id {eid}")
        state = AutoRepairState(
            status=row["status"], finished_at=row["finished_at"],
            auto_repair_at=row["auto_repair_at"], auto_repair_error=row["auto_repair_error"],
            degraded=tuple(row["degraded"]), contract=RepairContract.from_spec(row["spec"]),
        )
        return describe_auto_repair(state, datetime.now(UTC))

    async def workflow_served(self, name: str, version: int) -> bool:
        """Whether any live worker claims tasks of workflow ``name`` at ``version``."""
        row = await self.db.one("worker_serving_exists", workflow=workflow_key(name, version))
        return bool(row and row["serving"])


    # -- what the pages and the API read --------------------------------------------------------

    async def execution(self, execution_id: UUID | str) -> ExecutionRecord:
        """One execution whole (input, output, window, limits); raises
        :class:`ExecutionNotFound`."""
        eid = await self.resolve(execution_id)

        async def read(db: Database) -> ExecutionRecord:
            row = await db.one("execution_get", id=eid)
            if row is None:  # raised inside: a replica that lacks it hands over to the primary
                raise ExecutionNotFound(f"no execution with id {eid}")
            return ExecutionRecord.from_row(row)

        return await self.reads.call(read)

    async def page(self, *, status: str | None = None, workflow: str | None = None,
                   before: tuple[datetime, UUID] | None = None,
                   limit: int = 50) -> builtins.list[ExecutionSummary]:
        """Executions newest first, older than ``before`` (the (created_at, id) of the previous
        page's last one): keyset pages, stable while executions start."""
        before_at, before_id = before if before is not None else (None, None)
        rows = await self.reads.all("execution_list_older_than_cursor", status=status,
                                 workflow_name=workflow, before_at=before_at,
                                 before_id=before_id, limit=limit)
        return [ExecutionSummary.from_row(r) for r in rows]

    async def progress(self, ids: Iterable[UUID]) -> builtins.list[ExecutionProgress]:
        """How each of these executions stands now (unknown ids are left out)."""
        wanted = builtins.list(ids)
        if not wanted:
            return []
        rows = await self.reads.all("execution_status_many", ids=wanted)
        return [ExecutionProgress.from_row(r) for r in rows]

    async def marked_steps(self, ids: Iterable[UUID]) -> builtins.list[StepMark]:
        """The degraded, failed and timed-out steps of these executions."""
        wanted = builtins.list(ids)
        if not wanted:
            return []
        rows = await self.reads.all("step_list_degraded_or_failed_for_executions", ids=wanted)
        return [StepMark.from_row(r) for r in rows]

    async def workflows(self) -> builtins.list[WorkflowRecord]:
        """Every registered workflow version with its stored definition."""
        return [WorkflowRecord.from_row(r) for r in await self.reads.all("workflow_list_with_spec")]

    async def workflow(self, name: str, version: int) -> WorkflowRecord | None:
        """One registered workflow version, or None."""
        row = await self.reads.one("workflow_get", name=name, version=version)
        return None if row is None else WorkflowRecord.from_row(row)

    async def attempts(self, execution_id: UUID | str, *,
                       except_steps: Iterable[str] = ()) -> builtins.list[AttemptRecord]:
        """Every attempt of an execution's tasks, oldest first, but those of ``except_steps``
        (the map steps a page shows as one row each)."""
        eid = await self.resolve(execution_id)
        skipped = builtins.list(except_steps)
        if skipped:
            rows = await self.reads.all("attempt_list_by_execution_except_steps",
                                     execution_id=eid, steps=skipped)
        else:
            rows = await self.reads.all("attempt_list_by_execution", execution_id=eid)
        return [AttemptRecord.from_row(r) for r in rows]

    async def attempt_logs(self, execution_id: UUID | str, *,
                           limit: int | None = None) -> builtins.list[AttemptLog]:
        """What the handlers of an execution logged, attempt by attempt, oldest first (only
        attempts that logged anything, at most ``limit`` of them; see ``Context.log``)."""
        rows = await self.reads.all("attempt_log_list_by_execution",
                                 execution_id=coerce_execution_id(execution_id), limit=limit)
        return [AttemptLog.from_row(r) for r in rows]

    async def failed_attempts(self, execution_id: UUID | str,
                              per_step: int) -> builtins.list[FailedAttempt]:
        """The attempts that ended with an error, at most ``per_step`` of each step."""
        rows = await self.reads.all("attempt_list_failed_by_execution",
                                 execution_id=await self.resolve(execution_id),
                                 per_step=per_step)
        return [FailedAttempt.from_row(r) for r in rows]

    async def map_counts(self, execution_id: UUID | str,
                         steps: Iterable[str]) -> builtins.list[MapStepCounts]:
        """For each of these (map) steps and generation: tasks per status, tries, durations."""
        wanted = builtins.list(steps)
        if not wanted:
            return []
        rows = await self.reads.all("task_summarize_by_step",
                                 execution_id=await self.resolve(execution_id), steps=wanted)
        return [MapStepCounts.from_row(r) for r in rows]

    async def map_items(self, execution_id: UUID | str, step: str, *, status: str | None = None,
                        from_index: int = 0, limit: int = 100) -> builtins.list[MapItem]:
        """A page of one step's tasks of its latest generation, in item order, from
        ``from_index`` on, optionally of one status."""
        rows = await self.reads.all("task_list_by_step_page",
                                 execution_id=await self.resolve(execution_id), step=step,
                                 status=status, from_index=from_index, limit=limit)
        return [MapItem.from_row(r) for r in rows]

    async def dead_letter_page(self, *, before: tuple[datetime, int] | None = None,
                               limit: int = 100) -> builtins.list[DeadLetterWithStatus]:
        """Dead letters newest first, older than ``before`` (the (finished_at, id) of the
        previous page's last one), each with its execution's status."""
        before_at, before_id = before if before is not None else (None, None)
        rows = await self.reads.all("task_list_dead_older_than_cursor", before_at=before_at,
                                 before_id=before_id, limit=limit)
        return [DeadLetterWithStatus.from_row(r) for r in rows]

    async def parent(self, execution_id: UUID | str) -> ParentLink | None:
        """The execution whose child-workflow step started this one, or None."""
        row = await self.reads.one("execution_parent_of",
                                execution_id=await self.resolve(execution_id))
        return None if row is None else ParentLink.from_row(row)

    async def children(self, execution_id: UUID | str) -> builtins.list[ChildExecution]:
        """The executions this one's child-workflow steps started."""
        rows = await self.reads.all("execution_children_list",
                                 execution_id=await self.resolve(execution_id))
        return [ChildExecution.from_row(r) for r in rows]

    async def budgets(self, execution_id: UUID | str) -> builtins.list[StepBudget]:
        """Each step's time budget in the latest generation (a window may have cut it)."""
        rows = await self.reads.all("task_list_budgets_by_execution",
                                 execution_id=await self.resolve(execution_id))
        return [StepBudget.from_row(r) for r in rows]

    async def open_tasks(self, execution_id: UUID | str, *,
                         limit: int = 500) -> builtins.list[OpenTask]:
        """Why an execution is where it is: its unfinished tasks (ready, in backoff, running
        with their worker's heartbeat age, waiting for an event, a timer or a child) and the
        tasks that made a durable wait, at most ``limit``."""
        rows = await self.reads.all("task_list_open_or_waited_by_execution",
                                 execution_id=await self.resolve(execution_id), limit=limit)
        return [OpenTask.from_row(r) for r in rows]

    async def retry_now(self, execution_id: UUID | str, task_id: int) -> bool:
        """Make a task waiting out its backoff (ready again after a failed attempt) claimable
        now, and wake its queue's workers. False when it is not in backoff any more (a worker
        claimed it, it ended, or it was never of this execution)."""
        eid = await self.resolve(execution_id)
        async with self.db.transaction() as tx:
            row = await tx.one("task_retry_now_if_in_backoff", id=task_id, execution_id=eid)
            if row is not None:
                await tx.one("task_notify_ready", queue=row["queue"])
        return row is not None

    async def queue_loads(self) -> builtins.list[QueueLoad]:
        """Per queue and workflow version: ready depth, due, running, waiting, oldest-ready
        age (the queue page)."""
        rows = await self.reads.all("task_count_open_by_queue_and_workflow")
        return [QueueLoad.from_row(r) for r in rows]

    async def running_count(self) -> int:
        """How many executions are running now."""
        row = await self.reads.one("execution_count_running")
        return int(row["running"]) if row else 0

    async def queues(self) -> builtins.list[QueueDepth]:
        """Ready tasks per queue and workflow, how many are due and the oldest due one's age."""
        return [QueueDepth.from_row(r) for r in await self.reads.all("task_count_ready_by_queue")]

    async def recent_workers(self, since_seconds: float) -> builtins.list[WorkerState]:
        """Every worker heard from within ``since_seconds``: alive, stopped or dead."""
        rows = await self.reads.all("worker_list_recent_with_liveness", since_seconds=since_seconds)
        return [WorkerState.from_row(r) for r in rows]

    async def running_attempts(self, limit: int) -> builtins.list[OpenAttempt]:
        """The attempts running now (hedges too), with their worker, at most ``limit``."""
        rows = await self.reads.all("attempt_list_open_with_worker", limit=limit)
        return [OpenAttempt.from_row(r) for r in rows]

    async def stats(self, workflow: str | None = None, *, history: Duration = "24h",
                    fan_in_alert: Duration = "20s", consecutive: int = 2) -> Stats:
        """``konduit stats``: per branch and join over ``history``, with the fan-in alerts."""
        return await self.reads.call(lambda db: load_stats(
            db, workflow, history=history, fan_in_alert=fan_in_alert, consecutive=consecutive))

    async def plan(self, spec: WorkflowSpec, *, history: Duration = "7d",
                   start: datetime | None = None, window: datetime | None = None) -> Plan:
        """``konduit plan``: ``spec``'s critical path from its history, and the window's risk."""
        return await load_plan(self.db, spec, history=history, start=start, window=window)

    async def own_budgets(self, spec: WorkflowSpec) -> dict[str, float]:
        """The budget each step with a deadline would get now, before any window."""
        return await own_budgets(self.db, spec)

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

async def repair_in(tx: Tx, registry: SpecSource, eid: UUID, *, max_payload_bytes: int) -> list[str]:
    """:meth:`Client.repair` inside the caller's transaction (the automatic repair claims the
    execution in the same one): lock it, plan, reopen it, start the re-run steps."""
    row = await tx.one("execution_lock", id=eid)
    if row is None:
        raise ExecutionNotFound(f"no execution with id {eid}")
    if row["status"] in (ExecutionStatus.RUNNING, ExecutionStatus.PENDING,
                         ExecutionStatus.SCHEDULED, ExecutionStatus.CANCELLED):
        raise KonduitError(
            f"execution {eid} is {row['status']}: only a finished, not cancelled, "
            "execution can be repaired"
        )
    spec = registry.get(row["workflow_name"], row["workflow_version"])
    steps = await tx.all("step_get_all", execution_id=eid)
    routes = await tx.all("task_list_routes_latest", execution_id=eid)
    plan = plan_repair(
        spec,
        {s["step"]: s["status"] for s in steps},
        {r["step"]: frozenset(r["routes"]) if r["routes"] is not None else None
         for r in routes},
    )
    reopened = await tx.one(
        "execution_reopen_if_finished", id=eid, steps_pending=len(plan.rerun)
    )
    assert reopened is not None
    names = list(plan.rerun)
    states = [plan.states[n] for n in names]
    await tx.run(
        "step_reset_many",
        execution_id=eid,
        steps=names,
        **state_columns(states),
    )
    advancer = Advancer(
        tx, spec, eid, ExecutionState(ExecutionStatus.RUNNING, len(plan.rerun)), reopened["generation"],
        max_payload_bytes=max_payload_bytes,
    )
    await advancer.start_steps(list(plan.start))
    return names


__all__ = ["FINISHED", "Client", "ExecutionFailed", "ExecutionResult", "KonduitError"]
