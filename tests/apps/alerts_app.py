"""The app that the window-at-risk test runs with ``konduit worker tests.apps.alerts_app:app``.

``branch`` sleeps as long as the execution's input says (fast in the history, 10x slower in the
run that must raise the alert); ``publish`` joins it with ``steady`` and takes a fixed while
(``publish_seconds`` in the input, else 1.5 s), so a forecast made while ``branch`` straggles
still has ``publish`` ahead of it.
"""

from __future__ import annotations

import asyncio

import konduit

PUBLISH_SECONDS = 1.5

wf = konduit.Workflow("alerts-window", version=1)


@wf.step()
def fetch(ctx: konduit.Context) -> float:
    return float(ctx.input["branch_seconds"])


@wf.step(after=[fetch])
async def steady(ctx: konduit.Context) -> str:
    await asyncio.sleep(0.05)
    return "steady"


@wf.step(after=[fetch])
async def branch(ctx: konduit.Context) -> str:
    await asyncio.sleep(ctx.upstream["fetch"])
    return "branch"


@wf.step(after=[steady, branch])
async def publish(ctx: konduit.Context) -> list[str]:
    await asyncio.sleep(float(ctx.input.get("publish_seconds", PUBLISH_SECONDS)))
    return sorted(ctx.upstream.values())


app = konduit.App([wf])
