"""History off the hot path (migration 0041, docs/retention.md "History"): what moves, when, with
which rows, what retention drops, and that the migration is online on a database with history.

The reads of a moved execution through every door are tested in tests/test_history_reads.py,
its idempotency key in tests/test_history_keys.py; what it costs and saves in
``konduit bench --only prune_day,history_load``."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.bench.prune import fill_day
from konduit.db.migrate import migrations
from konduit.engine import history
from tests.support.db import migrated_before, rows, value
from tests.support.workers import running_worker
from tests.test_cli import assert_clean_error, konduit_cli
from tests.test_retention import age, wait_for

pytestmark = pytest.mark.storage

BLOCK = threading.Event()


def fan() -> konduit.Workflow:
    """A split, a map of three, a join; input {"fail": true} fails the join for good (a dead
    letter), {"block": true} holds it until BLOCK is set; a first attempt of the split fails."""
    wf = konduit.Workflow("history-fan", version=1)

    @wf.step(retry=konduit.Retry(max_attempts=2, backoff="fixed", base="0.01s"))
    def split(ctx: konduit.Context) -> list[int]:
        if ctx.attempt == 1:
            raise RuntimeError("a first attempt that fails")
        return [1, 2, 3]

    @wf.map(after=[split], over=lambda items: items)
    def double(ctx: konduit.Context) -> int:
        return int(ctx.item) * 2

    @wf.step(after=[double], retry=konduit.Retry(max_attempts=1))
    def join(ctx: konduit.Context) -> int:
        if ctx.input.get("fail"):
            raise RuntimeError("the join fails for good")
        if ctx.input.get("block"):
            BLOCK.wait(60)
        return sum(ctx.upstream["double"])

    return wf


def tables(url: str) -> list[str]:
    return list(value(url, "SELECT konduit_history_tables()"))


def where(table: str) -> str:
    """The rows of ``table`` (a hot table's name without konduit_) that belong to execution %s."""
    if table == "executions":
        return "x.id = %s"
    if table == "attempts":
        return "x.task_id IN (SELECT id FROM konduit_tasks_all WHERE execution_id = %s)"
    if table == "attempt_logs":
        return ("x.lease_token IN (SELECT a.lease_token FROM konduit_attempts_all a JOIN"
                " konduit_tasks_all t ON t.id = a.task_id WHERE t.execution_id = %s)")
    return "x.execution_id = %s"


def counts(url: str, eid: UUID, source: str) -> dict[str, int]:
    """Rows of execution ``eid`` per table, in the hot tables (``source`` "") or through the
    views (``"_all"``)."""
    return {t: int(value(url, f"SELECT count(*) FROM konduit_{t}{source} x WHERE {where(t)}",
                         eid))
            for t in tables(url)}


def move(app: konduit.App, older_than: float = 0) -> int:
    async def go() -> int:
        client = await app.client_async()
        return await history.move_finished(client.db, older_than)
    return app._run(go())


def test_a_move_takes_every_row_of_a_finished_execution_and_nothing_else(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan()
    app = make_app(wf)
    BLOCK.clear()
    with running_worker(app, poll_interval=0.05):
        done = [app.start(wf.name, {}) for _ in range(2)]
        dead = app.start(wf.name, {"fail": True})
        running = app.start(wf.name, {"block": True})
        for handle in done:
            handle.wait(timeout=60)
        with pytest.raises(konduit.ExecutionFailed):
            dead.wait(timeout=60)
        wait_for(lambda: value(db_url, "SELECT count(*) FROM konduit_tasks WHERE step = 'join'"
                               " AND status = 'running'") == 1)
        before = {h.id: counts(db_url, h.id, "") for h in [*done, dead, running]}
        assert all(n > 0 for t, n in before[done[0].id].items()
                   if t in ("executions", "steps", "tasks", "attempts", "outputs",
                            "execution_outputs"))
        assert move(app) == 2  # the dead letter and the running one stay where they are
        for h in done:
            assert counts(db_url, h.id, "") == dict.fromkeys(before[h.id], 0)
            assert counts(db_url, h.id, "_all") == before[h.id]
            assert value(db_url, "SELECT count(*) FROM konduit_history_executions"
                                 " WHERE id = %s", h.id) == 1
        for h in (dead, running):
            assert counts(db_url, h.id, "") == before[h.id]
        # What moved is what was there, column for column.
        for t in ("executions", "tasks", "attempts", "outputs"):
            hot = rows(db_url, f"SELECT to_jsonb(x) FROM konduit_{t}_all x WHERE {where(t)}"
                       " ORDER BY 1::text", done[0].id)
            assert len(hot) == before[done[0].id][t]
        assert move(app) == 0
        BLOCK.set()
        running.wait(timeout=60)
        assert move(app) == 1
    assert value(db_url, "SELECT count(*) FROM konduit_executions") == 1  # the dead letter


def test_the_leader_moves_executions_that_finished_before_history_after(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan()
    app = make_app(wf, history_after="1h")
    with running_worker(app, poll_interval=0.05, maintenance_interval=0.1,
                        history_interval=0.1) as worker:
        old = [app.start(wf.name, {}) for _ in range(3)]
        for handle in old:
            handle.wait(timeout=60)
        recent = app.start(wf.name, {})
        recent.wait(timeout=60)
        worker.wait_for_passes("history", 2)
        assert value(db_url, "SELECT count(*) FROM konduit_history_executions") == 0
        age(db_url, [h.id for h in old])
        wait_for(lambda: {r[0] for r in rows(db_url, "SELECT id FROM konduit_executions")}
                 == {recent.id})
        assert {r[0] for r in rows(db_url, "SELECT id FROM konduit_history_executions")} \
            == {h.id for h in old}


def test_the_command_line_moves_history_and_names_a_bad_duration(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handles = [app.start(wf.name, {}) for _ in range(3)]
        for handle in handles:
            handle.wait(timeout=60)
    age(db_url, [h.id for h in handles[:2]])
    moved = konduit_cli("move-history", "--older-than", "1d", "--batch-size", "1", "--json",
                        "--database-url", db_url)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout) == {"moved": 2}
    assert value(db_url, "SELECT count(*) FROM konduit_history_executions") == 2
    assert_clean_error(konduit_cli("move-history", "--older-than", "a while",
                                   "--database-url", db_url), "older_than")


def test_history_after_is_checked() -> None:
    with pytest.raises(konduit.KonduitError, match="history_after: must be longer than zero"):
        konduit.App([], history_after="0s")
    with pytest.raises(konduit.KonduitError, match="history_after"):
        konduit.App([], history_after="later")


def test_prune_drops_the_days_of_history_that_ended_before_the_cutoff(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handles = [app.start(wf.name, {}) for _ in range(6)]
        for handle in handles:
            handle.wait(timeout=60)
    two, three, today = handles[:2], handles[2:4], handles[4:]
    age(db_url, [h.id for h in two], days=2)
    age(db_url, [h.id for h in three], days=3)
    assert move(app) == 6
    days = [r[0] for r in rows(db_url, "SELECT konduit_history_days()")]
    assert len(days) >= 3  # today, two and three days ago (four if the ages cross midnight)
    parts = int(value(db_url, "SELECT count(*) FROM pg_inherits WHERE inhparent ="
                              " ANY(ARRAY(SELECT ('konduit_history_' || t)::regclass"
                              " FROM unnest(konduit_history_tables()) t))"))
    assert parts == len(days) * len(tables(db_url))
    # A cutoff of 1 day: every day that ended more than a day ago goes, today's stays.
    assert app.count_prunable("1d").finished == 4
    assert app.prune("1d") == 4
    assert app.count_prunable("1d").finished == 0
    assert {r[0] for r in rows(db_url, "SELECT id FROM konduit_executions_all")} \
        == {h.id for h in today}
    left = [r[0] for r in rows(db_url, "SELECT konduit_history_days()")]
    assert len(left) in (1, 2) and max(left) == max(days)
    # The history's partitions went whole: no row of them was deleted.
    assert int(value(db_url, "SELECT count(*) FROM pg_inherits WHERE inhparent ="
                             " 'konduit_history_tasks'::regclass")) == len(left)


def _hot_tables(url: str) -> set[str]:
    """The tables whose rows go when an execution's row is deleted: by a foreign key that
    cascades (from the execution, or from a row that goes with it), or by the execution's
    delete trigger (steps and tasks)."""
    edges = rows(url, """
        SELECT c.conrelid::regclass::text, c.confrelid::regclass::text
        FROM pg_constraint c
        WHERE c.contype = 'f' AND c.confdeltype = 'c'
          AND c.conrelid::regclass::text LIKE 'konduit\\_%%'""")
    found = {"konduit_executions", "konduit_steps", "konduit_tasks"}
    grew = True
    while grew:
        grew = False
        for child, parent in edges:
            if parent in found and child not in found:
                found.add(child)
                grew = True
    return found


def test_the_history_keeps_every_table_an_execution_owns_with_the_same_columns(db_url: str) -> None:
    """A fitness test for migrations to come: a table added with rows that go with their
    execution must move with it (else a move deletes them), and a column added to a hot table
    must be added to its history table, view and konduit_<table>_since and _of functions (else
    a move fails, or a read loses it)."""
    kept = {f"konduit_{t}" for t in tables(db_url)}
    assert _hot_tables(db_url) == kept
    for t in tables(db_url):
        def columns(rel: str) -> list[tuple[str, str, bool]]:
            return [(str(n), str(ty), bool(nn)) for n, ty, nn in rows(db_url, """
                SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
                WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
                ORDER BY attnum""", rel)]
        hot = columns(f"konduit_{t}")
        kept = columns(f"konduit_history_{t}")
        # The hot table's columns in its order, and the history's own (history_finished_at,
        # the partition key); a column added to the hot table after migration 0041 comes after
        # them in the history (ALTER TABLE appends: the move inserts by name).
        assert [c for c in kept if not c[0].startswith("history_")] == hot, t
        assert ("history_finished_at", "timestamp with time zone", True) in kept, t
        assert [(n, ty) for n, ty, _ in columns(f"konduit_{t}_all")] \
            == [(n, ty) for n, ty, _ in hot], t
        # And konduit_<table>_since and _of (migration 0047) return them: their bodies list them.
        with psycopg.connect(db_url) as conn:
            for call in (f"konduit_{t}_since('-infinity')", f"konduit_{t}_of(gen_random_uuid())"):
                cursor = conn.execute(f"SELECT * FROM {call} LIMIT 0".encode())
                assert cursor.description is not None
                assert [c.name for c in cursor.description] == [n for n, _, _ in hot], call


def test_the_migration_is_online_on_a_database_with_history(empty_db_url: str) -> None:
    """Migration 0041 makes empty tables, views and functions: it waits on no lock a running
    workload holds on the hot tables, however much history they keep; the history then moves
    in batches."""
    db_url = empty_db_url
    migrated_before(db_url, 41)
    fill_day(db_url, executions=2_000, width=5)
    version41 = next(m for m in migrations() if m.version == 41)
    with psycopg.connect(db_url) as busy, psycopg.connect(db_url) as migrating:
        # A transaction of the workload, open, holding row locks and its table locks.
        busy.execute("UPDATE konduit_executions SET status = status WHERE id IN"
                     " (SELECT id FROM konduit_executions LIMIT 10)")
        busy.execute("SELECT 1 FROM konduit_tasks LIMIT 1 FOR UPDATE")
        migrating.execute("SET lock_timeout = '5s'")
        migrating.execute(version41.sql.encode())
        migrating.execute("INSERT INTO konduit_schema_version (version, name) VALUES (%s, %s)",
                          (version41.version, version41.name))
        migrating.commit()
        busy.rollback()
    with konduit.App([], database_url=db_url) as app:
        app.migrate()
        assert move(app, 3600.0) == 2_000
        # The day that ended 25 hours ago (the fill's executions finished over it) lies in two
        # UTC days, both ended an hour ago at the latest: dropped whole.
        assert app.prune("1h") == 2_000
    assert value(db_url, "SELECT count(*) FROM konduit_executions_all") == 0
    assert value(db_url, "SELECT count(*) FROM konduit_tasks_all") == 0


def test_the_hot_paths_never_read_the_history() -> None:
    """What the workers run per task (the claim, the round: every statement with a kept plan),
    every write and every row lock reads the hot tables only; the history is read by the reads
    of one execution (through the konduit_<table>_all views) and by the history's own
    statements. A statement of the round that joined a view would read every day's partitions."""
    from konduit.db.queries import all_queries

    history = re.compile(r"\bkonduit_(history_\w+|\w+_all\b|\w+_(of|since)\()")
    writes = re.compile(r"\b(INSERT|UPDATE|DELETE|FOR UPDATE|FOR SHARE|FOR NO KEY UPDATE)\b")
    own = {"execution_move_to_history_if_still_finished", "history_day_list_ended_before",
           "history_execution_list_ids_of_day", "history_day_drop",
           # A keyed start: its key must not be one a moved execution holds (one probe of the
           # history's key index per day kept, in the insert that takes the key).
           "execution_insert_many_with_roots",
           # A fork writes a new execution from its origin's rows, which may have moved.
           "step_copy_ended_from_origin", "task_copy_ended_from_origin",
           "output_copy_from_origin",
           # Retention keeps an event an execution took while the execution is kept, wherever
           # (one probe of an execution per old event taken by one, not per task).
           "event_delete_before"}
    found = []
    for query in all_queries().values():
        if query.name in own or not history.search(query.sql):
            continue
        if query.pinned_plan or writes.search(query.sql) or query.name.startswith("task_claim"):
            found.append(query.name)
    assert found == []


def test_a_moved_key_is_kept_in_one_table_until_its_day_is_dropped(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan()
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        old = app.start(wf.name, {}, idempotency_key="old")
        new = app.start(wf.name, {}, idempotency_key="new")
        old.wait(timeout=60)
        new.wait(timeout=60)
    age(db_url, [old.id], days=3)
    assert move(app) == 2
    assert {r[0]: r[1] for r in rows(db_url, "SELECT idempotency_key, execution_id"
                                             " FROM konduit_history_keys")} \
        == {"old": old.id, "new": new.id}
    assert app.start(wf.name, {}, idempotency_key="old").id == old.id
    assert app.prune("1d") == 1
    assert [r[0] for r in rows(db_url, "SELECT idempotency_key FROM konduit_history_keys")] \
        == ["new"]


def test_a_child_its_parent_still_waits_for_is_not_moved(
        make_app: Callable[..., konduit.App], db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's wake after its child ended can be missed (the worker died right after, or
    the child ran on workers without the parent's workflow): the workers' waits pass is the
    backstop, and it finds the child in the hot tables. A move (or a prune) must leave such a
    child there (migration 0046), or the parent waits for ever; once the parent woke, the
    child moves."""
    from konduit.engine import waits

    child = konduit.Workflow("awaited-child", version=1)
    child.step(name="only")(lambda ctx: {"child_of": ctx.input})
    parent = konduit.Workflow("awaited-parent", version=1)
    parent.subworkflow(name="call", workflow="awaited-child", input=lambda ctx: 7)
    app = make_app(child, parent)

    async def missed(*args: object, **kwargs: object) -> None:
        return None  # the prompt wake never happens

    monkeypatch.setattr(waits, "wake_parent", missed)
    with running_worker(app, poll_interval=0.05, maintenance_interval=3600.0):
        handle = app.start("awaited-parent", {})

        def child_ended() -> bool:
            kids = app._read(lambda m: m.children(handle.id))
            return bool(kids) and app.status(kids[0].id).status == "succeeded"
        wait_for(child_ended, timeout=60)
    monkeypatch.undo()
    [kid] = app._read(lambda m: m.children(handle.id))
    assert app.status(handle.id).status == "running"
    assert value(db_url, "SELECT status FROM konduit_tasks WHERE execution_id = %s",
                 handle.id) == "waiting"

    age(db_url, [kid.id], days=2)
    assert move(app) == 0  # the parent runs; its child is awaited
    assert app.prune("1d") == 0  # nor does a prune delete it
    assert value(db_url, "SELECT count(*) FROM konduit_executions WHERE id = %s", kid.id) == 1

    with running_worker(app, poll_interval=0.05, maintenance_interval=0.2):
        assert handle.wait(timeout=60).output == {"child_of": 7}
    assert move(app) == 2
