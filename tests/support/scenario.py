"""Run an async scenario against the engine on a test's database: a pool, a registry with its
workflows registered, a client, and a registered worker row (rescue keys on worker liveness)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import konduit
from konduit.db.database import Database
from konduit.engine.client import Client
from konduit.engine.registry import Registry

T = TypeVar("T")


def run_scenario(url: str, workflows: list[konduit.Workflow],
                 scenario: Callable[[Database, Registry, Client], Awaitable[T]], *,
                 worker_id: str) -> T:
    async def main() -> T:
        db = Database(url, min_size=1, max_size=4)
        await db.open()
        registry = Registry(workflows)
        client = Client(db, registry)
        await client.register_all()
        await db.run("worker_register", id=worker_id, hostname="test", pid=1, concurrency=8,
                     queues=["default"], workflows=registry.keys(), isolation="thread",
                     lease_seconds=15.0)
        try:
            return await scenario(db, registry, client)
        finally:
            await db.close()

    return asyncio.run(main())
