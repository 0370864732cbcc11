"""A whole execution through a real worker on real PostgreSQL."""

from __future__ import annotations

import konduit
from tests.support.workers import running_worker


def test_fan_out_map_and_join_end_to_end(make_app):
    wf = konduit.Workflow("smoke", version=1)

    @wf.step()
    def a(ctx):
        return {"items": [1, 2, 3], "x": ctx.input}

    @wf.step(after=[a])
    async def b(ctx):
        return ctx.upstream["a"]["x"] * 2

    @wf.step(after=[a])
    def c(ctx):
        return "c"

    @wf.map(after=[a], over=lambda out: out["items"])
    def square(ctx):
        return ctx.item**2

    @wf.step(after=[b, c, square])
    def join(ctx):
        return {"up": ctx.upstream, "outcomes": ctx.outcomes}

    app = make_app(wf)
    handle = app.start("smoke", input=21)
    with running_worker(app, concurrency=4):
        result = handle.wait(timeout=30)
    assert result.status == "succeeded"
    assert result.output["up"] == {"b": 42, "c": "c", "square": [1, 4, 9]}
    assert set(result.outcomes.values()) == {"succeeded"}
