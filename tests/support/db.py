"""Reading a test database directly, where a test checks what the engine wrote."""

from __future__ import annotations

import time
from typing import Any

import psycopg


def rows(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """The rows of one statement (none for a statement that returns none), on a connection of
    its own (autocommit: a test reads what is committed, and holds no snapshot or lock while
    the engine goes on)."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql.encode(), params)
        return cursor.fetchall() if cursor.description is not None else []


def value(url: str, sql: str, *params: Any) -> Any:
    """The first column of the one row of ``sql`` (a count, a status)."""
    found = rows(url, sql, *params)
    assert len(found) == 1, f"expected one row, got {found!r}"
    return found[0][0]


def wait_until_blocked(url: str, pid: int, timeout: float = 30.0) -> None:
    """Wait until backend ``pid`` waits on a lock (a test of lock order holds one on purpose).
    On a connection of its own, polled often: the wait is the event the test is after."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT cardinality(pg_blocking_pids(%s))", (pid,)).fetchone()
            if row and row[0] > 0:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock within {timeout} s")


def migrated_before(url: str, before: int) -> None:
    """Apply the migrations older than ``before`` by hand, as an older konduit did (a database
    to test a migration on, with rows the older schema allowed)."""
    from konduit.db.migrate import migrations

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE konduit_schema_version (version integer PRIMARY KEY, "
                     "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for m in migrations():
            if m.version < before:
                conn.execute(m.sql.encode())
                conn.execute("INSERT INTO konduit_schema_version (version, name) VALUES (%s, %s)",
                             (m.version, m.name))
