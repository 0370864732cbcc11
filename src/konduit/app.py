"""``konduit.App``: the registry of workflows plus a synchronous face over the async core.

Sync calls run on a private event-loop thread (one per App), so there is one implementation of
every operation, in :mod:`konduit.engine.client`, and no hand-written sync twin.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar, overload
from uuid import UUID

from konduit.core.durations import Duration, format_duration
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.search import ExecutionFilter
from konduit.core.webhooks import Webhook, check_unique
from konduit.core.workflow import Workflow
from konduit.db.connect import open_database
from konduit.db.database import Database, resolve_url
from konduit.db.migrate import migrate
from konduit.db.replica import Reads, read_settings
from konduit.engine.client import Client, ExecutionResult, coerce_execution_id
from konduit.engine.registry import Registry
from konduit.engine.retention import BATCH_SIZE, Prunable, retention_seconds
from konduit.engine.starts import StartRequest, requests_of
from konduit.engine.waits import event_retention as event_retention_seconds
from konduit.errors import KonduitError, WorkflowDefinitionError
from konduit.logs import bind_worker
from konduit.loop_thread import LoopThread
from konduit.reads import ReadModel
from konduit.records import (
    AlertRecord,
    AttemptLog,
    DeadLetter,
    ExecutionFound,
    MigrationRecord,
    OutputVersion,
    Payload,
    ScheduleRecord,
    StepRecord,
    TaskRecord,
    TriggerRecord,
    VersionState,
    WebhookDelivery,
    WorkerRecord,
)
from konduit.tracing import AttemptTracer, Tracing
from konduit.tracing import active as tracing_active
from konduit.tracing import capture as capture_trace
from konduit.tracing import check_mode as check_tracing
from konduit.worker.config import WorkerConfig
from konduit.worker.worker import Worker

T = TypeVar("T")
log = logging.getLogger(__name__)


class Operates(Protocol):
    """What a handle calls: :class:`App` or :class:`konduit.Client`."""

    def wait(self, execution_id: UUID | str, timeout: float | None = None) -> ExecutionResult: ...

    def status(self, execution_id: UUID | str) -> ExecutionResult: ...

    def cancel(self, execution_id: UUID | str) -> bool: ...


class ExecutionHandle:
    """A started execution (of an :class:`App` or a :class:`konduit.Client`)."""

    def __init__(self, app: Operates, execution_id: UUID):
        self.app = app
        self.id = execution_id

    def wait(self, timeout: float | None = None) -> ExecutionResult:
        """Block until it finishes: the result if it succeeded; raises ``ExecutionFailed`` if it
        failed, timed out or was cancelled, ``TimeoutError`` if still running after ``timeout``."""
        return self.app.wait(self.id, timeout)

    def status(self) -> ExecutionResult:
        """How the execution stands now."""
        return self.app.status(self.id)

    def cancel(self) -> bool:
        """Cancel it; False when it had already finished."""
        return self.app.cancel(self.id)

    def __repr__(self) -> str:
        return f"ExecutionHandle({self.id})"


class App:
    """The workflows an application knows and the database they run on.

    ``database_url`` falls back to ``KONDUIT_DATABASE_URL``, then to the embedded server (which
    is migrated automatically; a real server is migrated with ``konduit db migrate``).

    ``retention="30d"``: every worker of this App prunes executions that finished more than that
    long ago, every few minutes (see :meth:`prune`); None (the default) keeps everything.

    ``event_retention="24h"``: how long :meth:`send_event` keeps an event no step waits for yet
    when the step that may take it declares no ``retention=`` (None: ``KONDUIT_EVENT_RETENTION``,
    else 24 h); see docs/durable-waits.md.

    ``tracing``: OpenTelemetry traces, one per execution with a span per attempt, parented by
    the span that called :meth:`start` (needs ``pip install 'konduit-pg[otel]'``). ``None``
    (the default) traces once the application set a global tracer provider, ``True`` always,
    a ``TracerProvider`` always and into that provider, ``False`` never; see
    docs/observability.md.

    ``webhooks=[konduit.Webhook(url, events=..., secret=...)]``: signed POSTs of execution and
    alert events, written to an outbox with the event and sent by this App's workers (see
    :class:`konduit.Webhook` and docs/webhooks.md).

    ``read_database_url`` (else ``KONDUIT_READ_DATABASE_URL``): a streaming replica of the
    database for the reads that may be a little stale (lists, searches, details and stats;
    never :meth:`status` or :meth:`wait`), as long as it is at most ``read_max_lag`` seconds
    (else ``KONDUIT_READ_MAX_LAG``, else 10) behind; see docs/read-replicas.md.
    """

    def __init__(
        self,
        workflows: Iterable[Workflow] = (),
        database_url: str | None = None,
        *,
        pool_size: int = 10,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        retention: Duration | None = None,
        tracing: Tracing = None,
        webhooks: Iterable[Webhook] = (),
        read_database_url: str | None = None,
        read_max_lag: float | None = None,
        event_retention: Duration | None = None,
    ):
        self.registry = Registry(workflows)
        self.read_database_url, self.read_max_lag = read_settings(read_database_url,
                                                                  read_max_lag)
        self.tracing = check_tracing(tracing)
        self.webhooks = check_unique(webhooks)
        self.retention = None if retention is None else retention_seconds(retention)
        self.event_retention = event_retention_seconds(event_retention)
        self._check_retention()
        self.max_payload_bytes = max_payload_bytes
        self._database_url = database_url
        self._resolved_url: str | None = None
        self.pool_size = pool_size
        self._loop: LoopThread | None = None
        self._client: Client | None = None
        self._lock = threading.Lock()

    def add(self, workflow: Workflow) -> None:
        """Register one more workflow (before the first start or worker)."""
        self.registry.add(workflow)
        self._check_retention()

    def _check_retention(self) -> None:
        # Pruning an execution before its repair window closes would drop the repair it is owed.
        if self.retention is None:
            return
        for spec in self.registry:
            if spec.repair is not None and spec.repair.within >= self.retention:
                raise WorkflowDefinitionError(
                    f"repair_within ({format_duration(spec.repair.within)}) must be shorter than "
                    f"the App's retention ({format_duration(self.retention)}): its executions "
                    "would be pruned before their automatic repair", workflow=spec.name)

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The URL this App uses (resolving the fallbacks, which starts the embedded server when
        it is the one)."""
        if self._resolved_url is None:
            self._resolved_url = resolve_url(self._database_url)
        return self._resolved_url

    def _portal(self) -> LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread("konduit-app")
            return self._loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._portal().run(coro)

    async def _open_database(self, max_size: int, *, name: str = "konduit",
                             check_schema: bool = True, wait: float | None = 0.0) -> Database:
        db = await open_database(self._database_url, max_size=max_size, name=name,
                                 check_schema=check_schema, wait=wait)
        self._resolved_url = db.url
        return db

    async def client_async(self) -> Client:
        """The async client (created on first use, on the caller's event loop), for code already
        inside an event loop: ``await (await app.client_async()).start("name", input)``. It is
        the core the sync methods run on: ``start``, ``start_many``, ``wait``, ``get`` (the
        status), ``cancel``, ``repair``, ``send_event`` are coroutines of
        :class:`konduit.engine.client.Client` (the reads, ``list`` and the rest, of
        :meth:`reads_async`), returning ids and the same records. Use it
        from one event loop only, and not beside the sync methods (those run on the App's own
        loop thread)."""
        if self._client is None:
            db = await self._open_database(self.pool_size)
            client = Client(db, self.registry, max_payload_bytes=self.max_payload_bytes,
                            event_retention=self.event_retention,
                            tracing=self.tracing,
                            reads=Reads(db, self.read_database_url, max_lag=self.read_max_lag))
            # Before the first finish this App's process may commit (a cancel): the outbox
            # statement reads the registered webhooks.
            await client.register_webhooks(self.webhooks)
            self._client = client
        return self._client

    async def reads_async(self) -> ReadModel:
        """The async read model on the client's connections (:meth:`client_async`): every
        read the sync methods show (``list``, ``search``, ``tasks``, ``steps``, ``alerts``, ...)
        as a coroutine of :class:`konduit.reads.ReadModel`, returning the same records."""
        return ReadModel((await self.client_async()).reads)

    def _read(self, call: Callable[[ReadModel], Coroutine[Any, Any, T]]) -> T:
        """Run one ReadModel coroutine on the App's loop thread, as :meth:`_do` runs a Client's."""

        async def through_reads() -> T:
            return await call(await self.reads_async())

        return self._call(through_reads())

    def _do(self, call: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
        """Run one Client coroutine on the App's loop thread: the whole sync face is this, so
        each method is one hop to the loop (the client is made there on first use)."""

        async def through_client() -> T:
            return await call(await self.client_async())

        return self._call(through_client())

    # -- the API --------------------------------------------------------------------------------

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        version: int | None = None,
        deadline_at: datetime | None = None,
        timeout: Duration | None = None,
        tags: Mapping[str, str] | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        priority: int = 0,
        fair_key: str | None = None,
    ) -> ExecutionHandle:
        """Start an execution of the latest registered version (or ``version``); see
        :meth:`konduit.engine.client.Client.start`. ``tags`` are searched by
        (:meth:`search`); ``run_at``/``delay`` start it later (status ``scheduled`` until
        then); ``priority`` is added to its steps' priorities (lower is claimed first);
        ``fair_key`` is used instead of the workflow's ``fair_by`` (docs/fairness.md)."""
        # The caller's span is in this thread's context, not in the App's loop thread.
        trace_context = capture_trace(self.tracing, workflow)
        eid = self._do(
            lambda c: c.start(workflow, input, idempotency_key=idempotency_key, version=version,
                              deadline_at=deadline_at, timeout=timeout,
                              trace_context=trace_context, tags=tags, run_at=run_at,
                              delay=delay, priority=priority, fair_key=fair_key)
        )
        return ExecutionHandle(self, eid)

    def start_many(
        self, requests: Iterable[StartRequest | Mapping[str, Any]]
    ) -> builtins.list[ExecutionHandle]:
        """Start many executions in one transaction and a few statements; handles come back in
        request order. Each request is a :class:`konduit.StartRequest` or a dict of its fields
        (``workflow``, ``input``, ``idempotency_key``, ``version``, ``deadline_at``,
        ``timeout``, ``tags``, ``run_at``, ``delay``, ``priority``); all start or none does. See
        :meth:`konduit.engine.client.Client.start_many`."""
        checked = requests_of(requests)
        trace_context = capture_trace(self.tracing, checked[0].workflow) if checked else None
        ids = self._do(lambda c: c.start_many(checked, trace_context=trace_context))
        return [ExecutionHandle(self, eid) for eid in ids]

    def handle(self, execution_id: UUID | str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return ExecutionHandle(self, coerce_execution_id(execution_id))

    def wait(self, execution_id: UUID | str, timeout: float | None = None) -> ExecutionResult:
        """Block until the execution finishes; see :meth:`ExecutionHandle.wait`."""
        return self._do(lambda c: c.wait(execution_id, timeout))

    def status(self, execution_id: UUID | str) -> ExecutionResult:
        """How an execution stands now: status, output, error, each step's outcome."""
        return self._do(lambda c: c.get(execution_id))

    def cancel(self, execution_id: UUID | str) -> bool:
        """Cancel a running execution; False when it had already finished."""
        return self._do(lambda c: c.cancel(execution_id))

    def send_event(self, name: str, *, key: str | None = None,
                   execution_id: UUID | str | None = None, payload: Any = None) -> str:
        """Send the event ``name`` to the step that waits for it (``wf.wait_for_event``), by
        ``key`` (what the step's ``key=`` computed), by ``execution_id``, or both. Returns
        ``"woke"`` (a waiting task took it before its deadline and succeeds with ``payload``),
        ``"stored"`` (no task waits yet, but one may: a registered workflow's keyed step waits
        for this event, in an execution running or not started yet, or the named execution has
        not reached its step; it is kept for the step's ``retention=``, else ``event_retention``,
        and the first matching task that waits before then consumes it) or ``"no match"`` (no
        step could ever take it: no workflow waits for this event by key, the named execution
        is unknown or finished, or its step already ended; nothing is kept). An event is
        consumed at most once (docs/durable-waits.md)."""
        return self._do(lambda c: c.send_event(name, key=key, execution_id=execution_id,
                                               payload=payload))

    def repair(self, execution_id: UUID | str) -> builtins.list[str]:
        """Re-run the degraded/failed branches of a finished execution and what depends on
        them; returns the steps that run again. See :meth:`konduit.engine.client.Client.repair`."""
        return self._do(lambda c: c.repair(execution_id))

    def prune(self, older_than: Duration, *, include_dead_letters: bool = False,
              batch_size: int = BATCH_SIZE) -> int:
        """Delete executions that finished more than ``older_than`` ago (``"7d"``, or seconds)
        with every row of theirs, ``batch_size`` executions per transaction; returns how many
        executions were deleted. Pending and running executions are never touched; executions
        holding a dead letter that no repair superseded are kept unless
        ``include_dead_letters``. See :mod:`konduit.engine.retention`."""
        return self._do(lambda c: c.prune(older_than, include_dead_letters=include_dead_letters,
                                          batch_size=batch_size))

    def count_prunable(self, older_than: Duration) -> Prunable:
        """What :meth:`prune` with the same ``older_than`` would consider, deleting nothing:
        ``finished`` executions, ``dead_letters`` of them held by a dead letter."""
        return self._read(lambda c: c.count_prunable(older_than))

    def auto_repair_status(self, execution_id: UUID | str) -> str | None:
        """How the automatic repair (``repair_within``) of an execution stands, as one line
        (``auto-repaired at ... (repair_within=24h)``, ``auto-repair pending: ...``), or None
        when its workflow has no repair contract or the execution is not covered by it."""
        return self._read(lambda c: c.auto_repair_status(execution_id))

    def outputs(self, execution_id: UUID | str) -> builtins.list[OutputVersion]:
        """Every output version of an execution, oldest first (repairs add versions)."""
        return self._read(lambda c: c.outputs(execution_id))

    def payloads(self, execution_id: UUID | str) -> builtins.list[Payload]:
        """Every payload of an execution's tasks, late results included; see
        :meth:`konduit.engine.client.Client.payloads`."""
        return self._read(lambda c: c.payloads(execution_id))

    def list(self, *, status: str | None = None, workflow: str | None = None,
             limit: int = 50, **search: Any) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first (without outputs: use :meth:`status`); given any
        part of a search (``tags``, ``idempotency_key``, ``input``, ``since``, ``until``,
        ``id_prefix``, ``version``), the ones it finds (:meth:`search` returns them with
        their tags)."""
        return self._read(lambda c: c.list(status=status, workflow=workflow, limit=limit,
                                           **search))

    def search(self, where: ExecutionFilter | None = None, *,
               limit: int = 50, **parts: Any) -> builtins.list[ExecutionFound]:
        """Find executions, newest first: by ``where`` (a :class:`konduit.ExecutionFilter`) or
        its parts as keywords (``id_prefix``, ``idempotency_key``, ``tags``, ``input``,
        ``status``, ``workflow``, ``version``, ``since``, ``until``). Index-backed."""
        if where is not None and parts:
            raise KonduitError("give a filter or its parts as keywords, not both")
        try:
            found = where if where is not None else ExecutionFilter(**parts)
        except TypeError as exc:
            raise KonduitError(f"search: {exc}") from None
        return self._read(lambda c: c.search(found, limit=limit))

    def tasks(self, execution_id: UUID | str) -> builtins.list[TaskRecord]:
        """Every task of an execution (all generations), with attempts and errors."""
        return self._read(lambda c: c.tasks(execution_id))

    def steps(self, execution_id: UUID | str) -> builtins.list[StepRecord]:
        """Every step of an execution with its join counters and timings (fan-in wait)."""
        return self._read(lambda c: c.steps(execution_id))

    def attempt_logs(self, execution_id: UUID | str) -> builtins.list[AttemptLog]:
        """What the execution's handlers logged (``logging`` and ``ctx.log``), attempt by
        attempt, oldest first; attempts that logged nothing are left out."""
        return self._read(lambda c: c.attempt_logs(execution_id))

    def dead_letters(self, limit: int = 50) -> builtins.list[DeadLetter]:
        """Tasks that failed for good (retries exhausted or non-retryable), newest first."""
        return self._read(lambda c: c.dead_letters(limit))

    def workers(self, stale_seconds: float | None = None) -> builtins.list[WorkerRecord]:
        """Live workers; see :meth:`konduit.engine.client.Client.workers`."""
        return self._read(lambda c: c.workers(stale_seconds))

    def alerts(self, *, include_resolved: bool = False, kind: str | None = None,
               workflow: str | None = None, limit: int = 100) -> builtins.list[AlertRecord]:
        """Stored alerts (window at risk, fan-in wait, no recent success, execution stalled),
        newest first: the open ones, or resolved ones too; see docs/alerts.md."""
        return self._read(lambda c: c.alerts(include_resolved=include_resolved, kind=kind,
                                             workflow=workflow, limit=limit))

    def stall(self, execution_id: UUID | str) -> AlertRecord | None:
        """The open ``execution_stalled`` alert of an execution (nothing of it can run and the
        stall watchdog could not move it), or None; see docs/alerts.md."""
        return self._read(lambda c: c.stall(execution_id))

    def webhook_deliveries(self, *, status: str | None = None,
                           execution_id: UUID | str | None = None,
                           limit: int = 100) -> builtins.list[WebhookDelivery]:
        """Webhook deliveries, newest first (optionally of one status: pending, delivered,
        failed, refused; or of one execution): id, event, url, status, attempts, last_error,
        last_status_code, execution_id, alert_id, created_at, last_attempt_at, delivered_at,
        next_attempt_at. See docs/webhooks.md."""
        return self._read(lambda c: c.webhook_deliveries(status=status, execution_id=execution_id,
                                                         limit=limit))

    def retry_webhook_delivery(self, delivery_id: UUID | str) -> bool:
        """Send a failed or refused delivery again now; False when it is not one."""
        return self._do(lambda c: c.retry_webhook_delivery(delivery_id))

    def unregister_webhooks(self, webhooks: Iterable[Webhook]) -> int:
        """Stop writing deliveries for webhooks an App no longer has (the database keeps the
        webhooks Apps registered until told otherwise); returns how many were registered."""
        return self._do(lambda c: c.unregister_webhooks(webhooks))

    def workflow_served(self, name: str, version: int) -> bool:
        """Whether any live worker claims tasks of workflow ``name`` at ``version``."""
        return self._read(lambda c: c.workflow_served(name, version))

    def versions(self, workflow: str | None = None) -> builtins.list[VersionState]:
        """Per registered workflow version (or those of ``workflow``): running executions and the
        live workers serving it (``unserved`` when none does); see docs/changing-workflows.md."""
        return self._read(lambda c: c.versions(workflow))

    def schedules(self) -> builtins.list[ScheduleRecord]:
        """Every stored schedule with its next tick and the execution of its latest tick; see
        :meth:`konduit.engine.schedules.Schedules.list`. Schedules are stored when a worker of
        the App that defines them starts."""
        return self._read(lambda c: c.schedules())

    def triggers(self, workflow: str | None = None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (``wf.on_event``, of ``workflow``) with their open bursts
        or batches, pending events and last event; docs/events.md."""
        return self._read(lambda c: c.triggers(workflow))

    def pause_schedule(self, name: str) -> bool:
        """Stop starting ``name``'s ticks (in every worker) until :meth:`resume_schedule`;
        False when it was paused already. Raises :class:`konduit.ScheduleNotFound`."""
        return self._do(lambda c: c.pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """Start ``name``'s ticks again; its ``missed`` policy decides what becomes of the
        ticks that passed while it was paused. False when it was not paused."""
        return self._do(lambda c: c.resume_schedule(name))

    @overload
    def migrate(self) -> builtins.list[str]: ...

    @overload
    def migrate(self, execution_id: UUID | str, *, to_version: int) -> MigrationRecord: ...

    def migrate(self, execution_id: UUID | str | None = None, *,
                to_version: int | None = None) -> builtins.list[str] | MigrationRecord:
        """Without arguments: apply the schema migrations this konduit needs and return the
        ones applied.

        ``migrate(execution_id, to_version=N)``: move a running execution to version ``N`` of
        its workflow (docs/migrating-executions.md). Allowed when every step that started or
        ended exists in version ``N`` with the same upstreams; the rest then follows version
        ``N``'s DAG. Raises :class:`konduit.MigrationRefused` (``.step`` names the step at
        fault) otherwise. See :meth:`konduit.engine.client.Client.migrate`."""
        if execution_id is not None or to_version is not None:
            if execution_id is None or to_version is None:
                raise KonduitError("migrate(execution_id, to_version=N) needs both: the "
                                   "execution and the version to move it to")
            eid, target = execution_id, to_version
            return self._do(lambda c: c.migrate(eid, target))
        return self.migrate_schema()

    def migrate_workflow(self, workflow: str, from_version: int,
                         to_version: int) -> builtins.list[MigrationRecord]:
        """Migrate every running execution of ``workflow`` at ``from_version`` to
        ``to_version``, each on its own; refused ones come back with ``migrated=False`` and
        the reason. See :meth:`konduit.engine.client.Client.migrate_workflow`."""
        return self._do(lambda c: c.migrate_workflow(workflow, from_version, to_version))

    def migrate_schema(self) -> builtins.list[str]:
        """Apply the schema migrations this konduit needs; returns the ones applied."""

        async def go() -> builtins.list[str]:
            db = await self._open_database(2, check_schema=False)
            try:
                return [f"{m.version:04d}_{m.name}" for m in await migrate(db)]
            finally:
                await db.close()

        return self._call(go())

    async def run_worker_async(
        self,
        config: WorkerConfig | None = None,
        *,
        stop_after: float | None = None,
        connect_wait: float | None = None,
    ) -> Worker:
        """Run a worker in the current event loop until :meth:`Worker.stop` (or ``stop_after``).

        A server that does not answer at start is waited for (``connect_wait`` seconds; ``None``:
        until it answers or the worker is stopped), so that a worker started during an outage
        comes up with the database instead of exiting."""
        config = config or WorkerConfig()
        runner = _WorkerRun(self, config, connect_wait)
        if stop_after is not None:
            asyncio.get_running_loop().call_later(stop_after, runner.stop)
        return await runner.run()

    def run_worker(
        self,
        concurrency: int = 10,
        *,
        queues: Iterable[str] = ("default",),
        stop_after: float | None = None,
        stop_event: threading.Event | None = None,
        connect_wait: float | None = None,
        on_worker: Callable[[Worker], None] | None = None,
        **options: Any,
    ) -> Worker:
        """Run a worker in this thread until SIGINT/SIGTERM (graceful), ``stop_after`` seconds,
        or ``stop_event`` is set. A database that does not answer at start is waited for
        (``connect_wait`` seconds; ``None``, the default: until it answers or the worker is
        stopped); each failed attempt is logged. ``on_worker`` is called with the
        :class:`Worker` once it is built, before it runs (e.g. to wait on its ``passes`` from
        another thread)."""
        config = WorkerConfig(concurrency=concurrency, queues=tuple(queues), **options)

        async def main() -> Worker:
            runner = _WorkerRun(self, config, connect_wait, on_worker)
            loop = asyncio.get_running_loop()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, runner.stop)
            if stop_event is not None:
                def watch() -> None:
                    stop_event.wait()
                    with contextlib.suppress(RuntimeError):  # the worker already ended by itself
                        loop.call_soon_threadsafe(runner.stop)

                threading.Thread(target=watch, daemon=True).start()
            if stop_after is not None:
                loop.call_later(stop_after, runner.stop)
            return await runner.run()

        return asyncio.run(main())

    def close(self) -> None:
        """Close the connections of the sync face."""
        if self._loop is None:
            return
        if self._client is not None:
            self._call(self._client.close())
            self._client = None
        self._loop.close()
        self._loop = None

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WorkerRun:
    """One worker's life: wait for the database, then run; a stop request ends either phase."""

    def __init__(self, app: App, config: WorkerConfig, connect_wait: float | None,
                 on_worker: Callable[[Worker], None] | None = None):
        self.app = app
        self.config = config
        self.connect_wait = connect_wait
        self.on_worker = on_worker
        self.worker: Worker | None = None
        self.stopped = False
        self.opening: asyncio.Task[Database] | None = None

    def stop(self) -> None:
        # A stop may come while the worker is still waiting for the server: give up waiting.
        self.stopped = True
        if self.worker is not None:
            self.worker.stop()
        elif self.opening is not None:
            self.opening.cancel()

    async def run(self) -> Worker:
        app, config = self.app, self.config
        if self.stopped:
            return self._idle()
        self.opening = asyncio.create_task(app._open_database(
            max(4, min(config.concurrency + 2, 20)), name="konduit-worker",
            wait=self.connect_wait))
        try:
            db = await self.opening
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self.stopped or (current is not None and current.cancelling()):
                raise  # cancelled from outside, not stopped by us
            log.info("worker stopped before the database answered")
            return self._idle()
        self.worker = Worker(db, app.registry, config, max_payload_bytes=app.max_payload_bytes,
                             retention=app.retention, webhooks=app.webhooks)
        # Tasks and handler threads the worker starts inherit these (logs and spans name it).
        bind_worker(config.worker_id)
        if tracing_active(app.tracing):
            self.worker.executor.tracer = AttemptTracer(config.worker_id, app.tracing)
        if self.on_worker is not None:
            self.on_worker(self.worker)
        if self.stopped:
            self.worker.stop()
        try:
            await self.worker.run()
        finally:
            await db.close()
        return self.worker

    def _idle(self) -> Worker:
        """A worker that never connected and ran nothing (its pool is never opened)."""
        return Worker(Database(self.app._resolved_url or "", max_size=1), self.app.registry,
                      self.config, max_payload_bytes=self.app.max_payload_bytes)
