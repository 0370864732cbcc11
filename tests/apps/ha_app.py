"""The app the failover tests run in ``konduit worker`` processes while the PostgreSQL primary
is killed (tests/test_failover.py).

Every handler run is appended to the file ``KONDUIT_HA_RUNS`` names (one line: step, execution,
map index, attempt), outside the database on purpose: a run that the failover rolled back is
still on record there, so the test counts how often a handler really ran, not only what the
surviving history says.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import konduit

BRANCHES = 4
ITEMS = 6
RETRY = konduit.Retry(max_attempts=20, base="50ms", cap="200ms")


def ran(ctx: konduit.Context) -> None:
    path = os.environ.get("KONDUIT_HA_RUNS")
    if path:
        line = f"{ctx.step} {ctx.execution_id} {ctx.map_index} {ctx.attempt}\n"
        # One write of a short line with O_APPEND: lines of several processes never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


wf = konduit.Workflow("ha", version=1)


@wf.step(retry=RETRY)
def root(ctx: konduit.Context) -> dict[str, list[int]]:
    ran(ctx)
    return {"items": list(range(ITEMS))}


def _branch(ctx: konduit.Context) -> str:
    ran(ctx)
    time.sleep(random.uniform(0.0, 0.1))
    return ctx.step


branch_names = [f"b{i}" for i in range(BRANCHES)]
for _name in branch_names:
    wf.step(name=_name, after=[root], retry=RETRY)(_branch)


@wf.step(after=[root], required=False, retry=konduit.Retry(max_attempts=1), deadline="30s")
def optional(ctx: konduit.Context) -> str:
    """An optional branch that fails in every third execution: the join does not wait for it
    to succeed, and its failure does not fail the execution."""
    ran(ctx)
    if int(ctx.input["n"]) % 3 == 0:
        raise RuntimeError("optional branch failed, as planned")
    return "extra"


@wf.map(after=[root], over=lambda out: out["items"], retry=RETRY)
async def square(ctx: konduit.Context) -> int:
    ran(ctx)
    return int(ctx.item) ** 2


@wf.step(after=[*branch_names, optional, square], join=konduit.Join.required(), retry=RETRY)
def join(ctx: konduit.Context) -> dict[str, Any]:
    ran(ctx)
    return {"branches": sorted(k for k in ctx.upstream if k in branch_names),
            "squares": ctx.upstream["square"]}


@wf.step(after=[join], retry=RETRY)
def publish(ctx: konduit.Context) -> int:
    ran(ctx)
    return len(ctx.upstream["join"]["branches"]) + sum(ctx.upstream["join"]["squares"])


EXPECTED_OUTPUT = BRANCHES + sum(i * i for i in range(ITEMS))

# A wide map whose join is in flight when the primary dies.
wide = konduit.Workflow("ha-wide", version=1)


@wide.step(retry=RETRY)
def seed(ctx: konduit.Context) -> dict[str, int]:
    ran(ctx)
    return {"n": int(ctx.input["n"])}


@wide.map(after=[seed], over=lambda out: range(out["n"]), retry=RETRY)
def item(ctx: konduit.Context) -> int:
    ran(ctx)
    return int(ctx.item)


@wide.step(after=[item], retry=RETRY)
def total(ctx: konduit.Context) -> dict[str, int]:
    ran(ctx)
    items = ctx.upstream["item"]
    return {"count": len(items), "sum": sum(items)}


app = konduit.App([wf, wide])
