"""A worker's background statements do not grow with the ready backlog (issue 16, production shape).

A map of 100,000 items that nobody claims yet (its items sit on a queue no worker serves) fills
`konduit_tasks` with ready rows in a running execution, beside a few executions in durable waits
(timers, events). A real worker then runs its maintenance passes (rescue, deadline sweep, waits
due, timed-out executions, stall watchdog, auto-repair, the next-due read), its alert
evaluation and its heartbeats for a few seconds, while every statement it issues is recorded
(the real :class:`~konduit.db.database.Tx` wrapped). Each distinct statement is then run again
under ``EXPLAIN (ANALYZE, BUFFERS)`` with the parameters it had, and must touch fewer buffers than
a twentieth of the backlog's pages: a statement that reads the backlog to find the handful of
rows it wants costs every worker that much on every pass, and grows with every map.

It caught ``task_list_waits_due`` reading every live task (the stall watchdog's partial index
``konduit_tasks_live``) to find the waiting ones: 61 ms and 2,400 buffers per pass at 40,000
ready tasks, on every worker, every interval. The control below runs that statement as it was on
the same shape and shows the bound catches it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import konduit
from konduit.db.arrays import with_array_literals
from konduit.db.database import Tx
from konduit.db.queries import q
from tests.support.waiting import wait_for_passes
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

ITEMS = 100_000
WAITING = 20

# The first half of task_list_waits_due before it had an index of its own (the control).
OLD_WAITS_DUE = """
SELECT t.id, t.execution_id, t.step, e.workflow_name
FROM konduit_tasks t
JOIN konduit_executions e ON e.id = t.execution_id
WHERE t.status = 'waiting' AND t.wait_until <= clock_timestamp() AND e.status = 'running'
ORDER BY t.wait_until
LIMIT 100"""


def _workflows() -> list[konduit.Workflow]:
    wide = konduit.Workflow("backlog-wide", version=1)

    @wide.step()
    def seed(ctx: konduit.Context) -> list[int]:
        return list(range(ITEMS))

    # The items' queue is served by no worker of this test: they stay ready.
    @wide.map(after=[seed], over=lambda items: items, queue="bulk")
    def item(ctx: konduit.Context) -> int:
        return 1

    @wide.step(after=[item])
    def total(ctx: konduit.Context) -> int:
        return len(ctx.upstream["item"])

    # An automatic repair contract and a degraded budget: their background reads run too.
    waits = konduit.Workflow("backlog-waits", version=1, repair_within="1h",
                             degraded_budget="2%")
    first = waits.step(name="first")(lambda ctx: 1)
    waits.sleep(name="pause", after=[first], duration="1h")
    waits.wait_for_event("approved", name="approval", after=[first],
                         key=lambda ctx: f"k-{ctx.input}")
    return [wide, waits]


def _recording(log: list[tuple[str, dict[str, Any]]], lock: threading.Lock) -> dict[str, Any]:
    """Replacements for the Tx methods that record (name, parameters), then run the statement."""

    def wrap(original: Any) -> Any:
        async def call(self: Tx, query: str, /, **params: Any) -> Any:
            with lock:
                log.append((query, dict(params)))
            return await original(self, query, **params)

        return call

    return {name: wrap(getattr(Tx, name)) for name in ("one", "all", "run", "send", "later")}


def _cost(conn: psycopg.Connection[Any], statement: str,
          params: dict[str, Any] | None = None, *, before: str | None = None) -> tuple[int, float]:
    """Shared buffers the statement touched and its execution time in ms (rolled back, with
    ``before`` run first in the same transaction)."""
    with conn.transaction(force_rollback=True):
        if before is not None:
            conn.execute(before.encode())
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}".encode(),
                           params).fetchone()
    assert row is not None
    top = row[0][0]
    plan = top["Plan"]
    return (int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)),
            float(top["Execution Time"]))


def _most_buffers(conn: psycopg.Connection[Any]) -> int:
    """A few index pages and the rows a statement wants are far below this; a read of the
    backlog is far above it."""
    (pages,) = conn.execute(
        "SELECT pg_relation_size('konduit_tasks') / current_setting('block_size')::int"
    ).fetchone()  # type: ignore[misc]
    return max(200, int(pages) // 20)


def _fill_backlog(app: konduit.App, url: str) -> None:
    with running_worker(app, concurrency=4):
        wide = app.start("backlog-wide")
        for i in range(WAITING):
            app.start("backlog-waits", input=i)
        deadline = time.monotonic() + 180
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                ready, waiting = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'ready'),"
                    "       count(*) FILTER (WHERE status = 'waiting') FROM konduit_tasks"
                ).fetchone()  # type: ignore[misc]
                if ready >= ITEMS and waiting >= 2 * WAITING:
                    break
                assert time.monotonic() < deadline, f"{ready} ready, {waiting} waiting"
                time.sleep(0.2)
            conn.execute("ANALYZE")
    assert app.status(wide.id).status == "running"


@pytest.mark.slow
def test_background_statements_do_not_read_the_backlog(make_app, db_url, monkeypatch):
    app = make_app(*_workflows(), retention="30d")  # the retention round runs in the pass too
    _fill_backlog(app, db_url)

    log: list[tuple[str, dict[str, Any]]] = []
    for name, replacement in _recording(log, threading.Lock()).items():
        monkeypatch.setattr(Tx, name, replacement)
    # Short intervals: several full maintenance passes, alert rounds and heartbeats; what is
    # measured is what runs meanwhile, so the test waits for the passes themselves.
    with running_worker(app, concurrency=4, maintenance_interval=0.5, alert_interval=0.5,
                        heartbeat_interval=0.5, stall_grace=0.5) as worker:
        wait_for_passes(worker, "rescue", n=2, timeout=60)  # once it may rescue (connected)
        wait_for_passes(worker, "maintenance", n=3, timeout=60)
        wait_for_passes(worker, "alerts", n=2, timeout=60)
    monkeypatch.undo()

    seen: dict[str, dict[str, Any]] = {}
    for name, params in log:
        seen.setdefault(name, params)
    assert {"task_list_waits_due", "task_list_rescuable", "task_get_next_due",
            "task_list_past_deadline", "execution_list_stalled_after_cursor",
            "execution_list_auto_repair_due", "execution_list_timed_out",
            "worker_heartbeat"} <= set(seen), sorted(seen)
    with psycopg.connect(db_url) as conn:
        most = _most_buffers(conn)
        costly = {}
        for name, params in sorted(seen.items()):
            buffers, ms = _cost(conn, q(name), with_array_literals(params))
            if buffers > most:
                costly[name] = f"{buffers} buffers, {ms:.1f} ms"
        # The control: the waits-due list as it was, without the index it has now, reads the
        # backlog on this very database.
        old, _ = _cost(conn, OLD_WAITS_DUE, before="DROP INDEX konduit_tasks_waiting_until")
    assert costly == {}, f"statements that read the backlog (at most {most} buffers): {costly}"
    assert old > most, f"the old waits-due list touched only {old} buffers (bound {most})"
