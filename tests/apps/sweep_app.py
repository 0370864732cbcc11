"""A branch that runs far past its deadline, for the deadline-sweep test."""

from __future__ import annotations

import time

import konduit

wf = konduit.Workflow("sweep", version=1)


@wf.step(deadline="2s", retry=konduit.Retry(max_attempts=1), fallback=lambda ctx: "fallback")
def slow(ctx: konduit.Context) -> str:
    time.sleep(120)
    return "real"


@wf.step(after=[slow])
def publish(ctx: konduit.Context) -> str:
    return str(ctx.upstream["slow"])


app = konduit.App([wf])
