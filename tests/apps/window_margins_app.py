"""Seed 004's pipeline under a window, for tests/test_window_margins.py: a cover branch under
``Deadline.adaptive()`` that hangs when told to, a quick captions branch, and publish after both
(taking ``input["publish"]`` seconds)."""

from __future__ import annotations

import asyncio

import konduit

wf = konduit.Workflow("window-margins", version=1)


@wf.step()
def prepare(ctx: konduit.Context) -> str:
    return "ready"


@wf.step(after=[prepare], deadline=konduit.Deadline.adaptive(),
         retry=konduit.Retry(max_attempts=1), fallback=lambda ctx: "fallback cover")
async def cover(ctx: konduit.Context) -> str:
    if ctx.input["hang"]:
        await asyncio.sleep(3600)  # the incident: the cover service stops answering
    return "real cover"


@wf.step(after=[prepare])
def captions(ctx: konduit.Context) -> str:
    return "captions"


@wf.step(after=[cover, captions])
async def publish(ctx: konduit.Context) -> dict[str, str]:
    await asyncio.sleep(float(ctx.input["publish"]))
    return dict(ctx.upstream)


app = konduit.App([wf])
