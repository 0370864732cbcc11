"""The pool checks a connection only when it may be stale, never on the busy path.

A per-checkout ``SELECT``-style check costs a round trip on every transaction. Instead a
connection handed back moments ago is given out unchecked, unless its socket has something to
read (an idle session is sent nothing unless the server is closing it); one idle longer than
``check_idle_after`` is checked first. These tests pin both halves: a busy pool does no checks,
and a connection whose server session was killed is noticed before a caller gets it.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from konduit.db.database import Database

pytestmark = [pytest.mark.storage]


def test_a_busy_pool_hands_out_connections_without_a_check(db_url: str) -> None:
    async def go() -> tuple[int, int]:
        db = Database(db_url, min_size=1, max_size=2, check_idle_after=60.0)
        await db.open()
        try:
            await db.one("schema_version_get")  # the first checkout of a new connection
            checks_before = db.checks
            for _ in range(50):
                await db.one("schema_version_get")
            return db.checkouts, db.checks - checks_before
        finally:
            await db.close()

    checkouts, checks = asyncio.run(go())
    assert checkouts >= 51
    assert checks == 0, f"{checks} checks in 50 back-to-back transactions"


def test_a_connection_idle_past_the_limit_is_checked(db_url: str) -> None:
    async def go() -> int:
        db = Database(db_url, min_size=1, max_size=1, check_idle_after=0.0)
        await db.open()
        try:
            await db.one("schema_version_get")
            before = db.checks
            for _ in range(5):
                await db.one("schema_version_get")
            return db.checks - before
        finally:
            await db.close()

    assert asyncio.run(go()) == 5


def test_a_killed_session_is_noticed_before_use_even_when_recently_used(db_url: str) -> None:
    """The server ends the pooled connection's session (as a restart does) right after it was
    handed back; the next caller still gets a working connection, not the dead one."""

    async def go() -> tuple[int, int]:
        db = Database(db_url, min_size=1, max_size=1, check_idle_after=3600.0)
        await db.open()
        try:
            row = await db.one("schema_version_get")
            assert row is not None
            async with db.connection() as conn:
                cur = await conn.execute("SELECT pg_backend_pid() AS pid")
                victim = (await cur.fetchone() or {})["pid"]
            with psycopg.connect(db_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
                # Terminated: the backend is gone once it no longer shows in pg_stat_activity.
                for _ in range(200):
                    gone = admin.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (victim,)
                    ).fetchone()
                    if gone and gone[0] == 0:
                        break
                    await asyncio.sleep(0.01)
            before = db.checks
            async with db.connection() as conn:  # must not raise DatabaseUnavailable
                cur = await conn.execute("SELECT pg_backend_pid() AS pid")
                survivor = (await cur.fetchone() or {})["pid"]
            assert survivor != victim
            return db.checks - before, survivor
        finally:
            await db.close()

    checks, _ = asyncio.run(go())
    assert checks >= 1, "the dead connection was handed out without a check"
