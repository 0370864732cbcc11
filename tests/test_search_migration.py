"""Migration 0024 on a table with a history: a database at the schema before it, holding running
and finished executions, migrates; the old rows keep their statuses, get no tags and priority 0,
and are found by the new indexes. An index an operator built beforehand (CREATE INDEX
CONCURRENTLY, outside any transaction, as docs say for a big table) is kept, not an error."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from konduit.core.search import ExecutionFilter
from konduit.db.database import Database
from konduit.db.migrate import migrate
from konduit.engine.search import search_executions
from tests.support.db import migrated_before

BEFORE = 24


def test_0024_migrates_a_history_and_keeps_a_prebuilt_index(empty_db_url: str) -> None:
    migrated_before(empty_db_url, BEFORE)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO konduit_workflows (name, version, spec_hash, spec) "
                     "VALUES ('old', 1, 'h', '{}')")
        conn.execute("""
            INSERT INTO konduit_executions (id, workflow_name, workflow_version, status, input,
                input_hash, idempotency_key, steps_pending, finished_at)
            SELECT gen_random_uuid(), 'old', 1,
                   CASE WHEN g % 2 = 0 THEN 'succeeded' ELSE 'running' END,
                   jsonb_build_object('episode', g), 'h', 'old-' || g, 0,
                   CASE WHEN g % 2 = 0 THEN now() END
            FROM generate_series(1, 2000) g""")
        # What docs/search.md's note says to do first on a big table: build it concurrently.
        conn.execute("CREATE INDEX CONCURRENTLY konduit_executions_input ON konduit_executions "
                     "USING gin (input jsonb_path_ops)")

    async def go() -> tuple[list[int], list[Any], list[Any]]:
        db = Database(empty_db_url, min_size=1, max_size=1)
        await db.open()
        try:
            applied = [m.version for m in await migrate(db)]
            by_key = await search_executions(db, ExecutionFilter(idempotency_key="old-7"))
            by_input = await search_executions(db, ExecutionFilter(input={"episode": 8}))
            return applied, by_key, by_input
        finally:
            await db.close()

    applied, by_key, by_input = asyncio.run(go())
    assert BEFORE in applied
    [old] = by_key
    assert old.status == "running" and old.tags is None and old.priority == 0 and old.run_at is None
    assert [r.status for r in by_input] == ["succeeded"]
    with psycopg.connect(empty_db_url) as conn:
        counts = dict(conn.execute(
            "SELECT status, count(*) FROM konduit_executions GROUP BY status").fetchall())
        assert counts == {"running": 1000, "succeeded": 1000}
        indexes = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'konduit_executions'")}
    assert {"konduit_executions_tags", "konduit_executions_input", "konduit_executions_key",
            "konduit_executions_id_tail", "konduit_executions_scheduled"} <= indexes
