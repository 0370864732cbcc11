"""A branch that hangs past its deadline on the ``victim`` queue, for the deadline wake-up test
(tests/test_deadline_wakeups.py): the worker that claims it is killed, another one ends it."""

from __future__ import annotations

import time

import konduit

wf = konduit.Workflow("deadline-wake", version=1)


@wf.step(queue="victim", deadline="3s", retry=konduit.Retry(max_attempts=1), required=False,
         fallback=lambda ctx: "fallback")
def slow(ctx: konduit.Context) -> str:
    time.sleep(120)
    return "real"


@wf.step()
def quick(ctx: konduit.Context) -> str:
    return "quick"


@wf.step(after=[slow, quick], join=konduit.Join.required())
def publish(ctx: konduit.Context) -> str:
    return f"{ctx.upstream['slow']}+{ctx.upstream['quick']}"


app = konduit.App([wf])
