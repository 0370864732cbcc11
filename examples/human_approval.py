"""Human approval with a fallback: a durable wait for an event, with a deadline.

A translated episode is published with a reviewer's corrected text when the reviewer approves in
time, and with the machine translation when not. The ``review`` step waits for the event
``translation-approved`` keyed by the episode: while it waits it holds no worker slot and
survives every worker restarting. At its deadline it degrades to its fallback, the machine
translation, and ``publish`` goes out anyway; an approval that comes later changes nothing.

Two executions: episode 1's reviewer answers at once (``woke``/``stored``), episode 2's never
does, so its review degrades after the (short, for the example) deadline.

Run it: ``python examples/human_approval.py`` (in the examples' own database,
``konduit_examples``, on the embedded PostgreSQL server or on ``KONDUIT_DATABASE_URL``'s server).
"""

from __future__ import annotations

import secrets
from typing import Any

import konduit
import konduit.testing
from konduit.databases import EXAMPLES_DATABASE, own_database

wf = konduit.Workflow("example-reviewed-translation", version=1)


@wf.step()
def machine_translate(ctx: konduit.Context) -> dict[str, str]:
    return {"de": f"(machine) {ctx.input['text']}", "by": "machine"}


review = wf.wait_for_event(
    "translation-approved", name="review", after=[machine_translate],
    # Which event this execution waits for: this run's episode (the late approval at the end is
    # stored, and would otherwise approve the same episode of the script's next run).
    key=lambda ctx: f"{ctx.input['run']}-episode-{ctx.input['episode']}",
    deadline="5s",  # hours in real life ("3h"); seconds here so the example ends quickly
    fallback=lambda ctx: ctx.upstream["machine_translate"],  # no answer in time: the machine's
)


@wf.step(after=[review])
def publish(ctx: konduit.Context) -> dict[str, Any]:
    return {"text": ctx.upstream["review"], "reviewed": ctx.outcomes["review"] == "succeeded"}


# The examples' own database beside yours (konduit_examples, created when missing), not yours.
app = konduit.App([wf], database_url=own_database(EXAMPLES_DATABASE))


def main() -> None:
    run = secrets.token_hex(4)
    with konduit.testing.worker_thread(app, concurrency=4):
        approved = app.start("example-reviewed-translation",
                             input={"run": run, "episode": 1, "text": "Hello"})
        ignored = app.start("example-reviewed-translation",
                            input={"run": run, "episode": 2, "text": "Bye"})

        # The reviewer's tool, from any process, any time before the deadline:
        answer = app.send_event("translation-approved", key=f"{run}-episode-1",
                                payload={"de": "Hallo", "by": "ana"})
        print("approval of episode 1:", answer)  # "woke", or "stored" if sent before it waited

        first = approved.wait(timeout=60)
        second = ignored.wait(timeout=60)
        print("episode 1:", first.outcomes["review"], first.output)
        print("episode 2:", second.outcomes["review"], second.output)

        # Too late: the fallback's payload stands and nothing changes.
        print("late approval of episode 2:", app.send_event(
            "translation-approved", key=f"{run}-episode-2", payload={"de": "Tschuess", "by": "ana"}))

    assert first.output == {"text": {"de": "Hallo", "by": "ana"}, "reviewed": True}
    assert second.outcomes["review"] == "degraded"
    assert second.output == {"text": {"de": "(machine) Bye", "by": "machine"}, "reviewed": False}
    app.close()


if __name__ == "__main__":
    main()
