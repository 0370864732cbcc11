"""The app of the own-lock lease test: a join whose upstream load holds its task row for longer
than two leases, on a live worker (``konduit worker tests.apps.own_lock_app:app``).

The slow load is injected into this worker's own code, not into the database: the join's start
transaction share-locks the task row (the lease check that holds off a cancel) and then waits
``hold_seconds`` (the input) before reading, as a join over a very wide map would while
PostgreSQL reads its items. Nothing else is changed."""

from __future__ import annotations

import asyncio
from typing import Any

import konduit
from konduit.worker import executor

wf = konduit.Workflow("own-lock", version=1)


@wf.step()
def left(ctx: konduit.Context) -> int:
    return 1


@wf.step()
def right(ctx: konduit.Context) -> int:
    return 2


@wf.step(after=[left, right])
def join(ctx: konduit.Context) -> int:
    return int(sum(ctx.upstream.values()))


_load = executor.load_upstream


async def _slow_load(tx: Any, spec: Any, execution_id: Any, step: str) -> Any:
    # Only this workflow's join: the test process imports this module too (for ``wf``), and its
    # in-process workers of other tests must read their upstreams untouched.
    if spec.name == wf.name and step == "join":
        row = await tx.one("execution_get", id=execution_id)
        given = row["input"] if row is not None and isinstance(row["input"], dict) else {}
        await asyncio.sleep(float(given.get("hold_seconds", 0)))
    return await _load(tx, spec, execution_id, step)


executor.load_upstream = _slow_load  # type: ignore[assignment]

app = konduit.App([wf])
