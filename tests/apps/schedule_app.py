"""The app that the schedule process test runs with ``konduit worker tests.apps.schedule_app:app``:
one workflow started every second by a schedule; its step returns the tick it was started for."""

from __future__ import annotations

import konduit

wf = konduit.Workflow("every-second", version=1)


@wf.step()
def tick(ctx: konduit.Context) -> str | None:
    return ctx.scheduled_at.isoformat() if ctx.scheduled_at else None


wf.schedule(every="1s", name="each-second", input={"from": "schedule"})

app = konduit.App([wf])
