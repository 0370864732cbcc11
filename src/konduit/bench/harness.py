"""Driving the completer directly, as the benchmarks and the fan-in tests do: claim tasks,
bring an execution to "every branch leased", record completions one by one, and run each
completion on a thread with its own loop and connection (so that siblings can collide).

Shared by :mod:`konduit.bench.suite` and ``tests/`` (fanin_harness, lock order); not part of the API.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from konduit import loop_thread
from konduit.core.model import Completion, Outcome, Recorded, TaskAttempt
from konduit.core.payloads import canonical_json
from konduit.db.connect import open_database
from konduit.db.database import Database
from konduit.db.sealing import PayloadIO
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.completer import record
from konduit.engine.registry import Registry
from konduit.errors import BenchError

T = TypeVar("T")
WORKER_ID = "konduit-bench"


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(f"bench: {message}")


@asynccontextmanager
async def opened(url: str, size: int, *,
                 payloads: PayloadIO | None = None) -> AsyncIterator[Database]:
    """A pool on ``url`` with the environment's payload codec (``konduit bench --codec``), or
    ``payloads``."""
    # Scratch databases are migrated explicitly (fresh_database): no schema check here.
    db = await open_database(url, max_size=size, name=WORKER_ID, check_schema=False,
                             payloads=payloads)
    try:
        yield db
    finally:
        await db.close()


def completion_for(task: TaskAttempt) -> Completion:
    """A success whose output is a payload as a worker makes it (``canonical_json``): sealed
    by the connection's codec, when there is one, as a worker's output is."""
    return task.completion(Outcome.SUCCEEDED, payload_json=canonical_json(1, what="output"),
                           payload=1)


async def claim(db: Database, registry: Registry, limit: int) -> list[TaskAttempt]:
    rows = await transitions.claim(db, queues=["default"], workflows=registry.keys(),
                                   limit=limit, lease_seconds=600, worker_id=WORKER_ID)
    return [TaskAttempt.from_row(r) for r in rows]


async def leased_branches(db: Database, registry: Registry, workflow: str, width: int) -> list[TaskAttempt]:
    """Start an execution and bring it to: every branch leased, none finished."""
    execution_id = await Client(db, registry).start(workflow)
    (root,) = await claim(db, registry, 1)
    _check(root.execution_id == execution_id and root.step == "root", "unexpected first task")
    await record(db, registry, completion_for(root))
    branches = await claim(db, registry, width)
    _check(len(branches) == width and {b.execution_id for b in branches} == {execution_id},
           f"expected {width} leased branches of the new execution, got {len(branches)}")
    return branches


async def finish_join(db: Database, registry: Registry) -> None:
    """Run the join task that the last branch fired, so the execution ends cleanly."""
    (join,) = await claim(db, registry, 1)
    _check(join.step == "join", f"expected the join task, claimed {join.step!r}")
    outcome, advanced = await record(db, registry, completion_for(join))
    _check(outcome is Recorded.ENDED and advanced is not None and advanced.finished == "succeeded",
           "the execution did not finish after its join")


async def record_each(db: Database, registry: Registry, tasks: list[TaskAttempt]) -> list[float]:
    """Record the completions one at a time (the un-batched path); seconds each. Checks that
    only the last one fired the join."""
    completions = [completion_for(t) for t in tasks]
    took, fired = [], []
    for c in completions:
        began = time.perf_counter()
        outcome, advanced = await record(db, registry, c)
        took.append(time.perf_counter() - began)
        _check(outcome is Recorded.ENDED, f"completion of {c.step} was {outcome.value}")
        fired.append(advanced is not None and "join" in advanced.fired)
    _check(fired == [False] * (len(tasks) - 1) + [True], "the join did not fire exactly once, last")
    return took


class LoopThread(loop_thread.LoopThread):
    """A loop thread with its own one-connection pool, ``db``: one per sibling that must collide."""

    def __init__(self, url: str):
        super().__init__("konduit-bench-loop")
        self.db = self.run(open_database(url, max_size=1, name=WORKER_ID, check_schema=False))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 120) -> T:
        return super().run(coro, timeout)

    def close(self, timeout: float = 5.0) -> None:
        if not self.closed:
            self.run(self.db.close())
        super().close(timeout)
