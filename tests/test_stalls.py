"""The stall watchdog on a real database, with seed 000's bug injected by hand.

- A branch task ended in SQL without its fan-in (its step's counters untouched, so the join
  never became ready): a worker's maintenance pass finds the stall after the grace, re-runs the
  fan-in decision under the execution lock, the join fires exactly once, the execution finishes,
  and an ``execution_stalled`` alert records it, resolved at once; the counter counts it.
- A stall the data cannot decide (a ready task's row deleted): an open critical alert naming the
  execution, the counter, ``konduit status``, the alerts API, the dashboard's execution page; the
  alert resolves once the execution is cancelled.
- Watchdogs racing on one stalled execution decide it once (one alert, one join task), and the
  watchdog never touches a healthy execution, however quiet.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.queries import q
from konduit.engine.stalls import Pass, Watchdog
from konduit.observe.metrics import serve
from konduit.web import create_app, database_client
from konduit.worker.config import WorkerConfig
from tests.support.browser import serving
from tests.support.waiting import until, wait_for_passes
from tests.support.workers import running_worker
from tests.test_cli import konduit_cli
from tests.test_metrics import scrape, value
from tests.test_storage import _positional

pytestmark = [pytest.mark.storage]

FAST = {"stall_grace": 1.0, "maintenance_interval": 0.2, "alert_interval": 0}


def sql(db_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def fan_in(name: str = "stall-fan-in") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def left(ctx: konduit.Context) -> str:
        return "left"

    @wf.step()
    def right(ctx: konduit.Context) -> str:
        return "right"

    @wf.step(after=[left, right])
    def join(ctx: konduit.Context) -> list[str]:
        return sorted(ctx.upstream)

    return wf


def chain(name: str = "stall-chain") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def first(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[first])
    def second(ctx: konduit.Context) -> int:
        return ctx.upstream["first"] + 1

    return wf


def end_without_fan_in(db_url: str, execution_id: Any, step: str) -> None:
    """Seed 000's bug: the task is marked succeeded, its fan-in decision never runs."""
    [(n,)] = sql(db_url, "WITH t AS (UPDATE konduit_tasks SET status = 'succeeded', "
                 "finished_at = clock_timestamp() WHERE execution_id = %s AND step = %s "
                 "RETURNING 1) SELECT count(*) FROM t", execution_id, step)
    assert n == 1


def stalls(db_url: str) -> dict[tuple[str, bool], int]:
    return {(w, h): n for w, h, n in sql(db_url, "SELECT workflow, healed, stalls FROM konduit_stalls")}


def test_a_fan_in_lost_in_sql_is_healed_by_a_worker_and_the_join_fires_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan_in()
    app = make_app(wf)
    handle = app.start(wf.name, {})
    end_without_fan_in(db_url, handle.id, "left")
    began = time.monotonic()
    with running_worker(app, **FAST):
        # `right` runs and ends normally; `join` still counts `left` pending: nothing can run.
        result = handle.wait(timeout=30)
    took = time.monotonic() - began
    assert result.status == "succeeded" and result.output == ["left", "right"]
    assert took < 15, took  # the grace is 1 s: found within a few passes, not the 60 s default
    [(tasks, attempts)] = sql(db_url, "SELECT count(*), sum(attempt) FROM konduit_tasks "
                              "WHERE execution_id = %s AND step = 'join'", handle.id)
    assert (tasks, attempts) == (1, 1)  # the join fired exactly once
    [alert] = app.alerts(include_resolved=True, kind="execution_stalled")
    assert alert.subject == str(handle.id) and alert.workflow == wf.name
    assert not alert.open and alert.details["healed"] is True
    assert "step 'left' ended succeeded without its fan-in decision" in alert.message
    assert alert.details["fired"] == ["join"]
    assert stalls(db_url) == {(wf.name, True): 1}
    assert app.stall(handle.id) is None


def test_a_stall_the_data_cannot_decide_stays_an_open_alert_everywhere(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = chain()
    app = make_app(wf)
    handle = app.start(wf.name, {})
    # The ready task of `first` is gone (a bad restore, a manual delete): its step waits for a
    # task that does not exist, and nothing says what it would have returned.
    sql(db_url, "DELETE FROM konduit_tasks WHERE execution_id = %s AND step = 'first' "
        "RETURNING id", handle.id)
    with running_worker(app, **FAST) as worker:
        [alert] = until(lambda: app.alerts(kind="execution_stalled"), 15, "the stall alert")
        assert alert.open and alert.severity == "critical" and alert.subject == str(handle.id)
        assert str(handle.id) in alert.message
        assert alert.details["reasons"] == [
            "step 'first' waits for 1 task that neither exist nor can run (none is ready, "
            "running or waiting, none ended uncounted)"]
        # More passes: the same stall is neither raised nor counted again.
        wait_for_passes(worker, "stalls", n=3)
        assert [a.id for a in app.alerts(include_resolved=True, kind="execution_stalled")] \
            == [alert.id]
        assert stalls(db_url) == {(wf.name, False): 1}
        assert app.status(handle.id).status == "running"

        proc = konduit_cli("status", str(handle.id), "--database-url", db_url)
        assert proc.returncode == 0, proc.stderr
        assert "stalled" in proc.stdout and "step 'first' waits for 1 task" in proc.stdout
        proc = konduit_cli("status", str(handle.id), "--json", "--database-url", db_url)
        assert json.loads(proc.stdout)["stalled"]["id"] == alert.id

        with serve(db_url, port=0) as exporter:
            samples = scrape(exporter.url)
        assert value(samples, "konduit_stalls", workflow=wf.name, healed="false") == 1
        assert value(samples, "konduit_alerts_open", kind="execution_stalled") == 1

        site = create_app(database_client(db_url))
        with serving(site) as base, httpx.Client(base_url=base) as client:
            listed = client.get("/api/v1/alerts", params={"kind": "execution_stalled"}).json()
            assert [a["subject"] for a in listed] == [str(handle.id)]
            detail = client.get(f"/api/v1/executions/{handle.id}").json()
            assert detail["stalled"]["id"] == alert.id and detail["stalled"]["open"]
            page = client.get(f"/executions/{handle.id}")
            assert page.status_code == 200
            assert 'id="stalled"' in page.text
            assert "step &#39;first&#39; waits for 1 task" in page.text

        # Cancelled by an operator: it no longer stalls, and the alert says why it closed.
        assert app.cancel(handle.id)
        until(lambda: not app.alerts(kind="execution_stalled"), 10, "the alert to resolve")
    [closed] = app.alerts(include_resolved=True, kind="execution_stalled")
    assert closed.details["resolution"] == "execution cancelled"
    assert stalls(db_url) == {(wf.name, False): 1}


def watchdog_passes(db_url: str, app: konduit.App, count: int, **options: Any) -> list[Pass]:
    """``count`` watchdogs, each on its own connection, making one pass at once."""

    async def go() -> list[Pass]:
        db = Database(db_url, min_size=count, max_size=count)
        await db.open()
        try:
            dogs = [Watchdog(db, app.registry, **options) for _ in range(count)]
            return list(await asyncio.gather(*(d.run() for d in dogs)))
        finally:
            await db.close()

    return asyncio.run(go())


def test_racing_watchdogs_decide_a_stall_once(make_app: Callable[..., konduit.App],
                                              db_url: str) -> None:
    wf = fan_in("stall-race")
    app = make_app(wf)
    eid = app.start(wf.name, {}).id
    end_without_fan_in(db_url, eid, "left")
    end_without_fan_in(db_url, eid, "right")
    # Both branches ended in SQL: the join counts both pending; make the stall older than the grace.
    sql(db_url, "UPDATE konduit_steps SET fired_at = fired_at - interval '1 minute' "
        "WHERE execution_id = %s RETURNING step", eid)
    sql(db_url, "UPDATE konduit_executions SET created_at = created_at - interval '1 minute' "
        "WHERE id = %s RETURNING id", eid)
    passes = watchdog_passes(db_url, app, 6, grace=30.0)
    decided = [s for p in passes for s in p.stalls]
    assert len(decided) == 1 and decided[0].healed  # the others re-checked under the lock
    assert decided[0].advanced is not None and decided[0].advanced.fired == ["join"]
    [(tasks,)] = sql(db_url, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                     "AND step = 'join'", eid)
    assert tasks == 1
    assert len(app.alerts(include_resolved=True, kind="execution_stalled")) == 1
    assert stalls(db_url) == {(wf.name, True): 1}
    # Healed: a second look finds nothing (the join's task is ready).
    assert watchdog_passes(db_url, app, 1, grace=30.0)[0].stalls == []


def test_the_watchdog_leaves_healthy_and_young_executions_alone(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = chain("stall-healthy")
    app = make_app(wf)
    ready = app.start(wf.name, {}).id  # a ready task nobody runs for a minute: not a stall
    young = app.start(wf.name, {}).id  # stalled, but for less than the grace
    sql(db_url, "DELETE FROM konduit_tasks WHERE execution_id = %s RETURNING id", young)
    sql(db_url, "UPDATE konduit_steps SET fired_at = fired_at - interval '1 minute' "
        "WHERE execution_id = %s RETURNING step", ready)
    sql(db_url, "UPDATE konduit_executions SET created_at = created_at - interval '1 minute' "
        "WHERE id = %s RETURNING id", ready)
    [done] = watchdog_passes(db_url, app, 1, grace=30.0)
    assert done.scanned == 2 and done.stalls == []
    assert app.alerts(include_resolved=True) == []
    # The window walks on: with a window of one, each pass looks at the next execution.
    [first] = watchdog_passes(db_url, app, 1, grace=30.0, window=1)
    assert first.scanned == 1


def test_the_look_for_stalls_probes_indexes_and_never_reads_a_big_map(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = chain("stall-plan")
    app = make_app(wf)
    ids = [app.start(wf.name, {}).id for _ in range(3)]
    # One running execution has 50,000 ended items: the look must not read them.
    sql(db_url, "INSERT INTO konduit_tasks (execution_id, workflow, step, map_index, status, "
        "max_attempts, finished_at) SELECT %s, 'stall-plan@1', 'second', i, 'succeeded', 1, "
        "clock_timestamp() FROM generate_series(1, 50000) i RETURNING 1", ids[0])
    sql(db_url, "ANALYZE konduit_tasks")
    text = q("execution_list_stalled_after_cursor")
    names = list(dict.fromkeys(re.findall(r"%\(([a-z_]+)\)s", text)))  # $1, $2... in order
    values = {"after": "NULL::uuid", "window": "500", "limit": "20", "grace_seconds": "60"}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"PREPARE look AS {_positional(text)}")
        arguments = ", ".join(values[n] for n in names)
        for mode in ("force_custom_plan", "force_generic_plan"):  # and the cached generic one
            conn.execute(f"SET plan_cache_mode = {mode}")
            plan = "\n".join(r[0] for r in conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE look({arguments})").fetchall())
            assert "konduit_tasks_live" in plan, plan
            assert "Seq Scan on konduit_tasks" not in plan, plan
            assert "Bitmap Heap Scan on konduit_tasks" not in plan, plan


def test_the_grace_is_a_worker_setting_with_a_flag_and_a_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerConfig().stall_grace == 60.0
    monkeypatch.setenv("KONDUIT_STALL_GRACE", "2.5")
    assert WorkerConfig().stall_grace == 2.5
    with pytest.raises(ValueError, match="stall_grace"):
        WorkerConfig(stall_grace=0)
    proc = konduit_cli("worker", "--help")
    assert "--stall-grace" in proc.stdout and "KONDUIT_STALL_GRACE" in proc.stdout


def test_a_pass_decides_a_bounded_number_and_the_next_goes_on(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = chain("stall-many")
    app = make_app(wf)
    ids = sorted(app.start(wf.name, {}).id for _ in range(3))
    for eid in ids:
        sql(db_url, "DELETE FROM konduit_tasks WHERE execution_id = %s RETURNING id", eid)
    sql(db_url, "UPDATE konduit_steps SET fired_at = fired_at - interval '1 minute' RETURNING step")
    sql(db_url, "UPDATE konduit_executions SET created_at = created_at - interval '1 minute' "
        "RETURNING id")

    async def go() -> list[Pass]:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            dog = Watchdog(db, app.registry, grace=30.0, per_pass=1)
            return [await dog.run() for _ in range(4)]
        finally:
            await db.close()

    passes = asyncio.run(go())
    assert [[s.execution_id for s in p.stalls] for p in passes] == [[i] for i in ids] + [[]]
    assert all(not s.healed and s.alert is not None for p in passes for s in p.stalls)
    assert stalls(db_url) == {(wf.name, False): 3}
