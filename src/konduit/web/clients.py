"""The dashboard's one :class:`~konduit.engine.client.Client` (with the
:class:`~konduit.reads.ReadModel` on its connections) and metrics collector, made on first use.
Apart from :mod:`konduit.web.app`, which builds the site, so that the routes
(:mod:`konduit.web.api_v1`, :mod:`konduit.web.wiring`) can name it without importing the module
that imports them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress

from prometheus_client.registry import CollectorRegistry

from konduit.db.replica import Reads
from konduit.engine.client import Client
from konduit.errors import DatabaseError
from konduit.observe.metrics import KonduitCollector
from konduit.reads import ReadModel
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
