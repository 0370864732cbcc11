"""What a task writes to the database (issue 30: WAL per task): the index entries its rows get,
read back from the server's WAL (``pg_walinspect``) over a small real workload. Each index entry
is a WAL record (60-150 bytes) and a write for vacuum; an index that a migration dropped to save
them must not come back unnoticed."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.migrate import migrate
from tests.support.db import migrated_before
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

_BLOCK = re.compile(r"blkref #0: rel (\d+)/(\d+)/(\d+)")

INSERTING = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")
"""The B-tree records that add an entry to a leaf page (a split adds the entry that caused it)."""


def walinspect(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.errors.UndefinedFile:
        pytest.skip("pg_walinspect (PostgreSQL 15+'s contrib) is not installed on the test server")


def lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def index_entries(conn: psycopg.Connection[Any], start: str, end: str) -> Counter[str]:
    """Entries added to each konduit index of this database between two WAL positions (the WAL
    is the server's: other databases' records are told apart by their database's oid)."""
    names = {int(node): name for node, name in conn.execute(
        "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c"
        " WHERE c.relkind = 'i' AND c.relname LIKE 'konduit%%'").fetchall()}
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    database = int(row[0])
    found: Counter[str] = Counter()
    for (block,) in conn.execute(
            "SELECT block_ref FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)"
            " WHERE resource_manager = 'Btree' AND record_type = ANY(%s)",
            (start, end, list(INSERTING))).fetchall():
        m = _BLOCK.search(block or "")
        if m and int(m.group(2)) == database and int(m.group(3)) in names:
            found[names[int(m.group(3))]] += 1
    return found


def of_table(entries: Counter[str], table: str) -> dict[str, int]:
    return {name: n for name, n in entries.items() if name.startswith(table + "_")}


@pytest.mark.fresh_database  # pg_walinspect is created in it
def test_an_attempt_writes_an_entry_into_its_key_and_its_tasks_index_only(make_app) -> None:
    """An attempt is keyed by its lease token (migration 0039): each claim's attempt adds one
    entry to the table's key and one to konduit_attempts_task, and none to an index of its
    identity id (there is none), nor when the attempt ends (a heap-only update)."""
    wf = konduit.Workflow("wal-attempts", version=1)

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return 1

    app = make_app(wf)
    app.migrate()
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        walinspect(conn)
        start = lsn(conn)
        with running_worker(app, concurrency=4):
            for handle in [app.start(wf.name) for _ in range(6)]:
                assert handle.wait(timeout=30).status == "succeeded"
        entries = index_entries(conn, start, lsn(conn))
        row = conn.execute("SELECT count(*), count(*) FILTER (WHERE outcome = 'succeeded')"
                           " FROM konduit_attempts").fetchone()
    assert row == (6, 6)
    assert of_table(entries, "konduit_attempts") == {
        "konduit_attempts_pkey": 6, "konduit_attempts_task": 6}, entries


@pytest.mark.parametrize("prebuilt", [False, True], ids=["built-by-the-migration", "prebuilt"])
def test_0039_keys_a_history_of_attempts_by_lease_token(empty_db_url: str,
                                                        prebuilt: bool) -> None:
    """Migration 0039 on a history: every attempt keeps its row and its logs, the lease token is
    the primary key (an index an operator built beforehand, concurrently, as
    docs/internals/schema.md says, becomes it), the id has no index, the logs' foreign key still
    holds and still cascades."""
    migrated_before(empty_db_url, 39)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO konduit_workflows (name, version, spec_hash, spec) "
                     "VALUES ('old', 1, 'h', '{}')")
        conn.execute("INSERT INTO konduit_executions (id, workflow_name, workflow_version,"
                     " status, input_hash, steps_pending, finished_at)"
                     " VALUES (gen_random_uuid(), 'old', 1, 'succeeded', 'h', 0, now())")
        conn.execute("""
            WITH t AS (
                INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, status,
                                           max_attempts, attempt, finished_at)
                SELECT (SELECT id FROM konduit_executions), 'old@1', 's', g, 'succeeded', 2, 2,
                       now()
                FROM generate_series(0, 499) g
                RETURNING id)
            INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token, finished_at,
                                          outcome)
            SELECT t.id, n, 'w', gen_random_uuid(), now(),
                   CASE n WHEN 1 THEN 'retry' ELSE 'succeeded' END
            FROM t CROSS JOIN generate_series(1, 2) AS n""")
        conn.execute("INSERT INTO konduit_attempt_logs (lease_token, records)"
                     " SELECT lease_token, '[]' FROM konduit_attempts WHERE attempt = 1")
        if prebuilt:
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY konduit_attempts_lease_token_pkey"
                         " ON konduit_attempts (lease_token)")

    async def go() -> list[int]:
        db = Database(empty_db_url, min_size=1, max_size=1)
        await db.open()
        try:
            return [m.version for m in await migrate(db)]
        finally:
            await db.close()

    assert 40 in asyncio.run(go())
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        indexes = dict(conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'konduit_attempts'::regclass").fetchall())
        assert set(indexes) == {"konduit_attempts_pkey", "konduit_attempts_task"}, indexes
        assert indexes["konduit_attempts_pkey"].endswith("USING btree (lease_token)")
        assert conn.execute("SELECT count(*), count(DISTINCT id) FROM konduit_attempts"
                            ).fetchone() == (1000, 1000)
        fk = conn.execute("SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint"
                          " WHERE conname = 'konduit_attempt_logs_lease_token_fkey'").fetchone()
        assert fk is not None and fk[0], fk
        assert "ON DELETE CASCADE" in fk[1]
        conn.execute("DELETE FROM konduit_tasks WHERE map_index < 100")
        assert conn.execute("SELECT (SELECT count(*) FROM konduit_attempts),"
                            " (SELECT count(*) FROM konduit_attempt_logs)").fetchone() == (800, 400)
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO konduit_attempt_logs (lease_token, records)"
                         " VALUES (gen_random_uuid(), '[]')")


@pytest.mark.fresh_database  # pg_walinspect is created in it
def test_a_heartbeat_updates_its_running_tasks_in_place(make_app) -> None:
    """A heartbeat moves the lease expiry of each task its worker runs; no index of
    konduit_tasks keys that column (migration 0040), so a beat is a heap-only update: while two
    tasks run through a dozen beats, no entry is added to any index of the table (before, each
    beat wrote four per task: about 536 bytes of WAL)."""
    import threading

    release = threading.Event()
    started = threading.Semaphore(0)
    wf = konduit.Workflow("wal-heartbeats", version=1)

    @wf.step()
    def hold(ctx: konduit.Context) -> int:
        started.release()
        release.wait(60)
        return 1

    app = make_app(wf)
    app.migrate()
    with psycopg.connect(app.database_url, autocommit=True) as conn:
        walinspect(conn)
        with running_worker(app, concurrency=2, lease_seconds=2.0, heartbeat_interval=0.1):
            handles = [app.start(wf.name) for _ in range(2)]
            try:
                assert started.acquire(timeout=30) and started.acquire(timeout=30)
                before = conn.execute("SELECT lease_expires_at FROM konduit_tasks"
                                      " ORDER BY id").fetchall()
                start = lsn(conn)
                moved = 0
                for _ in range(600):  # until each lease moved a dozen times (about 1.2 s)
                    now = conn.execute("SELECT lease_expires_at FROM konduit_tasks"
                                       " ORDER BY id").fetchall()
                    if now != before:
                        moved, before = moved + 1, now
                    if moved >= 12:
                        break
                    release.wait(0.05)
                end = lsn(conn)
            finally:
                release.set()
            for handle in handles:
                assert handle.wait(timeout=30).status == "succeeded"
        entries = of_table(index_entries(conn, start, end), "konduit_tasks")
        row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
                           ).fetchone()
    assert row is not None
    print(f"\n{moved} beats of 2 running tasks: {float(row[0]) / (2 * max(moved, 1)):.0f} bytes"
          " of WAL per task and beat (server-wide: a quiet server's figure is the beats')")
    assert moved >= 12, "the leases were not extended"
    assert entries == {}, entries
