"""The app that tests/test_fallback_once.py runs in real ``konduit worker`` processes.

- ``fallback-crash``: ``hang`` ignores its 1 s deadline and its fallback kills its worker
  (``os._exit(1)``) when ``KONDUIT_FALLBACK_CRASH=1`` (unset, it only raises, so it can never kill
  a pytest process), after leaving one mark file per call in ``KONDUIT_FALLBACK_MARKS``;
  ``after`` joins it and ``quick`` with ``all_done``, so it runs once ``hang`` ended, however.
- ``rescue-fresh``: ``long`` hangs on its first attempt (its worker is killed holding it) and
  returns on the next; no deadline, so only a rescue can end that first attempt.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import konduit

crash_wf = konduit.Workflow("fallback-crash", version=1)


def _fatal_fallback(ctx: konduit.Context) -> str:
    marks = os.environ.get("KONDUIT_FALLBACK_MARKS")
    if marks:
        (Path(marks) / f"{ctx.execution_id}.{os.getpid()}").touch()
    if os.environ.get("KONDUIT_FALLBACK_CRASH") == "1":
        os._exit(1)
    raise RuntimeError("fatal fallback run outside a crash-test worker process")


@crash_wf.step(deadline="1s", retry=konduit.Retry(max_attempts=1), fallback=_fatal_fallback)
def hang(ctx: konduit.Context) -> str:
    time.sleep(3600)  # ignores its deadline (a sync thread cannot be interrupted)
    return "real"


@crash_wf.step()
def quick(ctx: konduit.Context) -> str:
    return "quick"


@crash_wf.step(after=[hang, quick], join=konduit.Join.all_done())
def after(ctx: konduit.Context) -> dict[str, str]:
    return dict(ctx.outcomes)


rescue_wf = konduit.Workflow("rescue-fresh", version=1)


@rescue_wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base=0, jitter=False))
def long(ctx: konduit.Context) -> str:
    if ctx.attempt == 1:
        time.sleep(3600)  # until its worker is killed
    return f"done on attempt {ctx.attempt}"


app = konduit.App([crash_wf, rescue_wf])
