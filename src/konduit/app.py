"""``konduit.App``: the registry of workflows plus a synchronous face over the async core.

Every operation is defined once, in :class:`konduit.operations.AsyncOperations`; the App's
blocking methods are generated from it (:class:`konduit._blocking.Operations`) and run on a
private event-loop thread (one per App), so there is no hand-written sync twin. What is the
App's own is here: its workflows, the schema's migrations, and running a worker.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar, overload
from uuid import UUID

from konduit._blocking import ExecutionHandle, Operations
from konduit.core.durations import Duration, format_duration
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.webhooks import Webhook, check_unique
from konduit.core.workflow import Workflow
from konduit.db.connect import open_database
from konduit.db.database import Database, resolve_url
from konduit.db.migrate import migrate
from konduit.db.replica import Reads, read_settings
from konduit.db.sealing import payload_limits, payload_settings
from konduit.engine.client import Client, coerce_execution_id
from konduit.engine.history import history_seconds
from konduit.engine.registry import Registry
from konduit.engine.retention import retention_seconds
from konduit.engine.waits import event_retention as event_retention_seconds
from konduit.errors import KonduitError, WorkflowDefinitionError
from konduit.logs import bind_worker
from konduit.loop_thread import LoopThread
from konduit.operations import AsyncOperations
from konduit.reads import ReadModel
from konduit.records import (
    MigrationRecord,
)
from konduit.tracing import AttemptTracer, Tracing
from konduit.tracing import active as tracing_active
from konduit.tracing import check_mode as check_tracing
from konduit.worker.config import WorkerConfig
from konduit.worker.stopping import StopWatch
from konduit.worker.worker import Worker

T = TypeVar("T")
log = logging.getLogger(__name__)


class App(Operations):
    """The workflows an application knows and the database they run on.

    ``database_url`` falls back to ``KONDUIT_DATABASE_URL``, then to the embedded server (which
    is migrated automatically; a real server is migrated with ``konduit db migrate``).

    ``retention="30d"``: every worker of this App prunes executions that finished more than that
    long ago, every few minutes (see :meth:`prune`); None (the default) keeps everything.

    ``history_after="1d"``: the deployment's leader moves executions that finished more than that
    long ago (and hold no dead letter) out of the tables the workers write into the history,
    tables partitioned by day, which ``retention`` then drops a day at a time; they read the
    same through every door (docs/retention.md, "History"). None (the default) moves nothing.

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

    ``codec=konduit.codecs.Encrypted(keys={"k1": key1, "k2": key2}, current="k2")`` (else
    ``KONDUIT_CODEC``/``KONDUIT_CODEC_KEYS``): every input, output and event payload is
    encoded before it reaches the database, and decoded where it is read; the workers and the
    dashboard need the same codec (docs/payload-codecs.md). ``payload_limit="16MB"`` (else
    ``KONDUIT_PAYLOAD_LIMIT``): a larger payload is refused at once (an output fails its
    attempt, naming the step and the size); ``payload_warn`` logs a warning past its size.
    ``payload_store=konduit.stores.Directory(path)`` (or :class:`konduit.stores.S3`, else
    ``KONDUIT_PAYLOAD_STORE``): payloads of executions past the store's threshold are kept
    there, a reference in the database, removed when their execution is pruned.
    """

    def __init__(
        self,
        workflows: Iterable[Workflow] = (),
        database_url: str | None = None,
        *,
        pool_size: int = 10,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
        retention: Duration | None = None,
        history_after: Duration | None = None,
        tracing: Tracing = None,
        webhooks: Iterable[Webhook] = (),
        read_database_url: str | None = None,
        read_max_lag: float | None = None,
        event_retention: Duration | None = None,
        codec: Any = None,
        payload_store: Any = None,
        payload_limit: int | str | None = None,
        payload_warn: int | str | None = None,
    ):
        self.registry = Registry(workflows)
        self.payload_io = payload_settings(codec, payload_store)
        self.max_payload_bytes = payload_limits(self.payload_io, max_payload_bytes, payload_limit,
                                                payload_warn)
        self.read_database_url, self.read_max_lag = read_settings(read_database_url,
                                                                  read_max_lag)
        self.tracing = check_tracing(tracing)
        self.webhooks = check_unique(webhooks)
        self.retention = None if retention is None else retention_seconds(retention)
        self.history_after = None if history_after is None else history_seconds(history_after)
        self.event_retention = event_retention_seconds(event_retention)
        self._check_retention()
        self._database_url = database_url
        self._resolved_url: str | None = None
        self.pool_size = pool_size
        self._loop: LoopThread | None = None
        self._client: Client | None = None
        self._lock = threading.Lock()
        self._operations = _AppOperations(self)

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

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the App's loop thread (made on first use, by one thread however many
        ask at once) and wait for it: the one hop of every blocking operation."""
        return self._portal().run(coro)

    _call = _run

    async def _open_database(self, max_size: int, *, name: str = "konduit",
                             check_schema: bool = True, wait: float | None = 0.0) -> Database:
        db = await open_database(self._database_url, max_size=max_size, name=name,
                                 check_schema=check_schema, wait=wait, payloads=self.payload_io)
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
            try:
                # Before the first finish this App's process may commit (a cancel): the outbox
                # statement reads the registered webhooks.
                await client.register_webhooks(self.webhooks)
            except BaseException:
                await client.close()
                raise
            if self._client is not None:  # another first call made one meanwhile: keep that
                await client.close()
            else:
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

    @property
    def aio(self) -> AsyncOperations:
        """Every operation of this App as coroutines, for code inside an event loop:
        ``handle = await app.aio.start("ingest", {...})``, ``await handle.wait()``,
        ``await app.aio.search(tags=...)``: what :class:`konduit.AsyncClient` offers, with this
        App's workflows' code. It runs on the event loop of its first call; use it from one loop,
        and not beside the blocking methods (those run on the App's own loop thread)."""
        return self._operations

    def _do(self, call: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
        """Run one coroutine of the engine client on the App's loop thread (for the engine's
        own reads that no face offers, as tests and tools use them)."""

        async def through_client() -> T:
            return await call(await self.client_async())

        return self._run(through_client())

    # -- the API: every operation of AsyncOperations (generated), and the App's own ----------

    def handle(self, execution_id: UUID | str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return ExecutionHandle(self, coerce_execution_id(execution_id))

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
        fault) otherwise."""
        if execution_id is not None or to_version is not None:
            if execution_id is None or to_version is None:
                raise KonduitError("migrate(execution_id, to_version=N) needs both: the "
                                   "execution and the version to move it to")
            return self._run(self._operations.migrate(execution_id, to_version=to_version))
        return self.migrate_schema()

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
        watches: list[StopWatch] = []

        async def main() -> Worker:
            loop = asyncio.get_running_loop()
            # Armed by the first stop request, disarmed once asyncio.run has torn the loop down
            # (below): a stop stuck anywhere until then, the loop's own teardown included, is
            # reported (konduit.worker.stopping).
            watches.append(StopWatch(loop, config.shutdown_grace))
            runner = _WorkerRun(self, config, connect_wait, on_worker, watch=watches[0])
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, runner.stop)
                    # Also armed from Python's own handler, which runs even when user code
                    # blocks the loop (asyncio still reads the signal from its wakeup fd).
                    signal.signal(sig, watches[0].on_signal)
            if stop_event is not None:
                def watch() -> None:
                    stop_event.wait()
                    with contextlib.suppress(RuntimeError):  # the worker already ended by itself
                        loop.call_soon_threadsafe(runner.stop)

                threading.Thread(target=watch, daemon=True).start()
            if stop_after is not None:
                loop.call_later(stop_after, runner.stop)
            return await runner.run()

        try:
            return asyncio.run(main())
        finally:
            for watch in watches:
                watch.done()

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


class _AppOperations(AsyncOperations):
    """The App's operations as coroutines: on its engine client (its workflows' code first,
    else the definitions registered in the database), made on the App's loop."""

    def __init__(self, app: App):
        self.app = app

    async def _engine(self) -> Client:
        return await self.app.client_async()


class _WorkerRun:
    """One worker's life: wait for the database, then run; a stop request ends either phase."""

    def __init__(self, app: App, config: WorkerConfig, connect_wait: float | None,
                 on_worker: Callable[[Worker], None] | None = None, *,
                 watch: StopWatch | None = None):
        self.app = app
        self.watch = watch  # reports a stop that does not end (konduit.worker.stopping)
        self.config = config
        self.connect_wait = connect_wait
        self.on_worker = on_worker
        self.worker: Worker | None = None
        self.stopped = False
        self.opening: asyncio.Task[Database] | None = None

    def stop(self) -> None:
        # A stop may come while the worker is still waiting for the server: give up waiting.
        self.stopped = True
        if self.watch is not None:
            self.watch.arm()
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
                             retention=app.retention, history_after=app.history_after,
                             webhooks=app.webhooks)
        self.worker._stop_watch = self.watch
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
