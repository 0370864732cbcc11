"""What a task writes to the database (issue 30: WAL per task): the index entries its rows get,
read back from the server's WAL (``pg_walinspect``) over a small real workload. Each index entry
is a WAL record (60-150 bytes) and a write for vacuum; an index that a migration dropped to save
them must not come back unnoticed."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import psycopg
import pytest

import konduit
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage, pytest.mark.fresh_database]

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


def test_an_attempt_writes_an_entry_into_its_key_and_its_tasks_index_only(make_app) -> None:
    """An attempt is keyed by its lease token (migration 0040): each claim's attempt adds one
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
