"""``konduit.Client`` and ``konduit.AsyncClient``: reach workflows by name, without their code.

Another service starts, waits for, cancels, repairs and finds executions knowing only the
database and a workflow's name: the definitions come from ``konduit_workflows``, where every
worker and App registers the versions it has the code of (with the JSON Schema of a declared
``input=``, which a start is checked against here too, and how its start-time keys are
computed, which a start computes here as the App does). Both are faces of
:class:`konduit.operations.AsyncOperations`, the one definition of every operation:
:class:`AsyncClient` is it with a database of its own, :class:`Client` its blocking face,
generated (its calls run on a private event-loop thread, as the App's).
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from uuid import UUID

from konduit._blocking import ExecutionHandle, Operations
from konduit.core.payloads import DEFAULT_MAX_BYTES
from konduit.db.connect import open_database
from konduit.db.replica import Reads, read_settings
from konduit.db.sealing import payload_limits, payload_settings
from konduit.engine import client as engine
from konduit.engine.registry import Registry
from konduit.loop_thread import LoopThread
from konduit.operations import AsyncExecutionHandle, AsyncOperations
from konduit.tracing import Tracing
from konduit.tracing import check_mode as check_tracing

T = TypeVar("T")

__all__ = ["AsyncClient", "AsyncExecutionHandle", "Client", "ExecutionHandle"]


class AsyncClient(AsyncOperations):
    """Start, follow and find executions of any registered workflow by name, as coroutines.

    >>> async with konduit.AsyncClient("postgresql://...") as client:
    ...     handle = await client.start("ingest", input={"episode": 42})
    ...     result = await handle.wait(timeout=60)

    ``database_url`` falls back to ``KONDUIT_DATABASE_URL``, then to the embedded server. No
    workflow code is needed: a start uses the definition a worker registered (the newest
    version unless ``version=`` says which), and an unknown name raises
    :class:`~konduit.WorkflowNotFound` naming the registered workflows. The connections open on
    first use, in the caller's event loop (one loop per client); :meth:`close` (or
    ``async with``) closes them. Every operation is the App's, with the same arguments and
    errors.

    ``read_database_url`` (else ``KONDUIT_READ_DATABASE_URL``) and ``read_max_lag`` send
    lists and searches to a streaming replica while it trails by at most that many seconds
    (see docs/read-replicas.md); :meth:`status`, :meth:`wait` and every command use the
    primary.

    ``codec``, ``payload_store`` and ``payload_limit`` are the App's (docs/payload-codecs.md):
    a Client reads and writes the payloads of workers that share its codec.
    """

    def __init__(self, database_url: str | None = None, *, pool_size: int = 4,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES, tracing: Tracing = None,
                 read_database_url: str | None = None, read_max_lag: float | None = None,
                 codec: Any = None, payload_store: Any = None,
                 payload_limit: int | str | None = None):
        self._database_url = database_url
        self.read_database_url, self.read_max_lag = read_settings(read_database_url,
                                                                  read_max_lag)
        self.pool_size = pool_size
        self.payload_io = payload_settings(codec, payload_store)
        self.max_payload_bytes = payload_limits(self.payload_io, max_payload_bytes, payload_limit,
                                                None)
        self.tracing = check_tracing(tracing)
        self._core: engine.Client | None = None

    async def _engine(self) -> engine.Client:
        """The engine client underneath, opened on first use (by the first of any number of
        concurrent first calls: the others close what they opened and share it)."""
        if self._core is None:
            db = await open_database(self._database_url, max_size=self.pool_size,
                                     name="konduit-client", payloads=self.payload_io)
            # No code: an empty registry, every definition read from the database.
            reads = Reads(db, self.read_database_url, max_lag=self.read_max_lag,
                          pool_size=self.pool_size)
            core = engine.Client(db, Registry(), max_payload_bytes=self.max_payload_bytes,
                                 tracing=self.tracing, reads=reads)
            if self._core is None:
                self._core = core
            else:
                await core.close()
        return self._core

    def handle(self, execution_id: UUID | str) -> AsyncExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return AsyncExecutionHandle(self, engine.coerce_execution_id(execution_id))

    async def close(self) -> None:
        """Close the connections (a later call opens them again)."""
        core, self._core = self._core, None
        if core is not None:
            await core.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Client(Operations):
    """Start, follow and find executions of any registered workflow by name, blocking.

    >>> with konduit.Client("postgresql://...") as client:
    ...     handle = client.start("ingest", input={"episode": 42})
    ...     handle.wait(timeout=60)

    The blocking face of :class:`AsyncClient` (same arguments, same errors, generated from the
    one definition of every operation): it needs no workflow code, only the database the
    workers use. Its calls run on a private event-loop thread, made by the first call under a
    lock, so any number of threads may use it at once, first calls included; :meth:`close`
    (or ``with``) ends it.
    """

    _operations: AsyncClient

    def __init__(self, database_url: str | None = None, *, pool_size: int = 4,
                 max_payload_bytes: int = DEFAULT_MAX_BYTES, tracing: Tracing = None,
                 read_database_url: str | None = None, read_max_lag: float | None = None,
                 codec: Any = None, payload_store: Any = None,
                 payload_limit: int | str | None = None):
        self._operations = AsyncClient(database_url, pool_size=pool_size,
                                       max_payload_bytes=max_payload_bytes, tracing=tracing,
                                       read_database_url=read_database_url,
                                       read_max_lag=read_max_lag, codec=codec,
                                       payload_store=payload_store,
                                       payload_limit=payload_limit)
        self._loop: LoopThread | None = None
        self._lock = threading.Lock()

    @property
    def tracing(self) -> Tracing:
        """The tracing mode (see :class:`konduit.App`)."""
        return self._operations.tracing

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread("konduit-client")
            loop = self._loop
        return loop.run(coro)

    def handle(self, execution_id: UUID | str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (by id)."""
        return ExecutionHandle(self, engine.coerce_execution_id(execution_id))

    def close(self) -> None:
        """Close the connections and the loop thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.run(self._operations.close())
        finally:
            loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
