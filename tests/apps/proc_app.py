"""The app that worker-process tests run with ``konduit worker tests.apps.proc_app:app``.

Every branch sleeps until the wall-clock instant in the execution's input, so branches running
in different processes finish together and their completions collide at the join.
"""

from __future__ import annotations

import time

import konduit

WIDTH = 12

wf = konduit.Workflow("proc-fan-in", version=1)


@wf.step()
def root(ctx: konduit.Context) -> dict[str, float]:
    return {"release_at": ctx.input["release_at"]}


def _branch(ctx: konduit.Context) -> int:
    delay = ctx.upstream["root"]["release_at"] - time.time()
    if delay > 0:
        time.sleep(delay)
    return int(ctx.step[1:]) + 1


branches = [f"b{i}" for i in range(WIDTH)]
for name in branches:
    wf.step(name=name, after=[root])(_branch)


@wf.step(after=branches, join=konduit.Join.all_succeeded())
def join(ctx: konduit.Context) -> int:
    return sum(ctx.upstream.values())


app = konduit.App([wf])
