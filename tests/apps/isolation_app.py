"""The app that ``konduit worker tests.apps.isolation_app:app --isolation process`` runs in
tests/test_isolation.py: a sync branch that ignores its 1 s deadline, beside a quick one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import konduit

wf = konduit.Workflow("isolation", version=1)


@wf.step(deadline="1s", retry=konduit.Retry(max_attempts=1), fallback=lambda ctx: "fallback")
def hang(ctx: konduit.Context) -> str:
    # Tell the test which process runs the handler, then (if asked) never return.
    (Path(ctx.input["pid_dir"]) / f"{ctx.execution_id}.pid").write_text(str(os.getpid()))
    while ctx.input["hang"]:
        time.sleep(3600)
    return "real"


@wf.step()
def quick(ctx: konduit.Context) -> str:
    return "quick"


@wf.step(after=[hang, quick])
def join(ctx: konduit.Context) -> dict[str, str]:
    return {"hang": ctx.upstream["hang"], "quick": ctx.upstream["quick"]}


app = konduit.App([wf])
