"""Apps for the migration tests with real worker processes: ``both`` serves versions 1 and 2 of
``migrating``, ``old_only`` only version 1. Step ``b`` waits until the file named by the input's
``gate`` exists, so a test can migrate while it runs and then let it finish."""

from __future__ import annotations

import time
from pathlib import Path

import konduit


def _a(ctx: konduit.Context) -> str:
    return "a"


def _b(ctx: konduit.Context) -> str:
    gate = Path(ctx.input["gate"])
    deadline = time.monotonic() + 60
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "b"


def _c(ctx: konduit.Context) -> dict[str, object]:
    return {"c": ctx.upstream["b"], "version": 2}


def define(version: int) -> konduit.Workflow:
    wf = konduit.Workflow("migrating", version=version)
    wf.step(name="a")(_a)
    wf.step(name="b", after=["a"], deadline="2m")(_b)
    if version == 2:
        wf.step(name="c", after=["b"])(_c)
    return wf


V1, V2 = define(1), define(2)
both = konduit.App([V1, V2])
old_only = konduit.App([define(1)])
