"""The app that durable-wait process tests run with ``konduit worker tests.apps.waits_app:app``."""

from __future__ import annotations

import time

import konduit

timer = konduit.Workflow("timer-flow", version=1)


@timer.step()
def begin(ctx: konduit.Context) -> float:
    return time.time()


pause = timer.sleep(name="pause", after=[begin], duration="2s")


@timer.step(after=[pause])
def end(ctx: konduit.Context) -> dict[str, object]:
    return {"paused": ctx.upstream["pause"], "ended": time.time()}


child = konduit.Workflow("resize", version=1)


@child.step()
def resize(ctx: konduit.Context) -> dict[str, object]:
    # Slow enough that a test can kill the worker running it.
    time.sleep(ctx.input.get("sleep", 0))
    return {"thumbs": [f"{ctx.input['src']}@{w}" for w in (64, 128)]}


parent = konduit.Workflow("gallery", version=1)


@parent.step()
def upload(ctx: konduit.Context) -> dict[str, object]:
    return {"cover": "cover.png", "sleep": ctx.input.get("sleep", 0)}


thumbs = parent.subworkflow(
    name="thumbs", after=[upload], workflow="resize",
    input=lambda ctx: {"src": ctx.upstream["upload"]["cover"],
                       "sleep": ctx.upstream["upload"]["sleep"]})


@parent.step(after=[thumbs])
def publish(ctx: konduit.Context) -> object:
    return ctx.upstream["thumbs"]


app = konduit.App([timer, child, parent])
