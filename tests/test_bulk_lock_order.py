"""A bulk cancel or redrive never takes part in a lock cycle with a start.

``Workflow(max_running=, key=)`` admits executions under one row per key (``konduit_run_slots``).
A start locks the rows of its keys in one order (workflow, key); a bulk batch used to lock them
one at a time in the id order of its executions (a cancel's finish fills its key's freed slot,
a redrive takes a slot), each after its execution's row. A batch crossing keys b then a, next to
a start of a and b, then held b waiting for a while the start held a waiting for b: PostgreSQL
broke the cycle after ``deadlock_timeout`` by aborting one of them, which ran again.

The interleaving is forced: a side connection holds the batch's second execution row, so the
batch waits there holding what it locked before it; a start of both keys is sent; then the side
lock is let go. A batch now locks all its executions first (id order), then the rows of their
keys (key order), and only then acts: it holds no key row while it waits for an execution, and
its key rows are taken in the start's order. No transaction may meet a conflict.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from tests.support.db import rows

pytestmark = [pytest.mark.storage]

WAIT = 30.0


def _workflow(name: str) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1, max_running=5, key=lambda i: i["k"])
    wf.step(name="only")(lambda ctx: 1)
    return wf


def _blocked_by(url: str, pid: int) -> list[int]:
    return [r[0] for r in rows(url, "SELECT pid FROM pg_stat_activity "
                                    "WHERE %s = ANY(pg_blocking_pids(pid))", pid)]


def _wait_for(what: str, done: Any) -> Any:
    """Poll ``done()`` (a lock wait, a thread's end: the event the test is after) until truthy."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = done()
        if got:
            return got
        time.sleep(0.005)
    raise AssertionError(f"{what} did not happen within {WAIT} s")


class Conflicts(logging.Handler):
    """Every transaction or statement run again after a conflict (deadlock, serialization)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "again in" in message:
            self.seen.append(message)


@pytest.fixture
def conflicts() -> Any:
    logger = logging.getLogger("konduit.db.database")
    handler, level = Conflicts(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _run(target: Any, errors: list[BaseException], out: dict[str, Any], key: str,
         barrier: threading.Barrier | None = None) -> threading.Thread:
    def body() -> None:
        try:
            if barrier is not None:
                barrier.wait()
            out[key] = target()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    return thread


@pytest.mark.parametrize("action", ["cancel", "redrive"])
def test_a_bulk_batch_crossing_keys_and_a_start_of_those_keys_meet_no_deadlock(
        db_url: str, conflicts: Conflicts, action: str) -> None:
    name = f"bulk-order-{action}"
    app = konduit.App([_workflow(name)], database_url=db_url)
    try:
        # Key b's execution is older (lower id) than key a's: the batch crosses b then a.
        older = app.start(name, input={"k": "b"}, tags={"bulk": "1"}).id
        newer = app.start(name, input={"k": "a"}, tags={"bulk": "1"}).id
        assert UUID(str(older)) < UUID(str(newer))
        if action == "redrive":
            assert app.cancel(older) and app.cancel(newer)
        errors: list[BaseException] = []
        out: dict[str, Any] = {}
        with psycopg.connect(db_url) as side:
            side.execute("SELECT id FROM konduit_executions WHERE id = %s FOR NO KEY UPDATE",
                         (newer,))
            side_pid = side.info.backend_pid
            bulk = _run(lambda: app.bulk(action, konduit.ExecutionFilter(tags={"bulk": "1"})),
                        errors, out, "bulk")
            bulk_pid = _wait_for("the batch waiting for the held execution",
                                 lambda: _blocked_by(db_url, side_pid))[0]
            start = _run(lambda: app.start_many([{"workflow": name, "input": {"k": "a"}},
                                                 {"workflow": name, "input": {"k": "b"}}]),
                         errors, out, "start")
            # The start either goes through, or waits for a key row the batch holds.
            _wait_for("the start ending or waiting for the batch",
                      lambda: not start.is_alive() or _blocked_by(db_url, bulk_pid))
            side.rollback()  # the batch goes on: its next key is one the start may hold
            start.join(WAIT)
            bulk.join(WAIT)
        assert not errors, errors
        assert not bulk.is_alive() and not start.is_alive()
        assert conflicts.seen == [], conflicts.seen
        assert (out["bulk"].done, out["bulk"].skipped) == (2, {})
        assert len(out["start"]) == 2
        want = "cancelled" if action == "cancel" else "running"
        assert {app.status(e).status for e in (older, newer)} == {want}
        assert {app.status(e.id).status for e in out["start"]} == {"running"}
    finally:
        app.close()


def test_bulk_cancels_racing_starts_of_crossed_keys_meet_no_conflict(
        db_url: str, conflicts: Conflicts) -> None:
    """Unforced: bulk cancels of batches crossing keys, each released by a barrier with a start
    of the same keys in the other order, many trials; every one goes through at once."""
    name = "bulk-order-race"
    app = konduit.App([_workflow(name)], database_url=db_url)
    keys = [f"k{i}" for i in range(6)]
    try:
        for trial in range(15):
            tag = {"trial": str(trial)}
            for k in reversed(keys):  # ids rising while keys fall: the batch crosses them
                app.start(name, input={"k": k}, tags=tag)
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []
            out: dict[str, Any] = {}
            threads = [
                _run(lambda tag=tag: app.bulk("cancel", konduit.ExecutionFilter(tags=tag)),
                     errors, out, "bulk", barrier),
                _run(lambda: app.start_many([{"workflow": name, "input": {"k": k}}
                                             for k in keys]), errors, out, "start", barrier),
            ]
            for t in threads:
                t.join(WAIT)
            assert not errors, (trial, errors)
            assert out["bulk"].done == len(keys), (trial, out["bulk"])
        assert conflicts.seen == [], conflicts.seen
    finally:
        app.close()
