"""The words every face uses for a step's state: one word, one meaning.

The steps table stores ``waiting`` for a step not reached yet and ``active`` for one whose tasks
exist; a *task* that waits for an event, a timer or a child is ``waiting`` too. Shown as stored,
a step nobody reached and a step parked on a durable wait read the same, and ``active`` says
nothing. So the pages, the API's pages and ``konduit status`` show:

- ``pending``: not reached yet (its upstreams have not all ended);
- ``ready``: its task waits for a worker to claim it;
- ``retrying``: its task failed an attempt and waits out the backoff before the next;
- ``running``: a worker runs its handler;
- ``waiting``: it waits durably for an event, a timer or a child execution;
- the finished words as stored (``succeeded``, ``degraded``, ``failed``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable

STEP_WORDS = ("pending", "ready", "retrying", "running", "waiting", "succeeded", "degraded",
              "failed", "timed_out", "skipped", "cancelled")

NOT_REACHED = "waiting"  # the steps table's word for a step not reached yet
STARTED = "active"  # ... and for one whose tasks exist and have not all ended


def step_word(status: str, open_tasks: Iterable[tuple[str, bool]] = ()) -> str:
    """The word shown for a step stored as ``status``, given its unfinished tasks as
    ``(task status, in backoff)`` pairs (the most telling wins: one running item of a map makes
    it ``running``)."""
    if status == NOT_REACHED:
        return "pending"
    if status != STARTED:
        return status
    seen = {"retrying" if backoff else task for task, backoff in open_tasks}
    for word in ("running", "waiting", "retrying", "ready"):
        if word in seen:
            return word
    return "running"  # its tasks are between a worker's end and the fan-in's decision
