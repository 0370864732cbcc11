"""The dashboard's one :class:`~konduit.engine.client.Client` (with the
:class:`~konduit.reads.ReadModel` on its connections) and metrics collector, made on first use.
Apart from :mod:`konduit.web.app`, which builds the site, so that the routes
(:mod:`konduit.web.api_v1`, :mod:`konduit.web.wiring`) can name it without importing the module
that imports them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from uuid import UUID

from prometheus_client.registry import CollectorRegistry

from konduit.app import App
from konduit.core.requests import BulkRequest
from konduit.db.replica import Reads
from konduit.engine.client import Client
from konduit.engine.search import check_searchable
from konduit.errors import DatabaseError
from konduit.observe.metrics import KonduitCollector
from konduit.operations import AsyncOperations
from konduit.reads import ReadModel
from konduit.records import BulkResult
from konduit.web.jobs import BulkJob, BulkJobs
from konduit.web.reads import ReadsCollector

ClientFactory = Callable[[], Awaitable[Client]]

class Clients:
    """The dashboard's one client and metrics collector, made on first use."""

    def __init__(self, factory: ClientFactory):
        self.factory = factory
        self.client: Client | None = None
        self.metrics: CollectorRegistry | None = None
        self.collector: KonduitCollector | None = None
        self.lock, self.metrics_lock = asyncio.Lock(), asyncio.Lock()

    async def get(self) -> Client:
        async with self.lock:
            if self.client is None:
                self.client = await self.factory()
            return self.client

    async def model(self) -> ReadModel:
        """What the pages and the API show, read on the client's connections."""
        return ReadModel((await self.get()).reads)

    def reads(self) -> Reads | None:
        """Where the client's reads go (None before the first request made the client)."""
        return None if self.client is None else self.client.reads

    async def drop(self) -> None:
        async with self.lock:
            client, self.client = self.client, None
        if client is not None:
            await client.close()

    async def registry(self) -> CollectorRegistry:
        """The Prometheus registry of ``konduit metrics``'s collector, on the client's database."""
        async with self.metrics_lock:
            if self.metrics is None:
                url = (await self.get()).database_url
                self.collector = await asyncio.to_thread(KonduitCollector, url)
                self.metrics = CollectorRegistry()
                self.metrics.register(self.collector)
                self.metrics.register(ReadsCollector(self.reads))
            reads = self.reads()
            if reads is not None and reads.configured:
                with suppress(DatabaseError):  # the primary down: the collector says so
                    await reads.current()  # the replica's lag as of this scrape
            return self.metrics

    async def close(self) -> None:
        await self.drop()
        if self.collector is not None:
            await asyncio.to_thread(self.collector.close)


class ServerOperations(AsyncOperations):
    """The operations of the dashboard's doors (the API's routes and the pages' actions): the
    one definition (:class:`konduit.operations.AsyncOperations`, what ``konduit.AsyncClient``
    is) on the server's client, running the App's workflow code when the dashboard has one
    (``--app``), else the definitions workers registered in the database. Nothing is
    connected until an operation runs."""

    def __init__(self, clients: Clients, app: App | None):
        self.clients = clients
        self.app = app
        # The client with the App's code, made once per server client: one made per command
        # registered the App's workflows again at every start (a transaction each).
        self._coded: tuple[Client, Client] | None = None
        self.jobs = BulkJobs()  # bulk operations running in the background

    async def _engine(self) -> Client:
        client = await self.clients.get()
        if self.app is None:
            return client
        if self._coded is None or self._coded[0] is not client:
            self._coded = (client, client.with_registry(
                self.app.registry, max_payload_bytes=self.app.max_payload_bytes,
                event_retention=self.app.event_retention))
        return self._coded[1]

    async def _reads(self) -> ReadModel:
        return await self.clients.model()

    async def model(self) -> ReadModel:
        """The read model, for what the doors show beyond the operations (an execution's page,
        stats, map items)."""
        return await self._reads()

    async def progress(self, ids: Iterable[UUID]) -> dict[UUID, str]:
        """The status of each execution, read on the primary: the answer of a command that just
        wrote them (a replica may not have them yet)."""
        return {r.id: r.status for r in await (await self._reads()).on_primary().progress(ids)}

    async def start_bulk_job(self, request: BulkRequest) -> BulkJob:
        """Start a bulk cancel or redrive in the background (:mod:`konduit.web.jobs`): the job,
        whose progress is updated after each batch. What the operation refuses before its
        first batch is refused here, before a job exists (a filter by input under a payload
        codec: :class:`~konduit.SearchError`), not reported later as a failed job."""
        check_searchable((await self._engine()).db, request.where.params())

        async def run(request: BulkRequest,
                      progress: Callable[[BulkResult], None]) -> BulkResult:
            return await (await self._engine()).bulk(request, progress=progress)

        return self.jobs.start(request, run)

    def serves(self, name: str, version: int) -> bool:
        """Whether this server has the code of workflow ``name`` at ``version``."""
        return self.app is not None and self.app.registry.has(name, version)
