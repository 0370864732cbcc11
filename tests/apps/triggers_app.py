"""Workflows started by events (wf.on_event), for tests/test_triggers*.py: one execution per
event, a debounce, a batch and a trigger whose code fails on some events."""

from __future__ import annotations

import os

import konduit

DEBOUNCE = os.environ.get("KONDUIT_TEST_DEBOUNCE", "1s")
WINDOW = os.environ.get("KONDUIT_TEST_WINDOW", "1s")

uploaded = konduit.Workflow("on-upload", version=1)


@uploaded.step()
def index(ctx: konduit.Context) -> object:
    return ctx.input


uploaded.on_event("doc.uploaded", input=lambda e: {"doc": e["id"], "size": e.get("size", 0)},
                  key=lambda e: e["id"])

debounced = konduit.Workflow("on-edit", version=1)


@debounced.step()
def save(ctx: konduit.Context) -> object:
    return ctx.input


debounced.on_event("doc.edited", key=lambda e: e["doc"], debounce=DEBOUNCE)

batched = konduit.Workflow("on-click", version=1)


@batched.step()
def count(ctx: konduit.Context) -> object:
    return len(ctx.input)


batched.on_event("page.clicked", input=lambda e: e["n"],
                 batch=konduit.Batch(max=5, window=WINDOW))


def _hostile(e: dict[str, object]) -> object:
    if e.get("bad"):
        raise SystemExit("the mapping gave up")
    return e


hostile = konduit.Workflow("on-hostile", version=1)


@hostile.step()
def keep(ctx: konduit.Context) -> object:
    return ctx.input


hostile.on_event("risky.thing", input=_hostile)

app = konduit.App([uploaded, debounced, batched, hostile])
