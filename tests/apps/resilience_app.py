"""The app that the resilience tests run in ``konduit worker tests.apps.resilience_app:app`` processes.

Handlers are steered by environment variables, so the same module behaves one way in a worker
subprocess and another way when the test process imports it for an in-process worker:

- ``KONDUIT_RESILIENCE_SLOW``: seconds the ``slow*`` branches of ``resilience-sigterm`` sleep
  (unset: they return at once).
- ``KONDUIT_RESILIENCE_MARKS``: a directory where handlers touch ``<step>-<attempt>`` when they
  start, so a test can wait for "the handler is running" instead of guessing.
- ``KONDUIT_RESILIENCE_CRASH=1``: the ``crash`` step of ``resilience-crash`` kills its process with
  ``os._exit(1)``; unset, it only raises (so it can never kill a pytest process by accident).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import konduit


def _mark(ctx: konduit.Context) -> None:
    marks = os.environ.get("KONDUIT_RESILIENCE_MARKS")
    if marks:
        (Path(marks) / f"{ctx.step}-{ctx.attempt}").touch()


# -- resilience-sigterm: four parallel branches, two quick and two slow, then a join -------------

sigterm_wf = konduit.Workflow("resilience-sigterm", version=1)


def _quick(ctx: konduit.Context) -> str:
    _mark(ctx)
    return f"{ctx.step} done"


def _slow(ctx: konduit.Context) -> str:
    _mark(ctx)
    # A plain blocking sleep: a sync handler's thread cannot be interrupted by the worker.
    time.sleep(float(os.environ.get("KONDUIT_RESILIENCE_SLOW") or 0))
    return f"{ctx.step} done"


SIGTERM_QUICK = ("quick1", "quick2")
SIGTERM_SLOW = ("slow1", "slow2")
for _name in SIGTERM_QUICK:
    sigterm_wf.step(name=_name)(_quick)
for _name in SIGTERM_SLOW:
    sigterm_wf.step(name=_name)(_slow)


@sigterm_wf.step(after=[*SIGTERM_QUICK, *SIGTERM_SLOW])
def gather(ctx: konduit.Context) -> list[str]:
    return sorted(ctx.upstream.values())


# -- resilience-crash: a branch whose handler kills the worker process on every attempt ----------

crash_wf = konduit.Workflow("resilience-crash", version=1)


@crash_wf.step()
def fine(ctx: konduit.Context) -> str:
    return "fine"


@crash_wf.step(retry=konduit.Retry(max_attempts=3, base="10ms", cap="10ms", jitter=False))
def crash(ctx: konduit.Context) -> None:
    _mark(ctx)
    if os.environ.get("KONDUIT_RESILIENCE_CRASH") == "1":
        os._exit(1)
    raise RuntimeError("crash step run outside a crash-test worker process")


@crash_wf.step(after=[fine, crash])  # the default join: all branches must succeed
def after_crash(ctx: konduit.Context) -> str:
    return "unreachable"


app = konduit.App([sigterm_wf, crash_wf])
