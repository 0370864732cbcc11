"""Flow control across all workers: ``step(concurrency=N)`` and ``step(rate="N/s")``.

Both are enforced by the claim itself (``flow_limit_lock_if_ready`` then
``task_claim_batch_flow_limited``, one transaction). Checked here:

- definition errors name the step; the sliding-window rule (hypothesis);
- many claimers released together on a ``concurrency=1`` step never lease two of its tasks,
  next to a control that runs the same claim without the lock and shows the race is real;
- claim order, unlimited steps claimed beside throttled ones, throttled time recorded, limits
  lifted by a later registration;
- two real worker processes x 8 slots: ``concurrency=2`` never has 3 handlers running at once
  (handler start/end times), ``rate="4/s"`` never starts 5 attempts within a second (attempt
  start times from the database), and an unlimited step beside them runs wide.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import konduit
from konduit.core.flow import FlowLimit, parse_flow_limit, rate_allowance, record_starts
from konduit.db.database import Database
from konduit.engine import transitions
from konduit.engine.client import Client
from konduit.engine.registry import Registry
from konduit.errors import WorkflowDefinitionError
from konduit.observe.metrics import metric_families
from konduit.observe.stats import load_stats, stats_renderables
from tests.support.workers import spawn_worker, stop_workers

WORKER = "worker-flow"


# -- definitions -----------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"concurrency": 0}, "concurrency must be a positive integer, got 0"),
    ({"concurrency": -3}, "concurrency must be a positive integer"),
    ({"concurrency": True}, "concurrency must be a positive integer, got True"),
    ({"concurrency": "2"}, "concurrency must be a positive integer, got '2'"),
    ({"concurrency": 2.0}, "concurrency must be a positive integer"),
    ({"rate": "4/x"}, "rate must look like '10/s', '100/m' or '1000/h', got '4/x'"),
    ({"rate": "four/s"}, "rate must look like"),
    ({"rate": 4}, "rate must look like"),
    ({"rate": "0/s"}, "the count must be between 1 and 10000"),
    ({"rate": "10001/h"}, "the count must be between 1 and 10000"),
])
def test_bad_limits_are_refused_at_definition_naming_the_step(options, message):
    wf = konduit.Workflow("flow-bad", version=1)
    with pytest.raises(WorkflowDefinitionError, match="step 'resize'") as err:
        wf.step(name="resize", **options)(lambda ctx: 1)
    assert message in str(err.value)
    assert err.value.step == "resize"
    with pytest.raises(WorkflowDefinitionError, match="step 'thumbs'"):
        wf.map(name="thumbs", after=["x"], over=list, **options)(lambda ctx: 1)


def test_limits_are_read_and_kept_out_of_the_spec_hash():
    assert parse_flow_limit(None, None) is None
    assert parse_flow_limit(4, " 10 / m ") == FlowLimit(4, 10, 60.0)
    assert parse_flow_limit(None, "3/h") == FlowLimit(None, 3, 3600.0)
    assert FlowLimit(None, 3, 3600.0).rate == "3/h"

    def build(**options: Any) -> konduit.Workflow:
        wf = konduit.Workflow("flow-hash", version=1)
        wf.step(name="a", **options)(lambda ctx: 1)
        wf.step(name="b", after=["a"])(lambda ctx: 2)
        return wf

    limited, plain = build(concurrency=2, rate="5/s").spec, build().spec
    assert limited.flow_limits == {"a": FlowLimit(2, 5, 1.0)}
    assert plain.flow_limits == {}
    # A limit is operational: changing it needs no new version.
    assert limited.spec_hash == plain.spec_hash


# -- the sliding window, as a rule -------------------------------------------------------------


@given(count=st.integers(1, 6), seconds=st.sampled_from([0.5, 1.0, 2.0]),
       claims=st.lists(st.tuples(st.floats(0, 0.7), st.integers(0, 8)), max_size=40))
def test_the_window_never_allows_more_than_count_starts_in_any_interval(count, seconds, claims):
    now, window, started = 0.0, [], []
    for gap, wanted in claims:
        now += gap
        take = min(wanted, rate_allowance(window, now, count, seconds))
        window = record_starts(window, now, take, count)
        started += [now] * take
        assert len(window) <= count
    for i in range(len(started) - count):
        assert started[i + count] - started[i] >= seconds  # no count+1 in any [t, t + seconds)


def test_the_window_allows_a_burst_then_frees_a_start_per_expired_one():
    assert rate_allowance([], 0.0, 4, 1.0) == 4
    window = record_starts([], 0.0, 4, 4)
    assert rate_allowance(window, 0.99, 4, 1.0) == 0
    assert rate_allowance(window, 1.0, 4, 1.0) == 4
    window = record_starts([0.0, 0.0, 0.5, 0.7], 1.2, 2, 4)
    assert window == [0.5, 0.7, 1.2, 1.2]


# -- the claim, against the database -----------------------------------------------------------


def limited_roots(name: str, *, concurrency: int | None = 1, rate: str | None = None
                  ) -> konduit.Workflow:
    """A limited root step ``a`` and an unlimited root step ``b``."""
    wf = konduit.Workflow(name, version=1)
    wf.step(name="a", concurrency=concurrency, rate=rate)(lambda ctx: 1)
    wf.step(name="b")(lambda ctx: 2)
    return wf


async def open_db(url: str, size: int) -> Database:
    db = Database(url, min_size=size, max_size=size)
    await db.open()
    return db


async def setup(db: Database, wf: konduit.Workflow, executions: int) -> tuple[Registry, Client]:
    registry = Registry([wf])
    client = Client(db, registry)
    await client.register_all()
    for _ in range(executions):
        await client.start(wf.name)
    return registry, client


async def claim(db: Database | Any, registry: Registry, limit: int) -> list[Any]:
    return await transitions.claim(db, queues=["default"], workflows=registry.keys(), limit=limit,
                                   lease_seconds=30.0, worker_id=WORKER, limited=True)


async def sql(db: Database, text: str, *params: Any) -> list[Any]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute(text.encode(), params)
        return await cur.fetchall() if cur.description else []


async def finish_running(db: Database, step: str) -> int:
    """End the running tasks of ``step`` as a worker's completion would (status and lease)."""
    rows = await sql(db, """
        UPDATE konduit_tasks SET status = 'succeeded', lease_token = NULL,
               lease_expires_at = NULL, finished_at = clock_timestamp()
        WHERE step = %s AND status = 'running' RETURNING id""", step)
    return len(rows)


async def running(db: Database, step: str) -> int:
    [row] = await sql(db, "SELECT count(*) AS n FROM konduit_tasks "
                          "WHERE step = %s AND status = 'running'", step)
    return int(row["n"])


CLAIMERS = 12
TRIALS = 25


@pytest.mark.storage
def test_claimers_released_together_never_run_two_of_a_concurrency_one_step(db_url):
    """Each trial: the running task ends while CLAIMERS claims start at the same instant
    (a barrier), each on its own connection. At most one of the step's tasks may be running
    afterwards, and only one claim may have taken one. The control runs the same claim
    statement without the lock statement before it: there the claimers do collide."""

    async def main() -> tuple[int, int]:
        db = await open_db(db_url, CLAIMERS + 2)
        try:
            registry, _ = await setup(db, limited_roots("flow-collide"), TRIALS + 40)
            assert len(await claim(db, registry, 1)) == 1  # a: the oldest execution's task
            await finish_running(db, "b")
            most = 0
            for _ in range(TRIALS):
                barrier = asyncio.Barrier(CLAIMERS + 1)

                async def claimer(barrier: asyncio.Barrier) -> int:
                    await barrier.wait()
                    rows = await claim(db, registry, 4)
                    return sum(1 for r in rows if r["step"] == "a")

                async def finisher(barrier: asyncio.Barrier) -> int:
                    await barrier.wait()
                    return await finish_running(db, "a")

                ended, *took = await asyncio.gather(finisher(barrier),
                                                     *[claimer(barrier) for _ in range(CLAIMERS)])
                assert ended == 1, "the trial began without a running task of a"
                assert sum(took) <= 1, took
                now = await running(db, "a")
                assert now <= 1, now
                if now == 0:  # the claims all ran before the end committed: claim it now
                    assert len([r for r in await claim(db, registry, 4) if r["step"] == "a"]) == 1
                await finish_running(db, "b")
                most = max(most, sum(took))
            # The control: the flow claim alone, its snapshot taken before other claims commit.
            # (Up to 10 rounds: on a busy machine one round's claimers may happen to run one
            # after the other.)
            async def unlocked(barrier: asyncio.Barrier) -> None:
                await barrier.wait()
                async with db.transaction() as tx:
                    await tx.all(
                        "task_claim_batch_flow_limited", flow_workflows=["flow-collide@1"],
                        flow_steps=["a"], key_workflows=[], key_steps=[], key_keys=[],
                        queues=["default"], workflows=registry.keys(), limit=4,
                        lease_seconds=30.0, worker_id=WORKER)

            control = 0
            for _ in range(10):
                await finish_running(db, "a")
                barrier = asyncio.Barrier(CLAIMERS)
                await asyncio.gather(*[unlocked(barrier) for _ in range(CLAIMERS)])
                control = await running(db, "a")
                if control > 1:
                    break
            return most, control
        finally:
            await db.close()

    most, control = asyncio.run(main())
    assert most == 1  # slots did free and were claimed
    assert control > 1  # without the lock the same claimers do run several at once


@pytest.mark.storage
def test_limited_tasks_keep_their_place_and_unlimited_ones_are_claimed_beside_them(db_url):
    async def main() -> None:
        db = await open_db(db_url, 2)
        try:
            registry, client = await setup(db, limited_roots("flow-order"), 3)
            ids = [r["id"] for r in await sql(db, "SELECT id FROM konduit_executions ORDER BY id")]
            first = await claim(db, registry, 10)
            # The oldest execution's a, and every b: the throttled a's do not hold up the claim.
            assert sorted((r["execution_id"], r["step"]) for r in first) == sorted(
                [(ids[0], "a")] + [(e, "b") for e in ids])
            assert await claim(db, registry, 10) == []  # a's slot is taken: nothing to claim
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_claims"] == 2 and limits["throttled_since"] is not None
            assert await finish_running(db, "a") == 1
            nxt = await claim(db, registry, 10)
            assert [(r["execution_id"], r["step"]) for r in nxt] == [(ids[1], "a")]
            # The stats show the limit and the throttled time, the metrics too.
            stats = await load_stats(db)
            [flow] = stats.flow
            assert (flow.workflow, flow.version, flow.step) == ("flow-order", 1, "a")
            assert (flow.concurrency, flow.running, flow.ready) == (1, 1, 1)
            assert flow.throttled_now and flow.throttled_seconds > 0 and flow.throttled_claims >= 2
            assert any("flow limit" in str(getattr(r, "columns", [""])[0].header)
                       for r in stats_renderables(stats) if hasattr(r, "columns"))
            names = {m.name for m in metric_families(stats, [], [])}
            # A counter's family is named without its _total (its samples keep it).
            assert {"konduit_step_throttled_seconds", "konduit_step_flow_running"} <= names
            # The last one: the claim takes it and, with nothing left behind, ends the stretch.
            await finish_running(db, "a")
            assert len(await claim(db, registry, 10)) == 1
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_since"] is None and limits["throttled_seconds"] > 0
            # A stretch whose ready tasks went away otherwise (cancelled) ends at the next claim.
            await client.start("flow-order")  # its a waits: the last a still runs
            assert [r["step"] for r in await claim(db, registry, 10)] == ["b"]
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_since"] is not None
            await sql(db, "UPDATE konduit_tasks SET status = 'cancelled', "
                          "finished_at = clock_timestamp() WHERE status = 'ready'")
            assert await claim(db, registry, 10) == []
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_since"] is None
        finally:
            await db.close()

    asyncio.run(main())


@pytest.mark.storage
def test_a_claim_short_of_free_slots_is_not_throttled(db_url):
    """Ready tasks left behind because the worker had one free slot, not because of the limit,
    are not throttled time."""

    async def main() -> None:
        db = await open_db(db_url, 2)
        try:
            registry, _ = await setup(db, limited_roots("flow-slots", concurrency=10), 5)
            assert [r["step"] for r in await claim(db, registry, 1)] == ["a"]
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_claims"] == 0 and limits["throttled_since"] is None
            assert len([r for r in await claim(db, registry, 20) if r["step"] == "a"]) == 4
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["throttled_claims"] == 0
        finally:
            await db.close()

    asyncio.run(main())


@pytest.mark.storage
def test_a_rate_limits_starts_in_the_window_and_a_new_registration_lifts_a_limit(db_url):
    async def main() -> None:
        db = await open_db(db_url, 2)
        try:
            wf = limited_roots("flow-rate", concurrency=None, rate="3/s")
            registry, _ = await setup(db, wf, 8)
            took = [r for r in await claim(db, registry, 20) if r["step"] == "a"]
            assert len(took) == 3
            assert [r for r in await claim(db, registry, 20) if r["step"] == "a"] == []
            await finish_running(db, "a")  # ending tasks frees no start: the window does
            assert [r for r in await claim(db, registry, 20) if r["step"] == "a"] == []
            await asyncio.sleep(1.05)
            assert len([r for r in await claim(db, registry, 20) if r["step"] == "a"]) == 3
            starts = await sql(db, """
                SELECT a.started_at FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id
                WHERE t.step = 'a' ORDER BY a.started_at""")
            assert (starts[3]["started_at"] - starts[0]["started_at"]).total_seconds() >= 1.0
            # The same version registered without the limit (another deploy): lifted.
            plain = konduit.Workflow("flow-rate", version=1)
            plain.step(name="a")(lambda ctx: 1)
            plain.step(name="b")(lambda ctx: 2)
            await Client(db, Registry([plain])).register_all()
            assert len([r for r in await claim(db, registry, 20) if r["step"] == "a"]) == 2
            [limits] = await sql(db, "SELECT * FROM konduit_flow_limits")
            assert limits["rate_count"] is None and limits["starts"] == []
        finally:
            await db.close()

    asyncio.run(main())


@pytest.mark.storage
def test_a_worker_without_limits_runs_the_plain_claim_only(db_url, make_app):
    """Unlimited workflows never touch the flow statements: their tasks are not limited, no
    flow row exists, and the worker's claim is the plain statement alone."""
    from konduit.worker.worker import Worker
    from tests.support.workers import running_worker

    wf = konduit.Workflow("flow-plain", version=1)
    wf.step(name="only")(lambda ctx: 1)
    assert Worker(Database(db_url), Registry([wf]))._limited is False
    assert Worker(Database(db_url), Registry([limited_roots("flow-x")]))._limited is True
    app = make_app(wf)
    with running_worker(app, concurrency=4):
        handles = [app.start("flow-plain") for _ in range(10)]
        assert all(h.wait(timeout=30).status == "succeeded" for h in handles)
    with psycopg.connect(db_url) as conn:
        limited = conn.execute("SELECT count(*) FROM konduit_tasks WHERE limited").fetchone()
        rows = conn.execute("SELECT count(*) FROM konduit_flow_limits").fetchone()
    assert limited == (0,) and rows == (0,)


# -- real worker processes ---------------------------------------------------------------------


def spans(folder: Path) -> list[tuple[float, float]]:
    out = []
    for f in folder.iterdir():
        began, ended = f.read_text().split()
        out.append((float(began), float(ended)))
    return out


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant (an end before a start at a tie)."""
    events = sorted([(b, 1) for b, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


@pytest.mark.storage
@pytest.mark.slow
def test_limits_hold_across_two_worker_processes(db_url, tmp_path):
    from tests.apps import flow_app

    app = konduit.App([flow_app.wf], database_url=db_url)
    workers = [spawn_worker("tests.apps.flow_app:app", db_url, concurrency=8, poll_interval=0.5)
               for _ in range(2)]
    try:
        began = time.monotonic()
        result = app.start("flow-limits", input={"dir": str(tmp_path)}).wait(timeout=90)
        took = time.monotonic() - began
    finally:
        stop_workers(workers)
        app.close()
    assert result.status == "succeeded", result
    limited, unlimited = spans(tmp_path / "limited"), spans(tmp_path / "unlimited")
    assert len(limited) == len(unlimited) == flow_app.ITEMS
    assert most_at_once(limited) == 2  # never more, and the limit was used
    assert most_at_once(unlimited) >= 4  # the unlimited step beside it ran wide
    with psycopg.connect(db_url) as conn:
        starts = [r[0] for r in conn.execute("""
            SELECT a.started_at FROM konduit_attempts a JOIN konduit_tasks t ON t.id = a.task_id
            WHERE t.step = 'rated' ORDER BY a.started_at""")]
        workers_used = conn.execute("""
            SELECT count(DISTINCT a.worker_id) FROM konduit_attempts a
            JOIN konduit_tasks t ON t.id = a.task_id WHERE t.step IN ('limited', 'rated')
            """).fetchone()
        throttled = conn.execute("""
            SELECT step, throttled_claims, throttled_seconds FROM konduit_flow_limits
            ORDER BY step""").fetchall()
    assert len(starts) == flow_app.ITEMS
    gaps = [(starts[i + 4] - starts[i]).total_seconds() for i in range(len(starts) - 4)]
    assert min(gaps) >= 1.0, gaps  # never 5 starts within a second
    assert workers_used == (2,)  # both processes claimed limited tasks
    assert [step for step, claims, secs in throttled if claims > 0 and secs > 0] == [
        "limited", "rated"]
    # 16 starts at 4/s: the window frees as soon as it can (no poll-interval waits added).
    assert took < 12
    # The throttled time, from the CLI.
    from tests.test_cli import konduit_cli

    proc = konduit_cli("stats", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    flow = {f["step"]: f for f in json.loads(proc.stdout)["flow"]}
    assert flow["limited"]["concurrency"] == 2 and flow["rated"]["rate"] == "4/s"
    assert flow["limited"]["throttled_seconds"] > 0 and not flow["limited"]["throttled_now"]
    proc = konduit_cli("stats", "--database-url", db_url)
    assert "flow limit" in proc.stdout and "flow-limits@1/limited" in proc.stdout
