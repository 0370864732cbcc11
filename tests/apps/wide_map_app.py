"""The app of the warm-worker wide-map test (``konduit worker tests.apps.wide_map_app:app``): a seed,
a map of ``n`` items, and a join that reads every item."""

from __future__ import annotations

from typing import Any

import konduit

wf = konduit.Workflow("wide-map", version=1)


@wf.step()
def seed(ctx: konduit.Context) -> dict[str, int]:
    return {"n": ctx.input["n"]}


@wf.map(after=[seed], over=lambda out: range(out["n"]))
def item(ctx: konduit.Context) -> dict[str, Any]:
    return {"i": ctx.item, "src": f"s3://media/{ctx.item:08d}.png"}


@wf.step(after=[item])
def join(ctx: konduit.Context) -> dict[str, int]:
    items = ctx.upstream["item"]
    return {"count": len(items), "sum": sum(x["i"] for x in items)}


app = konduit.App([wf])
