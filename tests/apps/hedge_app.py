"""The app that tests/test_hedging_processes.py runs with ``konduit worker tests.apps.hedge_app:app``.

``slow`` straggles in its first attempt (60 s) and returns at once when hedged; every attempt of
it appends what happened to the file named in the execution's input, so the test sees both
attempts across processes.
"""

from __future__ import annotations

import asyncio
import os

import konduit

wf = konduit.Workflow("proc-hedge", version=1)


def _log(ctx: konduit.Context, what: str) -> None:
    with open(ctx.input["log"], "a") as f:
        f.write(f"{ctx.idempotency_key}\t{int(ctx.hedged)}\t{what}\t{os.getpid()}\n")


@wf.step()
def root(ctx: konduit.Context) -> int:
    return 1


@wf.step(after=[root])
def fast(ctx: konduit.Context) -> int:
    return 1


@wf.step(after=[root], hedge="0.5s")
async def slow(ctx: konduit.Context) -> str:
    _log(ctx, "started")
    if ctx.hedged:
        return "hedge"
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        _log(ctx, "cancelled")
        raise
    return "primary"


@wf.step(after=[fast, slow])
def join(ctx: konduit.Context) -> str:
    return str(ctx.upstream["slow"])


app = konduit.App([wf])
