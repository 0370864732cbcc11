"""The app of the queue_unserved test (tests/test_alerts_queues.py): ``prepare`` runs on the
default queue, ``render`` on the ``gpu`` queue, which only a worker started with ``--queue gpu``
takes."""

from __future__ import annotations

import konduit

wf = konduit.Workflow("queues-render", version=1)


@wf.step()
def prepare(ctx: konduit.Context) -> str:
    return "prepared"


@wf.step(after=[prepare], queue="gpu")
def render(ctx: konduit.Context) -> str:
    return f"rendered {ctx.upstream['prepare']}"


app = konduit.App([wf])
