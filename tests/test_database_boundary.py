"""The database boundary tells the truth about failures and reruns transient conflicts.

Every conflict here is a real one, made by PostgreSQL between two real connections: a deadlock,
a serialization failure, a lock timeout. Hooks (events, the pause between attempts) place the
second connection's statements exactly, so none depends on timing luck.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerrors
from psycopg.conninfo import make_conninfo

import konduit
from konduit.db import database
from konduit.db.database import Database, Tx
from konduit.db.queries import q
from konduit.errors import DatabaseConflict, DatabaseUnavailable, PoolExhausted
from tests.support.db import wait_until_blocked
from tests.support.fanin import fan_in_workflow

pytestmark = [pytest.mark.storage]

CLOSED_PORT = "postgresql://postgres@127.0.0.1:1/konduit"


@pytest.fixture
def pair_url(db_url: str) -> str:
    """The test database with a two-row table to fight over."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE pair (id int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO pair VALUES (1, 0), (2, 0)")
    return db_url


def value(url: str, row_id: int) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT v FROM pair WHERE id = %s", (row_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def opened(url: str, **kwargs: Any) -> Database:
    db = Database(url, **kwargs)
    await db.open()
    return db


def test_atomic_reruns_a_transaction_chosen_as_deadlock_victim(pair_url: str) -> None:
    url = pair_url
    other = psycopg.connect(url)
    other.execute("SET deadlock_timeout = '30s'")  # the other side never runs the check
    other_pid = other.info.backend_pid
    body_holds_2 = threading.Event()
    other_error: list[BaseException] = []

    def other_side() -> None:
        try:
            assert body_holds_2.wait(10)
            other.execute("UPDATE pair SET v = v + 1 WHERE id = 1")
            other.execute("UPDATE pair SET v = v + 1 WHERE id = 2")  # waits for the body
            other.commit()
        except BaseException as exc:
            other_error.append(exc)
            other.rollback()

    thread = threading.Thread(target=other_side, daemon=True)
    thread.start()
    attempts: list[int] = []

    async def body(tx: Tx) -> str:
        attempts.append(len(attempts) + 1)
        # This side checks for the cycle soon after it waits, so it is the one PostgreSQL aborts.
        await tx.conn.execute("SET LOCAL deadlock_timeout = '50ms'")
        await tx.conn.execute("UPDATE pair SET v = v + 10 WHERE id = 2")
        if len(attempts) == 1:
            body_holds_2.set()
            # The other side now holds row 1 and waits for row 2: taking row 1 closes the cycle.
            await asyncio.to_thread(wait_until_blocked, url, other_pid)
        await tx.conn.execute("UPDATE pair SET v = v + 10 WHERE id = 1")
        return "done"

    async def go() -> str:
        db = await opened(url, max_size=1)
        try:
            return await db.atomic(body)
        finally:
            await db.close()

    try:
        assert asyncio.run(go()) == "done"
        thread.join(10)
        assert not other_error
    finally:
        other.close()
    assert attempts == [1, 2]  # the first was the deadlock victim, the rerun went through
    assert value(url, 1) == 11 and value(url, 2) == 11  # both sides' writes, once each


def test_atomic_reruns_a_serialization_failure(pair_url: str) -> None:
    url = pair_url
    attempts: list[int] = []

    def concurrent_update() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE pair SET v = v + 1 WHERE id = 1")

    async def body(tx: Tx) -> int:
        attempts.append(len(attempts) + 1)
        await tx.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur = await tx.conn.execute("SELECT v FROM pair WHERE id = 1")  # the snapshot
        row = await cur.fetchone()
        assert row is not None
        if len(attempts) == 1:
            await asyncio.to_thread(concurrent_update)  # commits after our snapshot
        await tx.conn.execute("UPDATE pair SET v = %s WHERE id = 1", (row["v"] + 10,))
        return int(row["v"])

    async def go() -> int:
        db = await opened(url, max_size=1)
        try:
            return await db.atomic(body)
        finally:
            await db.close()

    assert asyncio.run(go()) == 1  # the rerun read the concurrent write
    assert attempts == [1, 2]
    assert value(url, 1) == 11  # no lost update


@pytest.fixture
def locked_execution(make_app: Any) -> Iterator[tuple[str, Any, psycopg.Connection[Any]]]:
    """(URL whose sessions give up a lock wait after 100 ms, an execution id, a connection that
    holds that execution's row lock)."""
    app: konduit.App = make_app(fan_in_workflow(2, "boundary"))
    execution_id = app.start("boundary").id
    holder = psycopg.connect(app.database_url)
    holder.execute(q("execution_lock"), {"id": execution_id})
    try:
        yield make_conninfo(app.database_url, options="-c lock_timeout=100"), execution_id, holder
    finally:
        holder.close()


@pytest.mark.parametrize("method", ["one", "all", "run"])
def test_single_statements_are_rerun_after_a_lock_timeout(
    locked_execution: Any, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    url, execution_id, holder = locked_execution
    pauses: list[int] = []

    def pause(attempt: int) -> float:
        pauses.append(attempt)
        holder.rollback()  # between the attempts, the other transaction ends
        return 0.0

    monkeypatch.setattr(database, "_pause", pause)

    async def go() -> Any:
        db = await opened(url, max_size=1)
        try:
            return await getattr(db, method)("execution_lock", id=execution_id)
        finally:
            await db.close()

    result = asyncio.run(go())
    assert pauses == [1]
    if method == "one":
        assert result is not None and result["id"] == execution_id
    elif method == "all":
        assert [r["id"] for r in result] == [execution_id]
    else:
        assert result == 1


def test_a_persistent_conflict_is_raised_as_conflict_not_unavailable(
    locked_execution: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, execution_id, _holder = locked_execution
    pauses: list[int] = []

    def pause(attempt: int) -> float:
        pauses.append(attempt)
        return 0.0

    monkeypatch.setattr(database, "_pause", pause)
    seen: list[int] = []

    async def body(tx: Tx) -> None:
        seen.append(1)
        await tx.one("execution_lock", id=execution_id)

    async def go() -> tuple[BaseException, BaseException]:
        db = await opened(url, max_size=1)
        try:
            with pytest.raises(DatabaseConflict) as single:
                await db.one("execution_lock", id=execution_id)
            with pytest.raises(DatabaseConflict) as atomic:
                await db.atomic(body, attempts=3)
            return single.value, atomic.value
        finally:
            await db.close()

    single, atomic = asyncio.run(go())
    assert pauses == [1, 2, 3, 4, 1, 2]  # five tries of one(), three of the atomic body
    assert len(seen) == 3
    for exc in (single, atomic):
        assert not isinstance(exc, DatabaseUnavailable)
        assert isinstance(exc.__cause__, pgerrors.LockNotAvailable)
        assert "55P03" in str(exc) and "attempts" in str(exc)


def test_a_conflict_inside_a_plain_transaction_is_raised_at_once(locked_execution: Any) -> None:
    url, execution_id, _holder = locked_execution

    async def go() -> None:
        db = await opened(url, max_size=1)
        try:
            with pytest.raises(DatabaseConflict) as caught:
                async with db.transaction() as tx:
                    await tx.one("execution_lock", id=execution_id)
            assert isinstance(caught.value.__cause__, pgerrors.LockNotAvailable)
        finally:
            await db.close()

    asyncio.run(go())


def test_a_busy_pool_raises_pool_exhausted_quickly(db_url: str) -> None:
    async def go() -> tuple[PoolExhausted, float]:
        db = await opened(db_url, max_size=1, pool_timeout=0.5, name="tiny")
        try:
            async with db.transaction():  # the pool's only connection, held
                t0 = time.monotonic()
                with pytest.raises(PoolExhausted) as caught:
                    await db.one("execution_lock", id="00000000-0000-0000-0000-000000000000")
                elapsed = time.monotonic() - t0
            # Once it is free again, the pool serves the next caller.
            assert await db.one("execution_lock", id="00000000-0000-0000-0000-000000000000") is None
            return caught.value, elapsed
        finally:
            await db.close()

    exc, elapsed = asyncio.run(go())
    assert 0.4 < elapsed < 3.0
    assert "1 connections" in str(exc) and "pool size" in str(exc) and "'tiny'" in str(exc)
    assert type(exc.__cause__).__name__ == "PoolTimeout"


def test_callers_timing_out_together_share_one_probe(db_url: str) -> None:
    async def go() -> tuple[list[BaseException], int]:
        db = await opened(db_url, max_size=1, pool_timeout=0.5)
        probes = 0
        real = db._connect_once

        async def counted() -> str | None:
            nonlocal probes
            probes += 1
            return await real()

        db._connect_once = counted  # type: ignore[method-assign]
        try:
            async with db.transaction():
                errors = await asyncio.gather(
                    *(db.one("execution_lock", id="00000000-0000-0000-0000-000000000000")
                      for _ in range(4)),
                    return_exceptions=True,
                )
            return [e for e in errors if isinstance(e, BaseException)], probes
        finally:
            await db.close()

    errors, probes = asyncio.run(go())
    assert len(errors) == 4 and all(isinstance(e, PoolExhausted) for e in errors)
    assert probes == 1


def test_a_server_that_does_not_answer_is_unavailable() -> None:
    async def go() -> tuple[BaseException, BaseException, float]:
        with pytest.raises(DatabaseUnavailable) as opening:
            await Database(CLOSED_PORT, pool_timeout=0.5).open(timeout=1.0)
        # A pool that is up but cannot reach its server: the wait for a connection times out,
        # and the caller is told the server is gone, not that the pool is too small.
        db = Database(CLOSED_PORT, pool_timeout=0.5)
        await db.pool.open(wait=False)
        try:
            t0 = time.monotonic()
            with pytest.raises(DatabaseUnavailable) as using:
                await db.one("execution_lock", id="00000000-0000-0000-0000-000000000000")
            return opening.value, using.value, time.monotonic() - t0
        finally:
            await db.close()

    opening, using, elapsed = asyncio.run(go())
    assert elapsed < 5.0
    for exc in (opening, using):
        assert not isinstance(exc, PoolExhausted)
        assert "refused" in str(exc).lower()
        assert exc.__cause__ is not None


def test_a_connection_lost_mid_transaction_is_unavailable(db_url: str) -> None:
    async def go() -> BaseException:
        db = await opened(db_url, max_size=1)
        try:
            with pytest.raises(DatabaseUnavailable) as caught:
                async with db.transaction() as tx:
                    pid = tx.conn.info.backend_pid
                    with psycopg.connect(db_url, autocommit=True) as admin:
                        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    await tx.one("execution_lock", id="00000000-0000-0000-0000-000000000000")
            # The pool replaces the dead connection: the next call works.
            assert await db.one("execution_lock", id="00000000-0000-0000-0000-000000000000") is None
            return caught.value
        finally:
            await db.close()

    exc = asyncio.run(go())
    assert isinstance(exc.__cause__, psycopg.OperationalError)
