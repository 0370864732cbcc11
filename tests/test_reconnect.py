"""After an outage the pool is whole again within about a second: the connections it broke are
replaced at once and retried at most a second apart, not after the driver's doubling pauses."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from konduit.db import database
from konduit.db.database import RECONNECT_MAX_DELAY, TCP_DEFAULTS, Database, tcp_options

pytestmark = [pytest.mark.storage]


def test_the_pool_in_use_is_the_one_with_the_capped_backoff() -> None:
    # A psycopg-pool that renamed the private method would silently bring the doubling back.
    assert database._POOL is database._Pool


def test_the_reconnect_backoff_never_exceeds_its_cap() -> None:
    attempt = database._CappedBackoff(timeout=60)
    delays = []
    for now in range(10):
        attempt.update_delay(float(now))
        delays.append(attempt.delay)
    assert 0.8 <= delays[0] <= RECONNECT_MAX_DELAY
    assert all(d <= RECONNECT_MAX_DELAY for d in delays)


def test_tcp_keepalives_are_added_unless_the_url_sets_them() -> None:
    assert tcp_options("postgresql://h/db") == TCP_DEFAULTS
    mine = tcp_options("postgresql://h/db?keepalives_idle=60&tcp_user_timeout=0")
    assert "keepalives_idle" not in mine and "tcp_user_timeout" not in mine
    assert mine["keepalives"] == "1"


def test_connections_an_outage_broke_are_replaced_at_once(db_url: str) -> None:
    """Every pooled connection's server process is terminated while idle (what a restart or a
    failover does to them): the next call gets a working connection in about a second. Checked
    one by one at checkout, with the driver's pause doubling after each failed check (1, 2, 4,
    8 s), it would wait 7 s or more, or time out."""

    async def run() -> float:
        db = Database(db_url, min_size=4, max_size=4, name="konduit-reconnect")
        await db.open()
        try:
            async def hold() -> None:
                async with db.connection() as conn:
                    await conn.execute("SELECT pg_sleep(0.2)")

            await asyncio.gather(*(hold() for _ in range(4)))  # four connections opened
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as admin:
                cur = await admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = 'konduit-reconnect'")
                row = await cur.fetchone()
                assert row is not None and row[0] == 4
            await asyncio.sleep(2.5)  # idle past the check threshold, as after an outage
            began = time.monotonic()
            async with db.connection() as conn:
                await conn.execute("SELECT 1")
            return time.monotonic() - began
        finally:
            await db.close()

    took = asyncio.run(run())
    print(f"first call after the outage: {took:.2f} s")
    assert took < 5.0
