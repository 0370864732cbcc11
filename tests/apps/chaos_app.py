"""The app the chaos tests run in `konduit worker` processes that get SIGKILLed or lose their
database."""

from __future__ import annotations

import random
import time

import konduit

BRANCHES = 5
RETRY = konduit.Retry(max_attempts=20, base="50ms", cap="200ms")

wf = konduit.Workflow("chaos", version=1)


@wf.step(retry=RETRY)
def root(ctx: konduit.Context) -> dict[str, list[int]]:
    return {"items": list(range(4))}


def _branch(ctx: konduit.Context) -> str:
    time.sleep(random.uniform(0.0, 0.25))
    return ctx.step


branch_names = [f"b{i}" for i in range(BRANCHES)]
for _name in branch_names:
    wf.step(name=_name, after=[root], retry=RETRY)(_branch)


@wf.map(after=[root], over=lambda out: out["items"], retry=RETRY)
async def square(ctx: konduit.Context) -> int:
    return int(ctx.item) ** 2


@wf.step(after=[*branch_names, square], retry=RETRY)
def join(ctx: konduit.Context) -> dict[str, object]:
    return {"branches": sorted(k for k in ctx.upstream if k != "square"),
            "squares": ctx.upstream["square"]}


@wf.step(after=[join], retry=RETRY)
def publish(ctx: konduit.Context) -> int:
    return len(ctx.upstream["join"]["branches"]) + sum(ctx.upstream["join"]["squares"])


# One slow step with no second attempt: a result that the engine throws away (a lease reclaimed
# from a live worker) cannot be hidden by a retry, it fails the execution.
HANDLER_SECONDS = 2.0
outage = konduit.Workflow("outage", version=1)


@outage.step(retry=konduit.Retry(max_attempts=1))
def slow(ctx: konduit.Context) -> int:
    time.sleep(HANDLER_SECONDS)
    return int(ctx.input["n"])


app = konduit.App([wf, outage])
