"""``konduit.Client`` and ``konduit.AsyncClient``: reach workflows by name, without their code.

Another service starts, waits for, cancels and repairs executions knowing only the database and
a workflow's name: the definitions come from ``konduit_workflows``, where every worker and App
registers the versions it has the code of (with the JSON Schema of a declared ``input=``, which
a start is checked against here too). Both are faces of :class:`konduit.engine.client.Client`,
the one door every face goes through; :class:`AsyncClient` is the coroutine face,
:class:`Client` the blocking one (its calls run on a private event-loop thread, as the App's).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from konduit.app import ExecutionHandle
from konduit.core.durations import Duration
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.core.results import ExecutionResult
from konduit.db.connect import open_database
from konduit.db.replica import Reads, read_settings
from konduit.engine import client as engine
from konduit.engine.registry import Registry
from konduit.engine.starts import StartRequest, requests_of
from konduit.engine.waits import SendResult
from konduit.loop_thread import LoopThread
from konduit.reads import ReadModel
from konduit.records import TriggerRecord, WorkflowRecord
from konduit.tracing import TraceContext, Tracing, capture
from konduit.tracing import check_mode as check_tracing

T = TypeVar("T")


class AsyncExecutionHandle:
    """A started execution, for :class:`AsyncClient`: ``await handle.wait()``."""

    def __init__(self, client: AsyncClient, execution_id: UUID):
        self.client = client
        self.id = execution_id

    async def wait(self, timeout: float | None = None) -> ExecutionResult:
        """The result once it succeeded; raises :class:`~konduit.ExecutionFailed` when it
        failed, timed out or was cancelled, :class:`TimeoutError` after ``timeout`` seconds."""
        return await self.client.wait(self.id, timeout)

    async def status(self) -> ExecutionResult:
        """How the execution stands now."""
        return await self.client.status(self.id)

    async def cancel(self) -> bool:
        """Cancel it; False when it had already finished."""
        return await self.client.cancel(self.id)

    def __repr__(self) -> str:
        return f"AsyncExecutionHandle({self.id})"


class AsyncClient:
    """Start and follow executions of any registered workflow by name, as coroutines.

    >>> async with konduit.AsyncClient("postgresql://...") as client:
    ...     handle = await client.start("ingest", input={"episode": 42})
    ...     result = await handle.wait(timeout=60)

    ``database_url`` falls back to ``KONDUIT_DATABASE_URL``, then to the embedded server. No
    workflow code is needed: a start uses the definition a worker registered (the newest
    version unless ``version=`` says which), and an unknown name raises
    :class:`~konduit.WorkflowNotFound` naming the registered workflows. The connections open on
    first use, in the caller's event loop; :meth:`close` (or ``async with``) closes them.

    ``read_database_url`` (else ``KONDUIT_READ_DATABASE_URL``) and ``read_max_lag`` send
    :meth:`list` to a streaming replica while it trails by at most that many seconds (see
    docs/read-replicas.md); :meth:`status`, :meth:`wait` and every command use the primary.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = 4,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES, tracing: Tracing = None,
                 read_database_url: str | None = None, read_max_lag: float | None = None):
        self._database_url = database_url
        self.read_database_url, self.read_max_lag = read_settings(read_database_url,
                                                                  read_max_lag)
        self.pool_size = pool_size
        self.max_payload_bytes = max_payload_bytes
        self.tracing = check_tracing(tracing)
        self._core: engine.Client | None = None
        self._opening: asyncio.Lock | None = None

    async def core(self) -> engine.Client:
        """The engine client underneath (opened on first use): every other read it offers."""
        if self._core is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._core is None:
                    db = await open_database(self._database_url, max_size=self.pool_size,
                                             name="konduit-client")
                    # No code: an empty registry, every definition read from the database.
                    reads = Reads(db, self.read_database_url, max_lag=self.read_max_lag,
                                  pool_size=self.pool_size)
                    self._core = engine.Client(db, Registry(),
                                               max_payload_bytes=self.max_payload_bytes,
                                               tracing=self.tracing, reads=reads)
        return self._core

    async def _reads(self) -> ReadModel:
        """The read model on the engine client's connections (:meth:`core`)."""
        return ReadModel((await self.core()).reads)

    async def start(self, workflow: str, input: Any = None, *,
                    idempotency_key: str | None = None, version: int | None = None,
                    deadline_at: datetime | None = None, timeout: Duration | None = None,
                    trace_context: TraceContext | None = None,
                    tags: Mapping[str, str] | None = None, run_at: datetime | None = None,
                    delay: Duration | None = None, priority: int = 0,
                    fair_key: str | None = None) -> AsyncExecutionHandle:
        """Start an execution of ``workflow`` (its newest registered version unless
        ``version``); the arguments mean what they mean to :meth:`konduit.App.start` (``tags``,
        ``run_at``/``delay``, ``priority``, and ``fair_key``, which a code-less starter gives
        for a workflow with ``fair_by=``). An input that does not match the workflow's
        ``input=`` raises :class:`~konduit.InputValidationError` naming each field, and nothing
        is written."""
        core = await self.core()
        eid = await core.start(workflow, input, idempotency_key=idempotency_key,
                               version=version, deadline_at=deadline_at, timeout=timeout,
                               trace_context=trace_context, tags=tags, run_at=run_at,
                               delay=delay, priority=priority, fair_key=fair_key)
        return AsyncExecutionHandle(self, eid)

    async def start_many(self, requests: Iterable[StartRequest | Mapping[str, Any]], *,
                         trace_context: TraceContext | None = None,
                         ) -> builtins.list[AsyncExecutionHandle]:
        """Start many executions in one transaction, all or none; see
        :meth:`konduit.App.start_many`."""
        ids = await (await self.core()).start_many(requests, trace_context=trace_context)
        return [AsyncExecutionHandle(self, eid) for eid in ids]

    def handle(self, execution_id: UUID | str) -> AsyncExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return AsyncExecutionHandle(self, engine.coerce_execution_id(execution_id))

    async def wait(self, execution_id: UUID | str, timeout: float | None = None) -> ExecutionResult:
        """Wait for the execution to finish; see :meth:`AsyncExecutionHandle.wait`."""
        return await (await self.core()).wait(execution_id, timeout)

    async def status(self, execution_id: UUID | str) -> ExecutionResult:
        """How an execution stands now: status, output, error, each step's outcome."""
        return await (await self.core()).get(execution_id)

    async def cancel(self, execution_id: UUID | str, reason: str = "cancelled") -> bool:
        """Cancel a running execution; False when it had already finished."""
        return await (await self.core()).cancel(execution_id, reason)

    async def repair(self, execution_id: UUID | str) -> builtins.list[str]:
        """Re-run the degraded and failed steps of a finished execution and what depends on
        them, from the registered definition; returns the steps that run again."""
        return await (await self.core()).repair(execution_id)

    async def send_event(self, name: str, *, key: str | None = None,
                         execution_id: UUID | str | None = None,
                         payload: Any = None) -> SendResult:
        """Send an event to the step waiting for it; see :meth:`konduit.App.send_event` (a
        worker serving the workflow completes the woken task)."""
        return await (await self.core()).send_event(name, key=key, execution_id=execution_id,
                                                    payload=payload)

    async def triggers(self, workflow: str | None = None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (``wf.on_event``); see :meth:`konduit.App.triggers`."""
        return await (await self._reads()).triggers(workflow)

    async def list(self, *, status: str | None = None, workflow: str | None = None,
                   limit: int = 100) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first, optionally of one status and workflow."""
        return await (await self._reads()).list(status=status, workflow=workflow, limit=limit)

    async def workflows(self) -> builtins.list[WorkflowRecord]:
        """Every registered workflow version: what this client can start."""
        return await (await self._reads()).workflows()

    async def close(self) -> None:
        """Close the connections (a later call opens them again)."""
        core, self._core = self._core, None
        if core is not None:
            await core.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client:
    """Start and follow executions of any registered workflow by name, blocking.

    >>> with konduit.Client("postgresql://...") as client:
    ...     handle = client.start("ingest", input={"episode": 42})
    ...     handle.wait(timeout=60)

    The blocking face of :class:`AsyncClient` (same arguments, same errors): it needs no
    workflow code, only the database the workers use. Its calls run on a private event-loop
    thread, so it can be used from any thread; :meth:`close` (or ``with``) ends it.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = 4,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES, tracing: Tracing = None,
                 read_database_url: str | None = None, read_max_lag: float | None = None):
        self._async = AsyncClient(database_url, pool_size=pool_size,
                                  max_payload_bytes=max_payload_bytes, tracing=tracing,
                                  read_database_url=read_database_url,
                                  read_max_lag=read_max_lag)
        self._loop: LoopThread | None = None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = LoopThread("konduit-client")
        return self._loop.run(coro)

    def start(self, workflow: str, input: Any = None, *, idempotency_key: str | None = None,
              version: int | None = None, deadline_at: datetime | None = None,
              timeout: Duration | None = None, tags: Mapping[str, str] | None = None,
              run_at: datetime | None = None, delay: Duration | None = None,
              priority: int = 0, fair_key: str | None = None) -> ExecutionHandle:
        """Start an execution by name; see :meth:`AsyncClient.start`."""
        # The caller's span is in this thread's context, not in the loop thread.
        trace = capture(self._async.tracing, workflow)
        handle = self._call(self._async.start(
            workflow, input, idempotency_key=idempotency_key, version=version,
            deadline_at=deadline_at, timeout=timeout, trace_context=trace, tags=tags,
            run_at=run_at, delay=delay, priority=priority, fair_key=fair_key))
        return ExecutionHandle(self, handle.id)

    def start_many(self, requests: Iterable[StartRequest | Mapping[str, Any]],
                   ) -> builtins.list[ExecutionHandle]:
        """Start many executions in one transaction, all or none; see
        :meth:`konduit.App.start_many`."""
        checked = requests_of(requests)
        trace = capture(self._async.tracing, checked[0].workflow) if checked else None
        handles = self._call(self._async.start_many(checked, trace_context=trace))
        return [ExecutionHandle(self, h.id) for h in handles]

    def handle(self, execution_id: UUID | str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return ExecutionHandle(self, engine.coerce_execution_id(execution_id))

    def wait(self, execution_id: UUID | str, timeout: float | None = None) -> ExecutionResult:
        """Block until the execution finishes; see :meth:`konduit.ExecutionHandle.wait`."""
        return self._call(self._async.wait(execution_id, timeout))

    def status(self, execution_id: UUID | str) -> ExecutionResult:
        """How an execution stands now: status, output, error, each step's outcome."""
        return self._call(self._async.status(execution_id))

    def cancel(self, execution_id: UUID | str, reason: str = "cancelled") -> bool:
        """Cancel a running execution; False when it had already finished."""
        return self._call(self._async.cancel(execution_id, reason))

    def repair(self, execution_id: UUID | str) -> builtins.list[str]:
        """Re-run a finished execution's degraded and failed steps; see :meth:`AsyncClient.repair`."""
        return self._call(self._async.repair(execution_id))

    def send_event(self, name: str, *, key: str | None = None,
                   execution_id: UUID | str | None = None, payload: Any = None) -> SendResult:
        """Send an event to the step waiting for it; see :meth:`konduit.App.send_event`."""
        return self._call(self._async.send_event(name, key=key, execution_id=execution_id,
                                                 payload=payload))

    def triggers(self, workflow: str | None = None) -> builtins.list[TriggerRecord]:
        """The stored event triggers (``wf.on_event``); see :meth:`konduit.App.triggers`."""
        return self._call(self._async.triggers(workflow))

    def list(self, *, status: str | None = None, workflow: str | None = None,
             limit: int = 100) -> builtins.list[ExecutionResult]:
        """Recent executions, newest first, optionally of one status and workflow."""
        return self._call(self._async.list(status=status, workflow=workflow, limit=limit))

    def workflows(self) -> builtins.list[WorkflowRecord]:
        """Every registered workflow version: what this client can start."""
        return self._call(self._async.workflows())

    def close(self) -> None:
        """Close the connections and the loop thread."""
        if self._loop is None:
            return
        self._call(self._async.close())
        self._loop.close()
        self._loop = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
