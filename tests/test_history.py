"""History does not slow the hot paths: with 1,000,000 finished tasks (and their executions)
beside a backlog of ready work, the claim is an index scan on the ready partial index that reads
about `limit` rows per queue, and the rescue and deadline-sweep lists read only their own partial
indexes. Checked on the plans PostgreSQL runs (``EXPLAIN (ANALYZE, FORMAT JSON)`` of the named
statements' own text, the claim in a transaction rolled back), custom and generic (the plan a
prepared statement may switch to), and on a control: without the ready index the same check fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import konduit.testing
from konduit.db.queries import all_queries, q

# One worker fills the million-row history once (a module fixture), under --dist loadgroup.
pytestmark = [pytest.mark.storage, pytest.mark.xdist_group("history")]

FINISHED = int(os.environ.get("KONDUIT_TEST_HISTORY_TASKS", "1000000"))
TASKS_PER_EXECUTION = 10
BACKLOG = 1_000  # running executions, 9 ready tasks each, on queue 'default'
OTHER = 10  # running executions on queue 'other'
STUCK = 200  # running tasks whose worker is gone; half of them past their deadline too
LIMIT = 8
QUEUES = ["default", "other"]
TABLES = ("konduit_tasks", "konduit_executions")


def _uuid(prefix: str, number: str) -> str:
    """A UUIDv7-shaped id from a number: a fixed time prefix (history sorts before the backlog)."""
    return f"('{prefix}-0000-7000-8000-' || lpad(to_hex({number}), 12, '0'))::uuid"


FILL = [
    "INSERT INTO konduit_workflows (name, version, spec_hash, spec) VALUES ('hist', 1, 'h', '{}')",
    # History: finished executions and their finished tasks (1 in 100 a dead letter).
    f"""INSERT INTO konduit_executions (id, workflow_name, workflow_version, status, input_hash,
                                        steps_pending, created_at, finished_at)
        SELECT {_uuid('00000000', 'i')}, 'hist', 1, 'succeeded', 'h', 0,
               now() - interval '1 day', now() - interval '1 day'
        FROM generate_series(1, {FINISHED // TASKS_PER_EXECUTION}) i""",
    f"""INSERT INTO konduit_tasks (execution_id, workflow, step, status, attempt, max_attempts,
                                   created_at, started_at, finished_at)
        SELECT {_uuid('00000000', f'(i - 1) / {TASKS_PER_EXECUTION} + 1')}, 'hist@1',
               's' || ((i - 1) % {TASKS_PER_EXECUTION}),
               CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END, 1, 1,
               now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
        FROM generate_series(1, {FINISHED}) i""",
    # The hot part: running executions with ready tasks, on two queues.
    f"""INSERT INTO konduit_executions (id, workflow_name, workflow_version, status, input_hash,
                                        steps_pending)
        SELECT {_uuid('00000001', 'i')}, 'hist', 1, 'running', 'h', 9
        FROM generate_series(1, {BACKLOG + OTHER}) i""",
    f"""INSERT INTO konduit_tasks (execution_id, workflow, step, queue, max_attempts)
        SELECT {_uuid('00000001', 'e')}, 'hist@1', 's' || s,
               CASE WHEN e <= {BACKLOG} THEN 'default' ELSE 'other' END, 1
        FROM generate_series(1, {BACKLOG + OTHER}) e, generate_series(0, 8) s""",
    # Running tasks whose lease ran out and whose worker is not live; half past their deadline.
    f"""INSERT INTO konduit_tasks (execution_id, workflow, step, status, attempt, max_attempts,
                                   lease_token, lease_expires_at, worker_id, started_at,
                                   deadline_at)
        SELECT {_uuid('00000001', 'e')}, 'hist@1', 'stuck', 'running', 1, 3, gen_random_uuid(),
               now() - interval '1 minute', 'gone', now() - interval '2 minutes',
               CASE WHEN e % 2 = 0 THEN now() - interval '1 minute' END
        FROM generate_series(1, {STUCK}) e""",
]


@pytest.fixture(scope="module")
def history_url(database_pool: konduit.testing.DatabasePool) -> Iterator[str]:
    # A new database, dropped after (not a pooled one: emptying a million rows costs more than
    # dropping them, and the next tests need none of them).
    with database_pool.database(fresh=True) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            began = time.monotonic()
            try:
                # The rows are consistent by construction: skip a million foreign-key checks
                # (a third of the time), where the server lets this user.
                conn.execute("SET session_replication_role = replica")
            except psycopg.errors.InsufficientPrivilege:
                pass
            for statement in FILL:
                conn.execute(statement.encode())
            # What autovacuum would have done by the time a table holds a million rows.
            conn.execute("ANALYZE")
            print(f"history of {FINISHED} finished tasks filled in {time.monotonic() - began:.1f} s")
        yield url


# -- reading plans -------------------------------------------------------------------------------


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return [n for n in nodes(plan) if n.get("Relation Name") == table]


def rows_read(node: dict[str, Any]) -> float:
    """Rows a scan node produced or filtered out, over all its loops (EXPLAIN gives per loop)."""
    per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
    return float(per_loop * node.get("Actual Loops", 1))


def bitmap_indexes(node: dict[str, Any]) -> set[str]:
    """The indexes a bitmap heap scan's bitmap is built from."""
    return {n["Index Name"] for n in nodes(node) if n["Node Type"] == "Bitmap Index Scan"}


def problems(plan: dict[str, Any], index: str, most_rows: int) -> list[str]:
    """What makes a plan grow with history: a table scanned whole, the hot-path table read
    through any but its partial index, or more rows read than the hot work explains."""
    found = []
    for table in TABLES:
        for n in scans(plan, table):
            # A bitmap scan is as good as an index scan when its bitmap comes from the partial
            # index alone (the planner picks either for a few hundred hot rows); over any other
            # index it reads history.
            if n["Node Type"] == "Seq Scan" or (
                    n["Node Type"] == "Bitmap Heap Scan" and bitmap_indexes(n) != {index}):
                found.append(f"{n['Node Type']} on {table}")
    tasks = scans(plan, "konduit_tasks")
    driving = [n for n in tasks
               if n.get("Index Name") == index
               or (n["Node Type"] == "Bitmap Heap Scan" and bitmap_indexes(n) == {index})]
    if not driving:
        used = sorted({n.get("Index Name") or n["Node Type"] for n in tasks})
        found.append(f"konduit_tasks not read through {index} (read with {used})")
    read = sum(rows_read(n) for n in driving)
    if read > most_rows:
        found.append(f"{read:.0f} rows read through {index}, more than {most_rows}")
    return found


def explain(conn: psycopg.Connection[Any], statement: str, params: Any = None) -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}".encode(), params).fetchone()
    assert row is not None
    return dict(row[0][0]["Plan"])


CLAIM_PARAMS = {"queues": QUEUES, "workflows": ["hist@1"], "limit": LIMIT,
                "lease_seconds": 15.0, "worker_id": "w"}
# Every queue's index scan stops once it has `limit` claimable rows.
CLAIM_MOST_ROWS = LIMIT * len(QUEUES)


def explain_claim(conn: psycopg.Connection[Any], *, generic: bool = False) -> dict[str, Any]:
    """The claim's plan as it ran (it claims: the caller rolls back)."""
    if not generic:
        return explain(conn, q("task_claim_batch"), CLAIM_PARAMS)
    text = q("task_claim_batch")
    for number, name in enumerate(CLAIM_PARAMS, start=1):
        text = text.replace(f"%({name})s", f"${number}")
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.execute(q("task_claim_plan_pinned"))  # as every claim's transaction does
    conn.execute(f"PREPARE claim AS {text}".encode())
    try:
        return explain(conn, "EXECUTE claim('{default,other}', '{hist@1}', 8, 15.0, 'w')")
    finally:
        conn.execute("DEALLOCATE claim")


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_claim_reads_the_ready_index_and_stops_after_its_limit(history_url, generic):
    if generic:
        # The claim is prepared, its kept plan made under task_claim_plan_pinned
        # (``-- plan: pinned``, konduit/db/queries.py): that plan is checked here too.
        assert all_queries()["task_claim_batch"].pinned_plan
    with psycopg.connect(history_url) as conn:
        plan = explain_claim(conn, generic=generic)
        conn.rollback()
    assert problems(plan, "konduit_tasks_ready", CLAIM_MOST_ROWS) == []
    (claimed,) = [n for n in nodes(plan) if n["Node Type"] == "ModifyTable"
                  and n.get("Operation") == "Update" and n["Relation Name"] == "konduit_tasks"]
    assert claimed["Actual Rows"] == LIMIT


def test_without_the_ready_index_the_same_check_fails(history_url):
    """The control: the check above is able to fail."""
    with psycopg.connect(history_url) as conn:
        conn.execute("DROP INDEX konduit_tasks_ready")
        plan = explain_claim(conn)
        conn.rollback()
    assert problems(plan, "konduit_tasks_ready", CLAIM_MOST_ROWS) != []


def test_the_rescue_list_reads_only_leased_tasks(history_url):
    with psycopg.connect(history_url) as conn:
        plan = explain(conn, q("task_list_rescuable"), {"limit": 100})
    assert problems(plan, "konduit_tasks_running", STUCK) == []


def test_the_deadline_sweep_list_reads_only_tasks_with_a_deadline(history_url):
    with psycopg.connect(history_url) as conn:
        plan = explain(conn, q("task_list_past_deadline"), {"limit": 100, "grace_seconds": 1.0})
    assert problems(plan, "konduit_tasks_deadline", STUCK) == []
