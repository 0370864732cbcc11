"""The app that the flow-control tests run in real worker processes
(``konduit worker tests.apps.flow_app:app``).

Each handler appends its start and end time (wall clock; the workers share the machine) to a
file per task in the directory named by the execution's input, so the test can compute how many
ran at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import konduit

ITEMS = 16
HOLD = 0.3  # seconds each task of the limited and unlimited steps runs

wf = konduit.Workflow("flow-limits", version=1)


def _spans(ctx: konduit.Context, hold: float) -> int:
    began = time.time()
    time.sleep(hold)
    ended = time.time()
    folder = Path(ctx.input["dir"]) / ctx.step
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{ctx.execution_id}-{ctx.item}-{os.getpid()}").write_text(f"{began} {ended}")
    return int(ctx.item)


@wf.step()
def items(ctx: konduit.Context) -> list[int]:
    return list(range(ITEMS))


@wf.map(after=[items], over=lambda xs: xs, concurrency=2)
def limited(ctx: konduit.Context) -> int:
    return _spans(ctx, HOLD)


@wf.map(after=[items], over=lambda xs: xs)
def unlimited(ctx: konduit.Context) -> int:
    return _spans(ctx, HOLD)


@wf.map(after=[items], over=lambda xs: xs, rate="4/s")
def rated(ctx: konduit.Context) -> int:
    return int(ctx.item)


app = konduit.App([wf])
