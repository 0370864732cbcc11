"""The app of the chunk crash test (``konduit worker tests.apps.chunk_crash_app:app``): a seed,
a map of ``n`` items on a queue no worker serves (only their creation is checked), and a join
that counts them. With ``KONDUIT_TEST_CHUNK_PAUSE`` set, each
chunk transaction waits that many seconds before its commit, so a kill lands inside one."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from uuid import UUID

import konduit
from konduit.engine import maps

wf = konduit.Workflow("chunk-crash", version=1)


@wf.step()
def seed(ctx: konduit.Context) -> int:
    return int(ctx.input)


@wf.map(after=[seed], over=range, max_items=1_000_000, queue="unserved")
def item(ctx: konduit.Context) -> int:
    return int(ctx.item)


@wf.step(after=[item])
def join(ctx: konduit.Context) -> dict[str, Any]:
    items = ctx.upstream["item"]
    return {"count": len(items), "sum": sum(items)}


_pause = float(os.environ.get("KONDUIT_TEST_CHUNK_PAUSE", "0"))
if _pause > 0:
    async def _slow_chunk(execution_id: UUID, first_index: int) -> None:
        await asyncio.sleep(_pause)

    maps.chunk_hook = _slow_chunk

app = konduit.App([wf])
