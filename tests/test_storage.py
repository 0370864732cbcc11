"""The storage layer: invariants PostgreSQL itself enforces, migrations, and the named queries.

The schema must refuse what the engine promises never to do (a task created twice, a status
outside the closed set, a running task without a lease) even if engine code is wrong; migrations
apply each file exactly once however many processes race; every named query is documented,
named by convention and valid SQL on the real server.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import konduit
from konduit.db.database import Database
from konduit.db.migrate import (
    current_version,
    ensure_current,
    latest_version,
    migrate,
    migrations,
)
from konduit.db.queries import all_fragments, all_queries, parse_queries, q

pytestmark = pytest.mark.storage

ENTITIES = ("alert", "attempt", "clock", "event", "execution", "fair_key", "flow_limit", "journal",
            "history", "leader",
            "map_chunk", "output", "replica", "schedule", "schema_version", "step", "stream", "task",
            "trigger", "webhook_delivery", "webhook_subscription", "worker", "workflow")
NOT_PREPARABLE = {  # DDL and a DO block: PREPARE takes DML only
    "schema_version_table_create_if_absent", "schema_version_drop_everything",
    "clock_virtual_install", "clock_virtual_remove"}  # a test database's virtual clock
EXECUTION = uuid.UUID("00000000-0000-4000-8000-000000000001")




@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a migrated database holding one workflow and one execution."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "INSERT INTO konduit_workflows (name, version, spec_hash, spec) "
            "VALUES ('wf', 1, 'h', '{}')"
        )
        c.execute(
            "INSERT INTO konduit_executions (id, workflow_name, workflow_version, input_hash, "
            "steps_pending) VALUES (%s, 'wf', 1, 'h', 1)",
            (EXECUTION,),
        )
        yield c


def insert_task(c: psycopg.Connection[Any], step: str = "s", map_index: int = 0,
                **columns: Any) -> int:
    values = {"execution_id": EXECUTION, "workflow": "wf@1", "step": step,
              "map_index": map_index, "max_attempts": 3, **columns}
    names = ", ".join(values)
    marks = ", ".join(f"%({k})s" for k in values)
    row = c.execute(f"INSERT INTO konduit_tasks ({names}) VALUES ({marks}) RETURNING id",
                    values).fetchone()
    assert row is not None
    return int(row[0])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- invariants the schema enforces ------------------------------------------------------------


def test_a_task_cannot_be_created_twice(conn):
    insert_task(conn, "s", 0)
    insert_task(conn, "s", 1)  # another item of the same step is a different task
    insert_task(conn, "other", 0)
    with pytest.raises(psycopg.errors.UniqueViolation) as info:
        insert_task(conn, "s", 0)
    # UNIQUE (execution_id, step, map_index[, generation]): a repair may add a new generation
    assert info.value.diag.table_name == "konduit_tasks"
    assert "execution_id_step_map_index" in (info.value.diag.constraint_name or "")
    (n,) = conn.execute("SELECT count(*) FROM konduit_tasks").fetchone()
    assert n == 3


def test_the_engine_insert_of_an_existing_task_is_a_no_op(conn):
    sql = q("task_insert_many")
    params: dict[str, Any] = dict(
        execution_id=EXECUTION, workflow="wf@1", steps=["s", "s"], map_indexes=[0, 1],
        items=[Jsonb(1), Jsonb(2)], queues=["default"] * 2, priorities=[0, 0], max_attempts=[3, 3],
        generation=1,  # extra keys are ignored by queries that do not use them
    )
    # Per-task columns added later (deadlines...) get NULLs: one per task for array parameters.
    for name, is_array in re.findall(r"%\(([a-z_]+)\)s(::[a-z0-9]+\[\])?", sql):
        params.setdefault(name, [None, None] if is_array else None)
    conn.execute(sql, params)
    conn.execute(sql, params)  # a redelivered fan-in decision
    rows = conn.execute("SELECT step, map_index, item FROM konduit_tasks ORDER BY map_index")
    assert rows.fetchall() == [("s", 0, 1), ("s", 1, 2)]


@pytest.mark.parametrize(
    ("table", "sql"),
    [
        ("konduit_tasks",
         "INSERT INTO konduit_tasks (execution_id, workflow, step, max_attempts, status) "
         "VALUES (%(e)s, 'wf@1', 's', 3, 'done')"),
        ("konduit_executions",
         "UPDATE konduit_executions SET status = 'finished' WHERE id = %(e)s"),
        ("konduit_steps",
         "INSERT INTO konduit_steps (execution_id, step, status, up_total, up_pending) "
         "VALUES (%(e)s, 's', 'ready', 0, 0)"),
        ("konduit_attempts", None),
    ],
    ids=["task", "execution", "step", "attempt"],
)
def test_status_values_outside_the_closed_set_are_refused(conn, table, sql):
    if table == "konduit_attempts":
        task = insert_task(conn)
        sql = ("INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token, outcome, "
               f"finished_at) VALUES ({task}, 1, 'w', gen_random_uuid(), 'exploded', now())")
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        conn.execute(sql, {"e": EXECUTION})
    assert info.value.diag.table_name == table


def test_a_running_task_must_carry_a_lease(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_task(conn, "no-lease", status="running", attempt=1)
    with pytest.raises(psycopg.errors.CheckViolation):  # a token without an expiry is no lease
        insert_task(conn, "no-expiry", status="running", attempt=1, lease_token=uuid.uuid4())
    task = insert_task(conn, "leased", status="running", attempt=1, lease_token=uuid.uuid4(),
                       lease_expires_at="2030-01-01T00:00:00Z")
    with pytest.raises(psycopg.errors.CheckViolation):  # dropping the lease of a running task
        conn.execute("UPDATE konduit_tasks SET lease_token = NULL WHERE id = %s", (task,))
    with pytest.raises(psycopg.errors.CheckViolation):  # a ready task holding a lease
        insert_task(conn, "ready-leased", lease_token=uuid.uuid4(),
                    lease_expires_at="2030-01-01T00:00:00Z")


def test_tasks_and_steps_belong_to_an_execution_and_go_with_it(conn):
    """Checked per statement, not per row (migration 0009): a step of no execution is refused
    (a mixed batch too, naming the table), and deleting executions deletes their tasks, steps
    and attempts, and nothing of another execution."""
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as info:
        conn.execute(
            "INSERT INTO konduit_steps (execution_id, step, status, up_total, up_pending) "
            "VALUES (%s, 'a', 'waiting', 0, 0), (%s, 'b', 'waiting', 0, 0)",
            (EXECUTION, uuid.uuid4()),
        )
    assert info.value.diag.table_name == "konduit_steps"
    other = uuid.uuid4()
    conn.execute(
        "INSERT INTO konduit_executions (id, workflow_name, workflow_version, input_hash, "
        "steps_pending) VALUES (%s, 'wf', 1, 'h', 1)", (other,))
    for execution in (EXECUTION, other):
        conn.execute(
            "INSERT INTO konduit_steps (execution_id, step, status, up_total, up_pending) "
            "VALUES (%s, 's', 'waiting', 0, 0)", (execution,))
        task = insert_task(conn, execution_id=execution)
        conn.execute("INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token) "
                     "VALUES (%s, 1, 'w', gen_random_uuid())", (task,))
    conn.execute("DELETE FROM konduit_executions WHERE id = %s", (EXECUTION,))
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM konduit_tasks WHERE execution_id = %(e)s),"
        " (SELECT count(*) FROM konduit_steps WHERE execution_id = %(e)s),"
        " (SELECT count(*) FROM konduit_tasks WHERE execution_id = %(o)s),"
        " (SELECT count(*) FROM konduit_steps WHERE execution_id = %(o)s),"
        " (SELECT count(*) FROM konduit_attempts)", {"e": EXECUTION, "o": other}).fetchone()
    assert counts == (0, 0, 1, 1, 1)


def test_other_task_and_execution_invariants(conn):
    with pytest.raises(psycopg.errors.CheckViolation):  # more attempts than allowed
        insert_task(conn, "a", attempt=4, max_attempts=3)
    with pytest.raises(psycopg.errors.CheckViolation):  # finished without finished_at
        insert_task(conn, "b", status="succeeded")
    with pytest.raises(psycopg.errors.CheckViolation):  # ended execution without finished_at
        conn.execute("UPDATE konduit_executions SET status = 'succeeded' WHERE id = %s",
                     (EXECUTION,))
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # a task of no execution
        conn.execute(
            "INSERT INTO konduit_tasks (execution_id, workflow, step, max_attempts) "
            "VALUES (%s, 'wf@1', 's', 3)", (uuid.uuid4(),)
        )
    with pytest.raises(psycopg.errors.UniqueViolation):  # one idempotency key per workflow
        for _ in range(2):
            conn.execute(
                "INSERT INTO konduit_executions (id, workflow_name, workflow_version, input_hash, "
                "steps_pending, idempotency_key) VALUES (%s, 'wf', 1, 'h', 1, 'k')",
                (uuid.uuid4(),),
            )


def test_hot_tables_keep_room_for_hot_updates_and_partial_indexes(conn):
    for table in ("konduit_tasks", "konduit_steps"):
        (options,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = %s", (table,)
        ).fetchone()
        fillfactor = int(next(o for o in options if o.startswith("fillfactor=")).split("=")[1])
        assert fillfactor < 100, table
    indexes = dict(conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'konduit_tasks'"
    ).fetchall())
    assert "WHERE (status = 'ready'::text)" in indexes["konduit_tasks_ready"]
    assert "WHERE (status = 'running'::text)" in indexes["konduit_tasks_running"]
    # A heartbeat moves lease_expires_at: no index of the table may key it (migration 0040).
    assert not [n for n, d in indexes.items() if "lease_expires_at" in d], indexes


# -- migrations ----------------------------------------------------------------------------------


def test_migrations_are_numbered_and_idempotent(empty_db_url):
    found = migrations()
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert latest_version() == found[-1].version

    async def go() -> tuple[int, list[Any], list[Any], int]:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            before = await current_version(db)
            first = await migrate(db)
            second = await migrate(db)
            return before, first, second, await current_version(db)
        finally:
            await db.close()

    before, first, second, after = run(go())
    assert before == 0
    assert [m.version for m in first] == [m.version for m in found]
    assert second == []
    assert after == latest_version()
    with psycopg.connect(empty_db_url) as c:
        rows = c.execute("SELECT version, name FROM konduit_schema_version ORDER BY version")
        assert rows.fetchall() == [(m.version, m.name) for m in found]


def _probe(version: int, name: str, answer: str) -> Any:
    """A migration past this konduit's: a table of its own, and konduit_probe() saying which
    migration defined it last."""
    from konduit.db.migrate import Migration

    return Migration(version, name, f"CREATE TABLE konduit_{name} (x int); "
                                    f"CREATE OR REPLACE FUNCTION konduit_probe() RETURNS text "
                                    f"LANGUAGE sql AS $$ SELECT '{answer}' $$;")


def _schema(url: str) -> tuple[list[Any], list[Any], Any]:
    """The migrations recorded, konduit's tables, and what konduit_probe() says."""
    with psycopg.connect(url) as c:
        recorded = c.execute("SELECT version, name FROM konduit_schema_version "
                             "ORDER BY version").fetchall()
        tables = c.execute("SELECT relname FROM pg_class WHERE relname LIKE 'konduit_probe%' "
                           "ORDER BY relname").fetchall()
        probe = c.execute("SELECT konduit_probe()").fetchone()
    return recorded, tables, probe


def _sql(url: str, statement: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(statement.encode())


def test_a_gap_below_the_newest_recorded_migration_is_refused_naming_it(empty_db_url,
                                                                         monkeypatch):
    """A database migrated by a build that had migration N+1 and not N (a development branch)
    records N+1 as its newest. Applying N now, after N+1, would let N's konduit_probe() replace
    N+1's: `migrate` and the worker's check refuse, naming N by number and file, and nothing is
    applied (not even N+2, which follows the gap). Recording N, as the error says, proceeds."""
    import konduit.db.migrate as migrating

    real = migrations()
    top = real[-1].version
    probe_a = _probe(top + 1, "probe_a", "a")
    probe_b = _probe(top + 2, "probe_b", "b")
    probe_c = _probe(top + 3, "probe_c", "c")

    async def go() -> tuple[Any, Any, Any, tuple[Any, ...], list[Any]]:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, probe_b])
            await migrate(db)  # the branch's build: it had N+1 (probe_b) and not N (probe_a)
            before = _schema(empty_db_url)
            monkeypatch.setattr(migrating, "migrations",
                                lambda: [*real, probe_a, probe_b, probe_c])
            with pytest.raises(konduit.SchemaGap) as refused:
                await migrate(db)
            with pytest.raises(konduit.SchemaGap) as checked:
                await ensure_current(db)
            after = _schema(empty_db_url)
            # The way on the error gives: probe_a checked and applied by hand, and recorded.
            _sql(empty_db_url, "CREATE TABLE konduit_probe_a (x int)")
            _sql(empty_db_url, "INSERT INTO konduit_schema_version (version, name) "
                             f"VALUES ({top + 1}, 'probe_a')")
            applied = await migrate(db)
            await ensure_current(db)
            return before, after, refused.value, (checked.value,), applied
        finally:
            await db.close()

    before, after, refused, (checked,), applied = run(go())
    assert isinstance(refused, konduit.SchemaOutdated)
    assert refused.code == "schema_gap"
    assert refused.versions == (top + 1,)
    assert refused.files == (f"{top + 1:04d}_probe_a.sql",)
    assert refused.newest == top + 2
    message = str(refused)
    assert f"recorded migration {top + 2:04d} but never applied {top + 1:04d}_probe_a.sql" \
        in message
    assert "probe_b.sql" not in message and "probe_c" not in message
    assert "konduit db reset --yes" in message
    assert (f"INSERT INTO konduit_schema_version (version, name) VALUES ({top + 1}, 'probe_a')"
            in message)
    assert "\n" not in message  # the command line prints it on one line
    assert str(checked) == message
    # Nothing applied: the same records, no probe_a nor probe_c, N+1's function still.
    assert after == before
    assert after[1] == [("konduit_probe_b",)] and after[2] == ("b",)
    assert [m.name for m in applied] == ["probe_c"]


def test_a_renumbered_migration_is_refused_with_the_record_to_renumber(empty_db_url,
                                                                       monkeypatch):
    """A branch's migration moved to a free number after a database applied it under its old
    one (0040_attempts_keyed_by_lease became 0039 while a development database had it as
    0040): the database lacks the new number, and what this konduit has under the old number
    is another migration. The error says which record to renumber; renumbered, `migrate`
    applies the other one."""
    import konduit.db.migrate as migrating

    real = migrations()
    top = real[-1].version
    moved = _probe(top + 1, "probe_moved", "moved")
    other = _probe(top + 2, "probe_other", "other")

    async def go() -> tuple[Any, Any, Any, list[Any]]:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            monkeypatch.setattr(migrating, "migrations",
                                lambda: [*real, _probe(top + 2, "probe_moved", "moved")])
            await migrate(db)
            before = _schema(empty_db_url)
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, moved, other])
            with pytest.raises(konduit.SchemaGap) as refused:
                await migrate(db)
            after = _schema(empty_db_url)
            _sql(empty_db_url, f"UPDATE konduit_schema_version SET version = {top + 1} "
                             f"WHERE version = {top + 2}")
            return before, after, refused.value, await migrate(db)
        finally:
            await db.close()

    before, after, refused, applied = run(go())
    assert after == before
    assert refused.files == (f"{top + 1:04d}_probe_moved.sql",)
    assert (f"It recorded probe_moved as {top + 2:04d}, which this konduit numbers "
            f"{top + 1:04d}") in str(refused)
    assert (f"UPDATE konduit_schema_version SET version = {top + 1} WHERE version = {top + 2}"
            in str(refused))
    assert "INSERT INTO" not in str(refused)  # not a migration to apply: it was
    assert [m.name for m in applied] == ["probe_other"]


def test_migrations_this_konduit_does_not_have_are_left_alone_and_named(empty_db_url, monkeypatch,
                                                                        caplog):
    """A database a newer konduit migrated records migrations this one does not have: no gap,
    so `migrate` applies nothing and the worker's check lets it run, as before; both say which
    migrations this konduit does not know (the check returns them, `migrate` logs them)."""
    import logging

    import konduit.db.migrate as migrating

    real = migrations()
    newer = _probe(real[-1].version + 1, "probe_newer", "newer")

    async def go() -> tuple[dict[int, str], list[Any]]:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, newer])
            await migrate(db)
            assert await ensure_current(db) == {}
            monkeypatch.setattr(migrating, "migrations", lambda: real)
            caplog.clear()
            return await ensure_current(db), await migrate(db)
        finally:
            await db.close()

    caplog.set_level(logging.WARNING, logger="konduit.db.migrate")
    unknown, applied = run(go())
    assert applied == []
    assert unknown == {newer.version: "probe_newer"}
    (record,) = [r for r in caplog.records if r.name == "konduit.db.migrate"]
    assert record.levelno == logging.WARNING
    assert (f"migrations this konduit does not know: {newer.version:04d}_probe_newer"
            in record.getMessage())
    assert f"this konduit's schema is {real[-1].version:04d}" in record.getMessage()


def test_another_migration_under_one_of_this_konduits_numbers_is_refused_naming_both(
        empty_db_url, monkeypatch):
    """A database recorded N as a branch's migration (or before the file was renamed), where
    this konduit has another name at N: the two look alike in the record, and if it is another
    migration, this konduit's N was never applied. `migrate` and the worker's check refuse with
    SchemaConflict naming both, and nothing is applied (not N+1 either). Renaming the record, as
    the error says for a renamed file, proceeds."""
    import konduit.db.migrate as migrating

    real = migrations()
    top = real[-1].version
    theirs = _probe(top + 1, "probe_theirs", "theirs")
    ours = _probe(top + 1, "probe_ours", "ours")
    after = _probe(top + 2, "probe_after", "after")

    async def go() -> tuple[Any, Any, Any, Any, list[Any]]:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, theirs])
            await migrate(db)  # the branch's build
            before = _schema(empty_db_url)
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, ours, after])
            with pytest.raises(konduit.SchemaConflict) as refused:
                await migrate(db)
            with pytest.raises(konduit.SchemaConflict) as checked:
                await ensure_current(db)
            unchanged = _schema(empty_db_url)
            _sql(empty_db_url, f"UPDATE konduit_schema_version SET name = 'probe_ours' "
                             f"WHERE version = {top + 1}")
            applied = await migrate(db)
            await ensure_current(db)
            return before, unchanged, refused.value, checked.value, applied
        finally:
            await db.close()

    before, unchanged, refused, checked, applied = run(go())
    assert isinstance(refused, konduit.SchemaOutdated)
    assert refused.code == "schema_conflict"
    assert refused.versions == (top + 1,)
    assert refused.recorded == ("probe_theirs",)
    assert refused.files == (f"{top + 1:04d}_probe_ours.sql",)
    message = str(refused)
    assert (f"recorded migration {top + 1:04d} as probe_theirs, where this konduit has "
            f"{top + 1:04d}_probe_ours.sql") in message
    assert (f"UPDATE konduit_schema_version SET name = 'probe_ours' WHERE version = {top + 1}"
            in message)
    assert "konduit db reset --yes" in message and "\n" not in message
    assert str(checked) == message
    assert unchanged == before and unchanged[1] == [("konduit_probe_theirs",)]
    assert [m.name for m in applied] == ["probe_after"]


def test_two_of_this_konduits_migrations_recorded_under_each_others_numbers_are_refused(
        empty_db_url, monkeypatch):
    """Recorded names that this konduit has under other numbers are other migrations, not
    renamed files: refused, and no record rename is offered."""
    import konduit.db.migrate as migrating

    real = migrations()
    top = real[-1].version
    first, second = _probe(top + 1, "probe_one", "one"), _probe(top + 2, "probe_two", "two")

    async def go() -> Any:
        db = Database(empty_db_url, min_size=1, max_size=2)
        await db.open()
        try:
            monkeypatch.setattr(migrating, "migrations", lambda: [
                *real, _probe(top + 1, "probe_two", "two"), _probe(top + 2, "probe_one", "one")])
            await migrate(db)
            monkeypatch.setattr(migrating, "migrations", lambda: [*real, first, second])
            with pytest.raises(konduit.SchemaConflict) as refused:
                await migrate(db)
            return refused.value
        finally:
            await db.close()

    refused = run(go())
    assert refused.versions == (top + 1, top + 2)
    assert refused.recorded == ("probe_two", "probe_one")
    assert f"probe_two is this konduit's {top + 2:04d}: another migration" in str(refused)
    assert "UPDATE" not in str(refused)


def test_migrating_an_already_migrated_database_applies_nothing(db_url):
    async def go() -> list[Any]:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            return await migrate(db)
        finally:
            await db.close()

    assert run(go()) == []


def test_concurrent_migrators_apply_each_migration_exactly_once(empty_db_url):
    racers = 8
    barrier = threading.Barrier(racers)
    applied: list[list[int]] = []
    errors: list[BaseException] = []

    def racer() -> None:
        async def go() -> list[int]:
            db = Database(empty_db_url, min_size=1, max_size=1)
            await db.open()  # connect first, so the barrier releases the migrate calls together
            try:
                await asyncio.to_thread(barrier.wait, 30)
                return [m.version for m in await migrate(db)]
            finally:
                await db.close()

        try:
            applied.append(run(go()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(applied) == racers
    winners = [a for a in applied if a]
    assert winners == [[m.version for m in migrations()]]
    with psycopg.connect(empty_db_url) as c:
        (n,) = c.execute("SELECT count(*) FROM konduit_schema_version").fetchone()
    assert n == len(migrations())


# -- named queries -------------------------------------------------------------------------------


def _query_files() -> dict[str, dict[str, Any]]:
    folder = resources.files("konduit.db") / "sql"
    return {
        entry.name: parse_queries(entry.read_text(), entry.name, all_fragments())
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    }


def test_every_query_is_described_and_named_entity_verb():
    queries = all_queries()
    assert queries
    name = re.compile(rf"^({'|'.join(ENTITIES)})_[a-z]+(_[a-z]+)*$")
    for query in queries.values():
        assert query.description.strip(), query.name
        assert name.match(query.name), f"{query.name}: not entity_verb_qualifier"
        assert query.sql.strip(), query.name
        # every value is a bind parameter: only %(name)s placeholders, never %s
        assert not re.search(r"%s\b|%\((?![a-z_]+\)s)", query.sql), query.name
    # every file parses on its own and no name is defined twice across files
    per_file = [n for in_file in _query_files().values() for n in in_file]
    assert sorted(per_file) == sorted(queries)


def test_lease_fenced_writes_say_so_in_their_name():
    guards = ("_if_leased", "_if_held", "_if_leased_before_deadline", "_if_rescuable",
              "_if_past_deadline")
    fenced = []
    for query in all_queries().values():
        sql = " ".join(query.sql.split())
        if "UPDATE konduit_tasks" in sql and "konduit_lease_held(" in sql:  # migration 0020
            assert query.name.endswith(guards), query.name
            fenced.append(query.name)
    assert len(fenced) >= 5, fenced  # retry, release, lose x2, expire (complete: unnest)


def _sets_task_status(sql: str) -> bool:
    for clause in re.findall(r"UPDATE konduit_tasks\b.*?\bSET\b(.*?)(?:\bFROM\b|\bWHERE\b|$)",
                             sql, re.S):
        if re.search(r"(?:^|,)\s*status\s*=", clause):
            return True
    return False


def test_every_task_status_write_lives_in_the_transitions_module():
    """One module owns the task lifecycle: no other module calls a statement that writes a
    task's status."""
    writers = {name for name, query in all_queries().items() if _sets_task_status(query.sql)}
    assert {"task_claim_batch", "task_complete_many_if_leased", "task_retry_if_leased_before_deadline",
            "task_release_if_leased", "task_lose_if_rescuable", "task_end_if_rescuable",
            "task_expire_if_past_deadline", "task_cancel_unfinished"} <= writers, writers
    source = Path(konduit.__file__).parent
    for path in source.rglob("*.py"):
        if path.name == "transitions.py":
            continue
        text = path.read_text()
        for name in writers:
            assert f'"{name}"' not in text, f"{path.relative_to(source)} writes task status via {name}"


def test_every_task_status_write_lives_in_tasks_sql():
    """One file holds the task lifecycle's statements, so a new guard or status is written
    beside the others."""
    writers = {name: file for file, queries in _query_files().items()
               for name, query in queries.items() if _sets_task_status(query.sql)}
    assert len(writers) >= 11, writers  # the claims, the ends, retry, release, wait, wake ...
    elsewhere = {name: file for name, file in writers.items() if file != "tasks.sql"}
    assert not elsewhere, elsewhere


def _positional(sql: str) -> str:
    """%(name)s placeholders -> $1, $2 ... (the same name keeps its number)."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return re.sub(r"%\(([a-z_]+)\)s", number, sql)


def test_every_query_prepares_on_the_real_server(db_url):
    queries = all_queries()
    assert set(queries) >= NOT_PREPARABLE, "stale skip list"
    failures: dict[str, str] = {}
    with psycopg.connect(db_url, autocommit=True) as c:
        # The virtual clock's own statements read its table: prepared with it installed (and
        # it is removed again, so the database is reused as it was).
        c.execute(queries["clock_virtual_install"].sql)
        for i, query in enumerate(sorted(queries.values(), key=lambda x: x.name)):
            if query.name in NOT_PREPARABLE:
                continue
            first_word = query.sql.lstrip().split(None, 1)[0].upper()
            assert first_word in {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"}, query.name
            try:
                c.execute(f"PREPARE konduit_q{i} AS {_positional(query.sql)}")
                c.execute(f"DEALLOCATE konduit_q{i}")
            except psycopg.Error as exc:
                failures[query.name] = str(exc).splitlines()[0]
        c.execute(queries["clock_virtual_remove"].sql)
    assert not failures, failures
