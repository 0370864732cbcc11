"""A nightly schedule: the workers start the executions, no cron, no leader, no extra service.

``publish-digest`` runs at 05:00 Berlin time every night (the clock follows daylight saving
time), each run with a one-hour publication window. Every worker may start a due tick; the
tick's idempotency key makes it exactly one execution however many workers run, and a tick
missed while no worker ran is started late (``missed="latest"``).

Waiting for 05:00 would not make a quick example, so a second schedule, ``every="2s"``, shows
ticks being started while the worker runs; then the nightly one is paused and resumed, as
``konduit schedules --pause nightly-digest`` would.

Run it: ``python examples/nightly_schedule.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
"""

from __future__ import annotations

import time
from typing import Any
from zoneinfo import ZoneInfo

import konduit
import konduit.testing
from konduit.databases import EXAMPLES_DATABASE, own_database

digest = konduit.Workflow("example-publish-digest", version=1)


@digest.step()
def collect(ctx: konduit.Context) -> dict[str, Any]:
    # ctx.scheduled_at: the tick this execution was started for (UTC); None when started by hand
    tick = ctx.scheduled_at.isoformat() if ctx.scheduled_at else None
    return {"channel": ctx.input["channel"], "tick": tick}


@digest.step(after=[collect])
def publish(ctx: konduit.Context) -> dict[str, Any]:
    return {"published": ctx.upstream["collect"]}


digest.schedule(cron="0 5 * * *", timezone="Europe/Berlin", input={"channel": "web"},
                window="1h", name="nightly-digest", missed="latest")

probe = konduit.Workflow("example-probe", version=1)


@probe.step()
def check(ctx: konduit.Context) -> str:
    return f"checked at the tick of {ctx.scheduled_at:%H:%M:%S}"


probe.schedule(every="2s", name="probe-every-2s", missed="skip")

# The examples' own database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([digest, probe], database_url=own_database(EXAMPLES_DATABASE))


def main() -> None:
    with konduit.testing.worker_thread(app, concurrency=4):  # the worker stores the schedules
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            started = [e for e in app.list(workflow="example-probe") if e.status == "succeeded"]
            if len(started) >= 2:
                break
            time.sleep(0.5)
        for schedule in app.schedules():
            print(f"{schedule.name:16} {schedule.schedule:34} "
                  f"next tick {schedule.next_tick:%Y-%m-%d %H:%M:%S %Z}  last: {schedule.last_status or '-'}")
        print("paused:", app.pause_schedule("nightly-digest"))
        print("resumed:", app.resume_schedule("nightly-digest"))

    assert len(started) >= 2, "the every-2s schedule did not start two executions in 30 s"
    for execution in started[:2]:
        print(app.status(execution.id).output)
    nightly = next(s for s in app.schedules() if s.name == "nightly-digest")
    assert nightly.next_tick is not None
    assert nightly.next_tick.astimezone(ZoneInfo("Europe/Berlin")).hour == 5
    app.close()


if __name__ == "__main__":
    main()
