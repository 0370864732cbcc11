"""Retention: `konduit prune`, `App.prune()` and `App(retention=...)` on a real PostgreSQL.

Pruned executions lose every row in every konduit table (found generically through
information_schema, so a table added later is checked too), running ones keep all of theirs,
executions holding a dead letter stay until repaired or pruned explicitly, deletion goes in
batches, and two prunes (or a prune and a repair) racing each other are safe.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.db.connect import open_database
from konduit.db.database import Database
from konduit.engine.retention import Prunable, prune
from tests.support.workers import running_worker
from tests.test_cli import konduit_cli

pytestmark = pytest.mark.storage

RELEASE = threading.Event()  # blocked joins finish when set
HEALED = threading.Event()  # the flaky branch dead-letters until set


def prune_workflow() -> konduit.Workflow:
    """root -> (square over 3 items, an optional flaky branch, an optional slow branch that
    degrades) -> join (Join.required()); input decides which branch misbehaves and whether the
    join blocks, so one definition makes finished, dead-lettered, degraded and running executions."""
    wf = konduit.Workflow("prune-fan", version=1)

    @wf.step()
    def root(ctx: konduit.Context) -> list[int]:
        ctx.stream.write("rows in konduit_streams and konduit_stream_chunks, pruned too")
        # A durable call: its journal row and result go with the execution too.
        return list(ctx.call_sync("list-items", lambda: [1, 2, 3]))

    @wf.map(after=[root], over=lambda items: items)
    def square(ctx: konduit.Context) -> int:
        return int(ctx.item) ** 2

    @wf.step(after=[root], required=False, deadline="10s", retry=konduit.Retry(max_attempts=1))
    def flaky(ctx: konduit.Context) -> str:
        if ctx.input.get("fail") and not HEALED.is_set():
            raise konduit.NonRetryableError("the image service exploded")
        return "image"

    @wf.step(after=[root], required=False, deadline="200ms", retry=konduit.Retry(max_attempts=1),
             fallback=lambda ctx: "fallback")
    async def slow(ctx: konduit.Context) -> str:
        if ctx.input.get("slow"):
            await asyncio.sleep(30)
        return "fast"

    @wf.step(after=[square, flaky, slow], join=konduit.Join.required())
    def join(ctx: konduit.Context) -> int:
        if ctx.input.get("block"):
            RELEASE.wait(30)
        return sum(ctx.upstream["square"])

    return wf


def one_step() -> konduit.Workflow:
    wf = konduit.Workflow("prune-one", version=1)

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return int(ctx.input)

    return wf


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    RELEASE.clear()
    HEALED.clear()
    yield
    RELEASE.set()  # never leave a worker thread blocked


# -- generic row accounting ---------------------------------------------------------------------


def referencing_columns(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str]]:
    """(table, column, referenced table) for every konduit table column that names an execution
    (``*execution_id``) or a task (``task_id``): whatever tables the migrations add. Not the
    history's (tests/test_history.py: they keep what moved there, not the hot tables' rows), nor
    the views of both."""
    rows = conn.execute(
        """
        SELECT table_name, column_name FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name LIKE 'konduit\\_%%'
          AND table_name <> 'konduit_executions'
          AND table_name NOT LIKE 'konduit\\_history\\_%%'
          AND table_name IN (SELECT table_name FROM information_schema.tables
                             WHERE table_schema = current_schema()
                               AND table_type = 'BASE TABLE')
          AND (column_name LIKE '%%execution\\_id' OR column_name = 'task_id')
        ORDER BY table_name, column_name
        """
    ).fetchall()
    return [(t, c, "konduit_tasks" if c == "task_id" else "konduit_executions") for t, c in rows]


def orphans(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Rows of any konduit table whose execution (or task) no longer exists."""
    found = {}
    for table, column, target in referencing_columns(conn):
        row = conn.execute(
            f'SELECT count(*) FROM "{table}" x WHERE x."{column}" IS NOT NULL AND NOT EXISTS '
            f'(SELECT 1 FROM "{target}" y WHERE y.id = x."{column}")'
        ).fetchone()
        assert row is not None
        if row[0]:
            found[f"{table}.{column}"] = row[0]
    return found


def rows_of(conn: psycopg.Connection[Any], eid: UUID) -> dict[str, int]:
    """How many rows of each konduit table belong to one execution (attempts through its tasks)."""
    counts = {}
    row = conn.execute("SELECT count(*) FROM konduit_executions WHERE id = %s", (eid,)).fetchone()
    assert row is not None
    counts["konduit_executions"] = row[0]
    task_ids = [r[0] for r in conn.execute(
        "SELECT id FROM konduit_tasks WHERE execution_id = %s", (eid,)).fetchall()]
    for table, column, target in referencing_columns(conn):
        key: Any = task_ids if target == "konduit_tasks" else [eid]
        row = conn.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" = ANY(%s)',
                           (key,)).fetchone()
        assert row is not None
        counts[f"{table}.{column}"] = row[0]
    return counts


def age(db_url: str, ids: list[UUID], days: int = 2) -> None:
    """Make finished executions look as if they finished ``days`` ago."""
    with psycopg.connect(db_url) as conn:
        changed = conn.execute(
            "UPDATE konduit_executions SET finished_at = finished_at - make_interval(days => %s),"
            " created_at = created_at - make_interval(days => %s)"
            " WHERE id = ANY(%s) AND finished_at IS NOT NULL", (days, days, ids)).rowcount
    assert changed == len(ids)


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


# -- the tests ----------------------------------------------------------------------------------


def test_prune_removes_every_row_of_old_finished_executions_and_nothing_else(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = prune_workflow()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        done = [app.start(wf.name, {}) for _ in range(3)]
        degraded = app.start(wf.name, {"slow": True})
        dead, repaired = (app.start(wf.name, {"fail": True}) for _ in range(2))
        recent = app.start(wf.name, {})
        running = app.start(wf.name, {"block": True})
        for handle in [*done, degraded, dead, repaired, recent]:
            handle.wait(timeout=30)
        assert app.status(degraded.id).outcomes["slow"] == "degraded"
        assert app.status(dead.id).outcomes["flaky"] == "failed"
        HEALED.set()  # a repair re-runs the dead-lettered branch: it no longer holds its execution
        app.repair(repaired.id)
        app.wait(repaired.id, timeout=30)
        wait_for(lambda: app.status(running.id).outcomes.get("join") == "active")

        old = [h.id for h in (*done, degraded, dead, repaired)]
        age(db_url, old)
        with psycopg.connect(db_url) as conn:
            # The check below is not vacuous: it sees every table hanging off an execution.
            tables = {t for t, _, _ in referencing_columns(conn)}
            assert {"konduit_steps", "konduit_tasks", "konduit_attempts", "konduit_outputs",
                    "konduit_execution_outputs"} <= tables
            before = {eid: rows_of(conn, eid) for eid in [*old, recent.id, running.id]}
        mine = before[running.id]  # a running execution has rows everywhere but output versions
        # (and a schedule's pointer to its latest execution: this one was started by hand; and
        # webhook deliveries, which an execution gets when it finishes, and none is configured;
        # and events sent to an execution by id, which nobody sent; and the event that started it,
        # which it was not; and a map's chunks of items to create, which only a map of more
        # than one chunk has, while its items are being created)
        assert all(n > 0 for k, n in mine.items()
                   if k not in ("konduit_execution_outputs.execution_id",
                                "konduit_map_chunks.execution_id",
                                "konduit_schedules.last_execution_id",
                                "konduit_webhook_deliveries.execution_id",
                                "konduit_events.execution_id",
                                "konduit_trigger_events.execution_id"))

        deleted = app.prune(older_than="1d")
        assert deleted == 5  # done x3, degraded, the repaired one; not the dead letter

        with psycopg.connect(db_url) as conn:
            after = {eid: rows_of(conn, eid) for eid in before}
            assert orphans(conn) == {}
        for eid in (*[h.id for h in done], degraded.id, repaired.id):
            assert set(after[eid].values()) == {0}, (eid, after[eid])
        for eid in (dead.id, recent.id, running.id):
            assert after[eid] == before[eid], eid  # untouched, row for row
        assert app.status(running.id).status == "running"

        # The dead letter goes only when asked; the recent and running ones stay regardless.
        assert app.prune(older_than="1d") == 0
        assert app.prune(older_than="1d", include_dead_letters=True) == 1
        assert app.prune(older_than="0s", include_dead_letters=True) == 1  # the recent one
        with psycopg.connect(db_url) as conn:
            assert set(rows_of(conn, dead.id).values()) == {0}
            assert rows_of(conn, running.id) == before[running.id]
            assert orphans(conn) == {}
        RELEASE.set()
        assert running.wait(timeout=30).output == 14  # the running execution finishes normally


def test_prune_deletes_in_batches_and_resumes_past_dead_letters(
        make_app: Callable[..., konduit.App], db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = prune_workflow()
    app = make_app(wf)
    with running_worker(app, concurrency=16, poll_interval=0.05):
        handles = [app.start(wf.name, {"fail": i % 5 == 0}) for i in range(23)]
        for handle in handles:
            handle.wait(timeout=60)
    age(db_url, [h.id for h in handles])
    calls: list[int] = []
    original = Database.all

    async def spy(self: Database, query: str, /, **params: Any) -> Any:
        rows = await original(self, query, **params)
        if query == "execution_delete_finished_batch_if_still_finished":
            assert params["batch_size"] == 4
            calls.append(len(rows))
        return rows

    monkeypatch.setattr(Database, "all", spy)

    async def capped() -> int:  # a worker's round stops after a few batches
        db = await open_database(db_url, max_size=2)
        try:
            return await prune(db, "1d", batch_size=4, max_batches=2)
        finally:
            await db.close()

    assert asyncio.run(capped()) == 8
    assert calls == [4, 4]
    calls.clear()
    assert app.prune(older_than="1d", batch_size=4) == 10  # the rest; 5 hold a dead letter
    assert calls == [4, 4, 2]  # batches of at most 4; the last short one ends it
    assert app.prune(older_than="1d", include_dead_letters=True, batch_size=4) == 5
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (0,)
        assert orphans(conn) == {}


def _race(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls on threads released together; returns results (or exceptions) in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # reported by the caller's asserts
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_two_concurrent_prunes_delete_each_execution_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = one_step()
    runner = make_app(wf)
    first, second = make_app(wf), make_app(wf)  # two pools: two connections racing
    with running_worker(runner, concurrency=16, poll_interval=0.05):
        for trial in range(3):
            handles = runner.start_many([{"workflow": wf.name, "input": i} for i in range(60)])
            for handle in handles:
                handle.wait(timeout=60)
            age(db_url, [h.id for h in handles])
            results = _race(lambda: first.prune(older_than="1d", batch_size=5),
                            lambda: second.prune(older_than="1d", batch_size=5))
            assert not [r for r in results if isinstance(r, Exception)], results
            assert sum(results) == 60, (trial, results)
            with psycopg.connect(db_url) as conn:
                assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (0,)
                assert orphans(conn) == {}


def test_a_prune_racing_a_repair_never_deletes_the_repaired_execution(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """A repair reopens an execution (it is running again): the prune either deleted it first
    (the repair then finds nothing) or skips it; never both, never a half-deleted execution."""
    wf = prune_workflow()
    app, pruner = make_app(wf), make_app(wf)
    with running_worker(app, concurrency=16, poll_interval=0.05):
        handles = [app.start(wf.name, {"slow": True}) for _ in range(12)]
        for handle in handles:
            handle.wait(timeout=60)
        ids = [h.id for h in handles]
        age(db_url, ids)

        def repair_all() -> dict[UUID, str]:
            outcome = {}
            for eid in ids:
                try:
                    app.repair(eid)
                    outcome[eid] = "repaired"
                except konduit.ExecutionNotFound:
                    outcome[eid] = "gone"
            return outcome

        repaired, pruned = _race(repair_all, lambda: pruner.prune(older_than="1d", batch_size=1))
        assert isinstance(repaired, dict) and isinstance(pruned, int), (repaired, pruned)
        assert sum(v == "gone" for v in repaired.values()) == pruned
        for eid, what in repaired.items():
            if what == "repaired":
                assert app.wait(eid, timeout=30).status == "succeeded"
                assert len(app.outputs(eid)) == 2
    with psycopg.connect(db_url) as conn:
        left = {r[0] for r in conn.execute("SELECT id FROM konduit_executions").fetchall()}
        assert left == {eid for eid, what in repaired.items() if what == "repaired"}
        assert orphans(conn) == {}


def test_workers_apply_the_apps_retention(make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = one_step()
    app = make_app(wf, retention="1d")
    with running_worker(app, poll_interval=0.05, maintenance_interval=0.1,
                        retention_interval=0.2):
        handles = [app.start(wf.name, i) for i in range(5)]
        for handle in handles:
            handle.wait(timeout=30)
        kept = app.start(wf.name, 99)
        kept.wait(timeout=30)
        age(db_url, [h.id for h in handles])
        with psycopg.connect(db_url) as conn:  # a worker that died two days ago
            conn.execute("INSERT INTO konduit_workers (id, hostname, pid, concurrency, queues,"
                         " started_at, last_heartbeat_at) VALUES ('gone', 'h', 1, 1, '{default}',"
                         " now() - interval '3 days', now() - interval '2 days')")

        def left() -> set[UUID]:
            with psycopg.connect(db_url) as conn:
                return {r[0] for r in conn.execute("SELECT id FROM konduit_executions")}

        wait_for(lambda: left() == {kept.id})
        # Even a prune of everything finished forgets only workers silent for over an hour.
        assert app.prune(older_than="0s") == 1
        with psycopg.connect(db_url) as conn:
            workers = [r[0] for r in conn.execute("SELECT id FROM konduit_workers")]
        assert len(workers) == 1 and workers != ["gone"]
        assert len(app.workers()) == 1
    with psycopg.connect(db_url) as conn:
        assert orphans(conn) == {}


def test_retention_settings_are_checked() -> None:
    with pytest.raises(konduit.KonduitError, match="retention: must be longer than zero"):
        konduit.App([], retention="0s")
    with pytest.raises(konduit.KonduitError, match="retention"):
        konduit.App([], retention="soon")
    wf = konduit.Workflow("contract", version=1, repair_within="2d")
    wf.step(name="only")(lambda ctx: 1)
    with pytest.raises(konduit.WorkflowDefinitionError,
                       match=r"repair_within \(2d\) must be shorter than the App's retention \(24h\)"):
        konduit.App([wf], retention="1d")
    assert konduit.App([wf], retention="30d").retention == 30 * 86400


def test_prune_cli(make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = prune_workflow()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handles = [app.start(wf.name, {"fail": i == 0}) for i in range(4)]
        for handle in handles:
            handle.wait(timeout=30)
    age(db_url, [h.id for h in handles])
    dry = konduit_cli("prune", "--older-than", "1d", "--dry-run", "--database-url", db_url)
    assert dry.returncode == 0, dry.stderr
    assert "would prune 3 execution(s) that finished more than 1d ago" in dry.stdout
    assert "kept 1 holding a dead letter" in dry.stdout
    real = konduit_cli("prune", "--older-than", "1d", "--batch-size", "2", "--json",
                       "--database-url", db_url)
    assert real.returncode == 0, real.stderr
    assert '"deleted": 3' in real.stdout and '"kept_with_dead_letters": 1' in real.stdout
    bad = konduit_cli("prune", "--older-than", "a while", "--database-url", db_url)
    assert bad.returncode == 1 and "older_than" in bad.stderr
    final = konduit_cli("prune", "--older-than", "1d", "--include-dead-letters",
                        "--database-url", db_url)
    assert final.returncode == 0 and "pruned 1 execution(s)" in final.stdout
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_executions").fetchone() == (0,)
        assert orphans(conn) == {}


def test_prune_deletes_old_resolved_alerts_and_keeps_open_ones(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for subject, raised, resolved in [("old", "2 days", "1 day"), ("recent", "2 days", "1 hour"),
                                          ("open", "2 days", None)]:
            conn.execute(
                "INSERT INTO konduit_alerts (kind, subject, workflow, severity, message, raised_at,"
                " last_seen_at, resolved_at) VALUES ('no_success', %s, 'wf', 'warning', 'm',"
                " now() - %s::interval, now() - %s::interval, now() - %s::interval)",
                (subject, raised, raised, resolved))

    async def go() -> int:
        db = await open_database(db_url)
        try:
            return await prune(db, "12h")
        finally:
            await db.close()

    assert asyncio.run(go()) == 0
    with psycopg.connect(db_url) as conn:
        left = [r[0] for r in conn.execute("SELECT subject FROM konduit_alerts ORDER BY subject")]
    assert left == ["open", "recent"]


def test_prune_deletes_old_events_but_not_one_a_waiting_task_has_yet_to_be_woken_with(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """Events sent before the cutoff go, taken or not; one a still-waiting task accepted stays
    (the engine wakes the task with its payload later)."""
    from tests.test_waits_events import review_workflow, wait_status

    app = make_app(review_workflow(deadline="1h"))
    with running_worker(app, poll_interval=0.1, maintenance_interval=0.3):
        handle = app.start("review-flow", input={"episode": 7})
        wait_status(db_url, handle.id, "review", "waiting")
    with psycopg.connect(db_url, autocommit=True) as conn:
        (waiting_task,) = conn.execute(
            "SELECT id FROM konduit_tasks WHERE execution_id = %s AND step = 'review'",
            (handle.id,)).fetchone()
        for key, age, consumed_by in [("old-pending", "2 days", None),
                                      ("old-taken", "2 days", -1),
                                      ("old-accepted", "2 days", waiting_task),
                                      ("recent-pending", "1 hour", None)]:
            conn.execute(
                "INSERT INTO konduit_events (name, key, payload, created_at, consumed_by,"
                " consumed_at) VALUES ('e', %s, '{}', now() - %s::interval, %s,"
                " CASE WHEN %s::bigint IS NULL THEN NULL ELSE now() END)",
                (key, age, consumed_by, consumed_by))

    async def go() -> int:
        db = await open_database(db_url)
        try:
            return await prune(db, "12h", batch_size=1)  # several batches
        finally:
            await db.close()

    assert asyncio.run(go()) == 0
    with psycopg.connect(db_url) as conn:
        left = [r[0] for r in conn.execute("SELECT key FROM konduit_events ORDER BY key")]
    assert left == ["old-accepted", "recent-pending"]


def test_an_answer_stays_as_long_as_the_execution_that_took_it(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """Who answered a person's step, what and when is its execution's record: retention deletes
    an old answer with its execution, not before. An execution that holds a dead letter (kept
    past the retention), and one still running (waiting for its second answer), keep their
    answers; a pruned execution's answers go in the same prune."""
    from tests.test_people_waits import Approval, waiting_in_inbox

    wf = konduit.Workflow("prune-answers", version=1)
    first = wf.wait_for_input("first", model=Approval)
    second = wf.wait_for_input("second", model=Approval, after=[first])

    @wf.step(after=[second], retry=konduit.Retry(max_attempts=1))
    def book(ctx):
        if ctx.input.get("fail"):
            raise RuntimeError("the booking fails for good")
        return "booked"

    app = make_app(wf)

    def answer(handle: konduit.ExecutionHandle, step: str) -> None:
        wait_for(lambda: [i for i in waiting_in_inbox(app, handle.id) if i.step == step] != [])
        app.answer(handle.id, step, {"decision": "approve"}, answered_by=f"ada-{step}")

    with running_worker(app, poll_interval=0.1, maintenance_interval=0.3):
        done, dead, running = (app.start("prune-answers", input=i)
                               for i in ({}, {"fail": True}, {}))
        for handle in (done, dead):
            answer(handle, "first")
            answer(handle, "second")
        answer(running, "first")
        wait_for(lambda: waiting_in_inbox(app, running.id) != [])
        assert done.wait(timeout=30).status == "succeeded"
        with pytest.raises(konduit.ExecutionFailed):
            dead.wait(timeout=30)
    age(db_url, [done.id, dead.id])
    with psycopg.connect(db_url) as conn:
        aged = conn.execute("UPDATE konduit_events SET created_at = created_at - interval '2 days'"
                            " WHERE execution_id = ANY(%s)",
                            ([done.id, dead.id, running.id],)).rowcount
    assert aged == 5

    def kept(handle: konduit.ExecutionHandle) -> list[tuple[str, str | None]]:
        return [(a.step, a.answered_by) for a in app.answers(handle.id)]

    before = {h.id: kept(h) for h in (done, dead, running)}
    assert before[dead.id] == [("first", "ada-first"), ("second", "ada-second")]
    assert app.prune(older_than="1d") == 1  # the succeeded one; the dead letter stays
    assert kept(dead) == before[dead.id]
    assert kept(running) == before[running.id] == [("first", "ada-first")]
    with psycopg.connect(db_url) as conn:
        left = conn.execute("SELECT execution_id, count(*) FROM konduit_events"
                            " GROUP BY 1").fetchall()
    assert dict(left) == {dead.id: 2, running.id: 1}  # the pruned execution's answers went
    assert app.prune(older_than="1d", include_dead_letters=True) == 1
    with psycopg.connect(db_url) as conn:
        left = conn.execute("SELECT execution_id, count(*) FROM konduit_events"
                            " GROUP BY 1").fetchall()
    assert dict(left) == {running.id: 1}


def test_a_repair_cancelled_before_it_started_leaves_a_dead_letter_to_prune_and_dashboard_alike(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """One definition of a dead letter (the task_dead_letter fragment): a failed task whose
    repair was created but never started (cancelled first) re-ran nothing. The dashboard lists
    it, and so retention counts it and keeps its execution."""
    wf = konduit.Workflow("prune-cancelled-repair", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def breaks(ctx: konduit.Context) -> None:
        raise konduit.NonRetryableError("broken")

    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handle = app.start(wf.name)
        with pytest.raises(konduit.ExecutionFailed):
            handle.wait(timeout=30)
    assert app.repair(handle.id) == ["breaks"]  # no worker runs: its new task never starts
    assert app.cancel(handle.id)
    with psycopg.connect(db_url) as conn:
        tasks = conn.execute("SELECT generation, status, started_at IS NOT NULL FROM konduit_tasks"
                             " WHERE execution_id = %s ORDER BY generation",
                             (handle.id,)).fetchall()
    assert [(s, started) for _, s, started in tasks] == [("failed", True), ("cancelled", False)]
    assert [d.execution_id for d in app.dead_letters()] == [handle.id]
    age(db_url, [handle.id])
    assert app.count_prunable("1d") == Prunable(finished=1, dead_letters=1)
    assert app.prune(older_than="1d") == 0
    assert app.status(handle.id).status == "cancelled"
    assert app.prune(older_than="1d", include_dead_letters=True) == 1
