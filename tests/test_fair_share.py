"""Every execution gets its share of a queue (migration 0019): a lone execution started beside a
running 100,000-item map, or after a 100,000-execution ``start_many`` batch, finishes within 2 s
of its start on one worker of 8 slots; and ready work of a workflow the worker does not serve
costs its claim nothing.

The order is checked against the claim statement itself first (direct ``transitions.claim``
calls), next to a control that runs the order the claim used before (``priority, execution_id,
id``) on the same rows and shows it would have failed; then end to end with a worker. The claim's
cost is read from ``EXPLAIN (ANALYZE, BUFFERS)``, next to the old claim's filter as a control.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.queries import q
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed
from tests.support.load import scaled
from tests.support.scenario import run_scenario
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]
WORKER = "worker-fair-share"
ITEMS = 100_000

# What the claim took first before: ready tasks by priority, then the oldest execution.
OLD_ORDER = """
SELECT execution_id, step FROM konduit_tasks
WHERE status = 'ready' AND queue = 'default' AND run_at <= clock_timestamp()
ORDER BY priority, execution_id, id LIMIT %s"""


def mapped(name: str) -> konduit.Workflow:
    """A seed, then one task per item of range(input)."""
    wf = konduit.Workflow(name, version=1)
    seed = wf.step(name="seed")(lambda ctx: ctx.input)
    wf.map(name="item", after=[seed], over=range, max_items=ITEMS)(lambda ctx: None)
    return wf


def single(name: str) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)
    wf.step(name="work")(lambda ctx: 1)
    return wf


async def claim(db: Database, registry: Registry, limit: int,
                workflows: list[str] | None = None) -> list[Claimed]:
    rows = await transitions.claim(db, queues=["default"],
                                   workflows=workflows or registry.keys(), limit=limit,
                                   lease_seconds=15.0, worker_id=WORKER)
    return [Claimed.from_row(r) for r in rows]


async def sql(db: Database, text: str, *params: Any) -> list[Any]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute(text.encode(), params)
        return await cur.fetchall() if cur.description else []


async def succeed(db: Database, registry: Registry, task: Claimed, payload: int) -> None:
    outcome, _ = await record(db, registry, task.completion(
        "succeeded", payload_json=str(payload), payload=payload))
    assert outcome is Recorded.ENDED


def run(url: str, workflows: list[konduit.Workflow], scenario: Any) -> Any:
    return run_scenario(url, workflows, scenario, worker_id=WORKER)


# -- the claim's order ---------------------------------------------------------------------------


def test_a_lone_execution_is_claimed_a_turn_after_a_batch_and_a_wide_execution(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        batch = await client.start_many([{"workflow": "one"}] * 400)
        wide = await client.start("wide")  # 500 roots
        first = await claim(db, registry, limit=8)
        assert {t.execution_id for t in first} == set(batch[:8])  # the batch's first turn
        lone = await client.start("one")
        # Control: the old order serves the rest of the batch and the wide execution first.
        old = await sql(db, OLD_ORDER, 600)
        assert lone not in {r["execution_id"] for r in old}
        # A turn is 8 tasks of the batch, 8 of the wide execution, then the lone one's.
        got = await claim(db, registry, limit=32)
        assert lone in {t.execution_id for t in got}
        # ... and the batch and the wide execution keep their shares.
        assert sum(t.execution_id == wide for t in got) >= 8
        assert sum(t.execution_id in batch for t in got) >= 8

    wide = konduit.Workflow("wide", version=1)
    for i in range(500):
        wide.step(name=f"r{i}")(lambda ctx: 1)
    run(db_url, [single("one"), wide], scenario)


def test_a_two_step_execution_is_not_queued_behind_an_older_map(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        big = await client.start("big", 5_000)
        (seed,) = await claim(db, registry, limit=8)
        await succeed(db, registry, seed, 5_000)  # 5,000 items ready
        assert len(await claim(db, registry, limit=64)) == 64  # the map runs
        two = await client.start("two")
        (a,) = [t for t in await claim(db, registry, limit=8) if t.execution_id == two]
        await succeed(db, registry, a, 1)
        old = await sql(db, OLD_ORDER, 8)  # control: the old order serves the map's items
        assert {r["execution_id"] for r in old} == {big}
        got = await claim(db, registry, limit=8)
        assert (two, "b") in {(t.execution_id, t.step) for t in got}

    two = konduit.Workflow("two", version=1)
    a = two.step(name="a")(lambda ctx: 1)
    two.step(name="b", after=[a])(lambda ctx: 2)
    run(db_url, [two, mapped("big")], scenario)


# -- the claim's cost ----------------------------------------------------------------------------

UNSERVED = 100_000
THROTTLED = 20_000


def _fill_unserved(conn: psycopg.Connection[Any]) -> None:
    """100,000 ready tasks of a workflow version nobody serves, ahead of 20 served ones."""
    # (The executions are consistent by construction; their steps play no part in a claim.)
    conn.execute("""
        INSERT INTO konduit_workflows (name, version, spec_hash, spec)
        VALUES ('nobody', 1, 'h', '{}'), ('served', 1, 'h', '{}')""")
    conn.execute("""
        INSERT INTO konduit_executions (id, workflow_name, workflow_version, input_hash,
                                        steps_pending)
        VALUES ('00000000-0000-7000-8000-000000000001', 'nobody', 1, 'h', 1),
               ('00000000-0000-7000-8000-000000000002', 'served', 1, 'h', 1)""")
    conn.execute(f"""
        INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, max_attempts)
        SELECT '00000000-0000-7000-8000-000000000001', 'nobody@1', 'item', i, 1
        FROM generate_series(0, {UNSERVED - 1}) i""")
    conn.execute("""
        INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, max_attempts)
        SELECT '00000000-0000-7000-8000-000000000002', 'served@1', 'item', i, 1
        FROM generate_series(0, 19) i""")
    # ... and a throttled step's backlog of the served version, ahead of them too.
    conn.execute(f"""
        INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, max_attempts, limited)
        SELECT '00000000-0000-7000-8000-000000000001', 'served@1', 'limited', i, 1, true
        FROM generate_series(0, {THROTTLED - 1}) i""")
    conn.execute("ANALYZE konduit_tasks")


def _explain(conn: psycopg.Connection[Any], statement: str, params: Any) -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}".encode(),
                       params).fetchone()
    assert row is not None
    return dict(row[0][0]["Plan"])


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *[n for child in plan.get("Plans", []) for n in _nodes(child)]]


def _task_rows_read(plan: dict[str, Any]) -> float:
    """Rows of konduit_tasks the plan's scans produced or filtered out, over all loops."""
    return sum((n.get("Actual Rows", 0) + n.get("Rows Removed by Filter", 0)
                + n.get("Rows Removed by Index Recheck", 0)) * n.get("Actual Loops", 1)
               for n in _nodes(plan) if n.get("Relation Name") == "konduit_tasks"
               and n["Node Type"] != "ModifyTable")


# The claim as it was before (migration 0003's order, a filter on the workflow version).
OLD_CLAIM = """
SELECT t.id FROM konduit_tasks t
WHERE t.status = 'ready' AND t.queue = 'default' AND t.run_at <= clock_timestamp()
  AND t.workflow = ANY(%(workflows)s::text[]) AND NOT t.limited
ORDER BY t.priority, t.execution_id, t.id
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED"""


def test_ready_work_nobody_serves_costs_the_claim_nothing(db_url):
    params = {"queues": ["default"], "workflows": ["served@1"], "limit": 8,
              "lease_seconds": 15.0, "worker_id": "w"}
    with psycopg.connect(db_url) as conn:
        _fill_unserved(conn)
        conn.commit()
        plan = _explain(conn, q("task_claim_batch"), params)
        claimed = [n for n in _nodes(plan) if n["Node Type"] == "ModifyTable"
                   and n.get("Relation Name") == "konduit_tasks"]
        assert claimed[0]["Actual Rows"] == 8
        read = _task_rows_read(plan)
        # The claim reads its 8 rows through the ready index, and updates them by primary key.
        assert read <= 2 * 8, f"the claim read {read:.0f} task rows"
        buffers = plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0)
        assert buffers < 300, f"the claim touched {buffers} buffers"
        conn.rollback()
        # Control: the old claim on the old ready index (migration 0003) filters every unserved
        # row ahead of the served ones.
        conn.execute("DROP INDEX konduit_tasks_ready")
        conn.execute("CREATE INDEX konduit_tasks_ready ON konduit_tasks"
                     " (queue, priority, execution_id, id) WHERE status = 'ready'")
        old = _explain(conn, OLD_CLAIM, params)
        assert _task_rows_read(old) >= UNSERVED + THROTTLED
        conn.rollback()


# -- end to end, one worker of 8 slots -----------------------------------------------------------


def _finished_within(app: konduit.App, execution: UUID) -> float:
    """Seconds from the execution's start to its end, on the database's clock."""
    result = app.wait(execution, timeout=10)
    assert result.status == "succeeded"
    with psycopg.connect(app.database_url) as conn:
        (seconds,) = conn.execute(
            "SELECT extract(epoch FROM finished_at - created_at)::float8"
            " FROM konduit_executions WHERE id = %s", (execution,)).fetchone()
    return float(seconds)


def _count(app: konduit.App, sql_text: str, *params: Any) -> int:
    with psycopg.connect(app.database_url) as conn:
        (n,) = conn.execute(sql_text.encode(), params).fetchone()
    return int(n)


def test_a_lone_execution_finishes_within_2_s_beside_a_running_100k_map(make_app):
    app = make_app(mapped("fair-map"), single("fair-lone"))
    with running_worker(app, concurrency=8):
        big = app.start("fair-map", ITEMS).id
        # The map runs: its items are being claimed.
        until(lambda: _count(app, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                             " AND step = 'item' AND status = 'succeeded'", big) > 200,
              timeout=60)
        assert _count(app, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s"
                           " AND status = 'ready'", big) > ITEMS // 2
        lone = app.start("fair-lone").id
        took = _finished_within(app, lone)
        app.cancel(big)
    # 2 s on an idle machine, stretched by the measured overload up to 15 s: behind the map (the
    # bug) it waits for most of 100,000 items.
    bound = scaled(2.0, cap=15.0)
    assert took < bound, f"the lone execution took {took:.2f} s beside the map (bound {bound:.1f})"


@pytest.mark.slow  # the batch's start alone takes 8-15 s here
def test_a_lone_execution_finishes_within_2_s_after_a_100k_start_many(make_app):
    app = make_app(single("fair-batch"), single("fair-lone"))
    app.start_many([{"workflow": "fair-batch"}] * ITEMS)  # one batch: 50 statements, one flow
    with running_worker(app, concurrency=8):
        until(lambda: _count(app, "SELECT count(*) FROM konduit_executions"
                             " WHERE status = 'succeeded'") > 200, timeout=60)
        lone = app.start("fair-lone").id
        took = _finished_within(app, lone)
        running = _count(app, "SELECT count(*) FROM konduit_executions WHERE status = 'running'")
    assert running > ITEMS // 2, "the batch was still running"
    bound = scaled(2.0, cap=15.0)  # as above: behind the batch it waits for most of 100,000
    assert took < bound, f"the lone execution took {took:.2f} s after the batch (bound {bound:.1f})"
