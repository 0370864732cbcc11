"""A workflow for the redrive process tests: ``fetch`` -> (``a``, ``b``) -> ``join``. Each
handler records its call in the ``redrive_calls`` table of the execution's database (the input's
``dsn``) and behaves by how many calls of its step came before:

- ``a`` fails non-retryably on its first call (the execution fails), then succeeds;
- ``b``'s first call holds its thread until the file ``input.release`` exists (the old
  generation's late completion), its second sleeps long (the worker is killed in it), and later
  calls return at once;
- ``join`` and ``fetch`` only record their call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg

import konduit

wf = konduit.Workflow("redrive-procs", version=1)


def called(ctx: konduit.Context, step: str) -> int:
    """Record this call; how many calls of ``step`` there were, this one included."""
    with psycopg.connect(ctx.input["dsn"], autocommit=True) as conn:
        conn.execute("INSERT INTO redrive_calls (step, pid) VALUES (%s, %s)", (step, os.getpid()))
        row = conn.execute("SELECT count(*) FROM redrive_calls WHERE step = %s", (step,)).fetchone()
    assert row is not None
    return int(row[0])


@wf.step()
def fetch(ctx: konduit.Context) -> str:
    called(ctx, "fetch")
    return "page"


@wf.step(after=[fetch], retry=konduit.Retry(max_attempts=1))
def a(ctx: konduit.Context) -> str:
    if called(ctx, "a") == 1:
        raise konduit.NonRetryableError("a fails on its first call")
    return "a-ok"


@wf.step(after=[fetch], deadline="120s", retry=konduit.Retry(max_attempts=5, base="100ms"))
def b(ctx: konduit.Context) -> str:
    n = called(ctx, "b")
    if n == 1:
        while not Path(ctx.input["release"]).exists():
            time.sleep(0.02)
        return "b-late"
    if n == 2:
        time.sleep(60)  # the worker running this is killed
    return "b-ok"


@wf.step(after=[a, b])
def join(ctx: konduit.Context) -> dict[str, Any]:
    called(ctx, "join")
    return {"a": ctx.upstream["a"], "b": ctx.upstream["b"]}


app = konduit.App([wf])
