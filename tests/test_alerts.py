"""Stored alerts on a real database: raised and resolved by workers, one open row per subject.

- A run whose branch slows 10x raises ``window_at_risk`` before its window is missed, while it
  still runs, from real worker processes; the alert resolves when the execution ends.
- Window alerts resolve when the forecast is back inside the window or the execution finished
  in time; fan-in-wait and no-success alerts are stored, and resolve when their rule clears.
- Six evaluators racing behind a barrier, cycle after cycle, open each alert once and resolve it
  once: no duplicate open alert, one ``raised`` and one ``resolved`` hook call per alert.
- ``konduit alerts``, ``app.alerts()``, the metrics and the dashboard show them.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

import konduit
from konduit.db.database import Database, Tx
from konduit.engine.alerting import AlertChange, Alerting, Round, prune_resolved_alerts
from konduit.engine.registry import Registry
from konduit.observe.metrics import metric_families, serve
from konduit.observe.stats import Stats
from konduit.web import create_app, database_client
from tests.apps import alerts_app
from tests.support.browser import serving
from tests.support.db import rows
from tests.support.load import overload
from tests.support.waiting import until
from tests.support.workers import running_worker, spawn_worker, stop_workers
from tests.test_cli import assert_clean_error, konduit_cli
from tests.test_metrics import scrape, value

pytestmark = [pytest.mark.storage]



def evaluate(db_url: str, registry: Registry, **options: Any) -> Round:
    """One evaluation round, as a worker's alert loop runs it."""

    async def go() -> Round:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            return await Alerting(db, registry, **options).evaluate()
        finally:
            await db.close()

    return asyncio.run(go())


def quick_workflow(name: str = "alerts-quick", seconds: float = 0.05,
                   **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1, **options)

    @wf.step()
    def only(ctx: konduit.Context) -> str:
        time.sleep(seconds)
        return "done"

    return wf


# -- the window at risk, from real worker processes ---------------------------------------------


@contextmanager
def worker_processes(db_url: str, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [spawn_worker("tests.apps.alerts_app:app", db_url, "--alert-interval", "0.2",
                          concurrency=8) for _ in range(count)]
    try:
        yield procs
    finally:
        stop_workers(procs)


@pytest.mark.slow
def test_a_window_alert_fires_before_the_window_is_missed_when_a_branch_slows_10x(
        db_url: str) -> None:
    """The forecast puts the slow run at risk once ``publish``'s p95 no longer fits before the
    window: ``publish`` seconds before it, the time the workers' alert rounds have to raise the
    alert before the miss. On an idle machine 1.5 s is ample (a round every 0.2 s); on one that
    other processes overload a round can take longer, so the branch and ``publish`` are
    stretched by the overload measured as the test begins (at most 4x). The window is set from
    the history itself (twice its slowest run, plus a second): a fixed 4.5 s window was, on a
    busy machine, within the p95 forecast of a normal run's start, so the alert was raised at
    once, resolved when ``fetch`` ended early, and raised again (two alerts, the first resolved
    while the run went on). The slow branch alone outlasts the window, so the run misses it.
    The bug it catches (no alert, or one only at the miss) fails it at any stretch."""
    stretch = min(overload(), 4.0)
    fast, publish = 0.4 * stretch, 1.5 * stretch  # history: ~0.4 + 1.5 s (times the stretch)
    app = konduit.App([alerts_app.wf], database_url=db_url)
    try:
        with worker_processes(db_url, 2):
            def start(branch_seconds: float, seconds: float) -> konduit.ExecutionHandle:
                return app.start("alerts-window",
                                 {"branch_seconds": branch_seconds, "publish_seconds": publish},
                                 deadline_at=datetime.now(UTC) + timedelta(seconds=seconds))

            # The history runs get a window far wider than they take on any machine (four at
            # once took more than 4.5 s beside other test suites, and raised alerts of their own).
            for handle in [start(fast, 60.0 * stretch) for _ in range(4)]:
                handle.wait(timeout=60 * stretch)
            assert app.alerts(include_resolved=True) == []  # the fast history fits its window
            [(slowest,)] = rows(db_url, "SELECT max(extract(epoch FROM finished_at - created_at))"
                                        "::float8 FROM konduit_executions")
            window = 2 * slowest + 1.0  # ~5.5 s on an idle machine

            slow = start(max(fast * 10, window), window)
            seen = until(lambda: app.alerts(kind="window_at_risk"), window + 60,
                         "the window alert")
            # Seen open while the execution still runs, and raised before its window.
            assert app.status(slow.id).status == "running"
            [alert] = seen
            assert alert.subject == str(slow.id) and alert.workflow == "alerts-window"
            assert alert.details["path"][-1] == "publish"
            result = slow.wait(timeout=2 * window + 60)
            resolved = until(
                lambda: [a for a in app.alerts(include_resolved=True) if not a.open], 30,
                "the alert to resolve")
    finally:
        app.close()
    [(deadline_at, finished_at)] = rows(
        db_url, "SELECT deadline_at, finished_at FROM konduit_executions WHERE id = %s", slow.id)
    assert result.status == "succeeded"
    assert finished_at > deadline_at  # the window really was missed ...
    assert alert.raised_at < deadline_at  # ... and the alert came before the miss ...
    assert alert.raised_at < finished_at  # ... while the execution ran
    assert alert.details["p95_slack_seconds"] < 0 and not alert.details["missed"]
    [done] = resolved
    assert done.id == alert.id and done.resolved_at is not None
    assert done.resolved_at >= finished_at
    assert "after its window" in done.details["resolution"]
    assert done.details["missed_by_seconds"] > 0
    # One alert for the whole run, however many evaluations (two workers, every 0.2 s) saw it.
    assert rows(db_url, "SELECT count(*) FROM konduit_alerts")[0][0] == 1


# -- resolving ------------------------------------------------------------------------------------


def set_window(db_url: str, execution_id: Any, seconds_from_now: float) -> None:
    rows(db_url, "UPDATE konduit_executions SET deadline_at = clock_timestamp() "
         "+ make_interval(secs => %s) WHERE id = %s RETURNING id", seconds_from_now, execution_id)


def test_a_window_alert_resolves_when_the_forecast_is_back_inside_or_the_run_ends_in_time(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = quick_workflow()
    app = make_app(wf)
    late = app.start(wf.name, {}, deadline_at=datetime.now(UTC) + timedelta(hours=1))
    in_time = app.start(wf.name, {}, deadline_at=datetime.now(UTC) + timedelta(hours=1))
    assert evaluate(db_url, app.registry).findings == []

    for eid in (late.id, in_time.id):
        set_window(db_url, eid, -1)  # still running past its window: at risk, for sure
    first = evaluate(db_url, app.registry)
    assert sorted(a.subject for a in first.raised) == sorted([str(late.id), str(in_time.id)])
    assert all(a.severity == "critical" and a.details["missed"] for a in first.raised)
    again = evaluate(db_url, app.registry)
    assert again.raised == [] and len(again.confirmed) == 2  # refreshed, not raised twice

    set_window(db_url, late.id, 3600)  # the window moved: the forecast is inside again
    cleared = evaluate(db_url, app.registry)
    [resolved] = cleared.resolved
    assert resolved.subject == str(late.id)
    assert resolved.details["resolution"] == "forecast back inside the window"

    set_window(db_url, late.id, -1)  # at risk again: a new alert, the old one stays resolved
    assert [a.subject for a in evaluate(db_url, app.registry).raised] == [str(late.id)]
    set_window(db_url, in_time.id, 3600)  # and without an evaluation in between, it finishes
    with running_worker(app):
        late.wait(timeout=30)
        in_time.wait(timeout=30)
    ended = {a.subject: a for a in evaluate(db_url, app.registry).resolved}
    assert "after its window" in ended[str(late.id)].details["resolution"]
    assert ended[str(in_time.id)].details["resolution"] == "execution succeeded inside its window"
    history = app.alerts(include_resolved=True)
    assert [a.subject for a in history].count(str(late.id)) == 2
    assert app.alerts() == [] and all(not a.open for a in history)
    assert evaluate(db_url, app.registry).raised == []  # a finished execution is never raised


def fan_in_workflow(name: str = "alerts-fan-in") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def fetch(ctx: konduit.Context) -> float:
        return float(ctx.input["slow"])

    @wf.step(after=[fetch])
    def quick(ctx: konduit.Context) -> int:
        return 1

    @wf.step(after=[fetch])
    async def sluggish(ctx: konduit.Context) -> int:
        await asyncio.sleep(ctx.upstream["fetch"])
        return 2

    @wf.step(after=[quick, sluggish])
    def join(ctx: konduit.Context) -> int:
        return 3

    return wf


def test_the_fan_in_rule_is_a_stored_alert_that_resolves_after_a_quick_run(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = fan_in_workflow()
    app = make_app(wf)
    rule = {"fan_in_wait": 0.3, "consecutive": 2}
    with running_worker(app):
        app.start(wf.name, {"slow": 0.6}).wait(timeout=30)
        assert evaluate(db_url, app.registry, **rule).findings == []  # once is not a pattern
        app.start(wf.name, {"slow": 0.6}).wait(timeout=30)
        [raised] = evaluate(db_url, app.registry, **rule).raised
        assert raised.kind == "fan_in_wait" and raised.subject == "alerts-fan-in/join"
        assert raised.details["straggler"] == "sluggish" and raised.severity == "warning"
        assert evaluate(db_url, app.registry, **rule).raised == []
        app.start(wf.name, {"slow": 0}).wait(timeout=30)  # one quick run resets the count
    [resolved] = evaluate(db_url, app.registry, **rule).resolved
    assert resolved.id == raised.id and "fan-in wait back under" in resolved.details["resolution"]


def test_a_workflow_without_a_recent_success_raises_no_success(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = quick_workflow("alerts-nightly", alert_after_no_success="1h")
    quiet = quick_workflow("alerts-no-threshold")
    app = make_app(wf, quiet)
    for name in (wf.name, quiet.name):
        app.start(name, {})  # registers both; nothing runs them
    assert evaluate(db_url, app.registry).findings == []  # a new workflow gets its grace
    rows(db_url, "UPDATE konduit_workflows SET created_at = created_at - interval '2 hours' "
         "RETURNING name")
    [raised] = evaluate(db_url, app.registry).raised
    assert (raised.kind, raised.subject) == ("no_success", "alerts-nightly")
    assert "never succeeded" in raised.message
    with running_worker(app):
        app.start(wf.name, {}).wait(timeout=30)
    [resolved] = evaluate(db_url, app.registry).resolved
    assert resolved.id == raised.id
    # A success long ago is no success recently.
    rows(db_url, "UPDATE konduit_executions SET created_at = created_at - interval '3 hours', "
         "finished_at = finished_at - interval '3 hours' WHERE workflow_name = %s "
         "RETURNING id", wf.name)
    [again] = evaluate(db_url, app.registry).raised
    assert "last success" in again.message and again.id != raised.id


def test_a_worker_evaluates_the_rules_and_leaves_other_deployments_alone(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf, other = quick_workflow(seconds=1.0), quick_workflow("alerts-elsewhere")
    app = make_app(wf, other)
    mine = app.start(wf.name, {}, deadline_at=datetime.now(UTC) - timedelta(seconds=1))
    theirs = app.start(other.name, {}, deadline_at=datetime.now(UTC) - timedelta(seconds=1))
    # A worker that knows only `wf` raises (in its own loop) the alert of its execution only,
    # and resolves it once the execution has ended.
    only_mine = make_app(quick_workflow(seconds=1.0))
    with running_worker(only_mine, alert_interval=0.1):
        [alert] = until(lambda: app.alerts(), 10, "the worker's alert")
        assert alert.subject == str(mine.id)
        mine.wait(timeout=30)
        until(lambda: not app.alerts(), 10, "the worker to resolve it")
    assert [a.subject for a in app.alerts(include_resolved=True)] == [str(mine.id)]
    assert app.status(theirs.id).status == "running"


# -- racing evaluators -----------------------------------------------------------------------------


def test_racing_evaluators_open_each_alert_once_and_resolve_it_once(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = quick_workflow()
    app = make_app(wf)
    ids = [app.start(wf.name, {}, deadline_at=datetime.now(UTC) + timedelta(hours=1)).id
           for _ in range(5)]
    evaluators, cycles = 6, 8
    start, done = threading.Barrier(evaluators + 1), threading.Barrier(evaluators + 1)
    changes: list[AlertChange] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    async def record(tx: Tx, change: AlertChange) -> None:
        with lock:
            changes.append(change)

    def evaluator() -> None:
        async def go() -> None:
            db = Database(db_url, min_size=1, max_size=2)
            await db.open()
            try:
                alerting = Alerting(db, app.registry, hook=record)
                for _ in range(2 * cycles):
                    start.wait(timeout=60)  # every evaluator reads the same facts at once
                    try:
                        await alerting.evaluate()
                    except BaseException as exc:
                        errors.append(exc)
                    done.wait(timeout=60)
            finally:
                await db.close()

        asyncio.run(go())

    threads = [threading.Thread(target=evaluator, daemon=True) for _ in range(evaluators)]
    for t in threads:
        t.start()
    for cycle in range(cycles):
        for seconds, expect_open in ((-1, len(ids)), (3600, 0)):
            for eid in ids:
                set_window(db_url, eid, seconds)
            start.wait(timeout=60)
            done.wait(timeout=60)
            assert errors == []
            [(open_now,)] = rows(db_url, "SELECT count(*) FROM konduit_alerts "
                                 "WHERE resolved_at IS NULL")
            assert open_now == expect_open, (cycle, seconds)
    for t in threads:
        t.join(timeout=30)
    [(total, subjects)] = rows(db_url, "SELECT count(*), count(DISTINCT subject) FROM konduit_alerts")
    assert (total, subjects) == (cycles * len(ids), len(ids))
    raised = [c for c in changes if c.event == "raised"]
    resolved = [c for c in changes if c.event == "resolved"]
    assert len(raised) == len(resolved) == cycles * len(ids)  # once each, whoever won the race
    assert len({c.alert.id for c in raised}) == len(raised)


def test_the_schema_refuses_a_second_open_alert_for_a_subject(db_url: str) -> None:
    insert = ("INSERT INTO konduit_alerts (kind, subject, workflow, severity, message) "
              "VALUES ('no_success', 'wf', 'wf', 'warning', 'x')")
    rows(db_url, insert + " RETURNING id")
    with pytest.raises(psycopg.errors.UniqueViolation):
        rows(db_url, insert + " RETURNING id")
    rows(db_url, "UPDATE konduit_alerts SET resolved_at = clock_timestamp() RETURNING id")
    rows(db_url, insert + " RETURNING id")  # resolved ones do not count
    with pytest.raises(psycopg.errors.CheckViolation):
        rows(db_url, "INSERT INTO konduit_alerts (kind, subject, workflow, severity, message) "
             "VALUES ('mystery', 'wf', 'wf', 'warning', 'x') RETURNING id")


# -- where alerts show -----------------------------------------------------------------------------


def seed_alerts(db_url: str) -> None:
    """An open critical window alert (with markup in its message) and a resolved fan-in one."""
    rows(db_url, "INSERT INTO konduit_alerts (kind, subject, workflow, severity, message, details) "
         "VALUES ('window_at_risk', '0190b3c4-0000-7000-8000-000000000001', 'nightly', "
         "'critical', '<script>alert(1)</script> [bold]late[/bold]', %s) RETURNING id",
         Jsonb({"missed": True}))
    rows(db_url, "INSERT INTO konduit_alerts (kind, subject, workflow, severity, message, details, "
         "resolved_at) VALUES ('fan_in_wait', 'nightly/join', 'nightly', 'warning', 'slow join', "
         "%s, clock_timestamp()) RETURNING id", Jsonb({"resolution": "fan-in wait back under 20s"}))


def test_konduit_alerts_command(db_url: str) -> None:
    common = ("--database-url", db_url)
    proc = konduit_cli("alerts", *common)
    assert proc.returncode == 0, proc.stderr
    assert "no open alerts" in proc.stdout
    seed_alerts(db_url)

    proc = konduit_cli("alerts", "--json", *common)
    assert proc.returncode == 3, proc.stderr  # an open alert: a code to page on
    [alert] = json.loads(proc.stdout)
    assert alert["kind"] == "window_at_risk" and alert["open"] and alert["severity"] == "critical"
    proc = konduit_cli("alerts", "--all", "--json", *common)
    assert [a["kind"] for a in json.loads(proc.stdout)] == ["fan_in_wait", "window_at_risk"]
    proc = konduit_cli("alerts", "--all", "--kind", "fan_in_wait", *common)
    assert proc.returncode == 0, proc.stderr  # nothing open among those listed
    assert "nightly/join" in proc.stdout and "back under 20s" in proc.stdout
    proc = konduit_cli("alerts", *common)
    assert proc.returncode == 3
    assert "[bold]late[/bold]" in proc.stdout  # user text is printed, not interpreted
    assert_clean_error(konduit_cli("alerts", "--kind", "bogus", *common),
                       "unknown alert kind 'bogus'")


def test_alert_metrics() -> None:
    now = datetime.now(UTC)
    stats = Stats(None, 3600.0, 20.0, 2, [], [], [])
    open_alert = {"kind": "window_at_risk", "subject": "e1", "workflow": "wf",
                  "severity": "critical", "raised_at": now, "resolved_at": None}
    families = {f.name: f for f in metric_families(stats, [], [], [open_alert])}
    counts = {s.labels["kind"]: s.value for s in families["konduit_alerts_open"].samples}
    assert counts == {"window_at_risk": 1, "fan_in_wait": 0, "no_success": 0,
                      "execution_stalled": 0, "degraded_budget": 0, "version_unserved": 0,
                      "queue_unserved": 0}
    [info] = families["konduit_alert_open_since_seconds"].samples
    assert info.labels == {"kind": "window_at_risk", "subject": "e1", "workflow": "wf",
                           "severity": "critical"}
    assert info.value == pytest.approx(now.timestamp())


def test_the_exporter_and_the_dashboard_show_alerts(db_url: str) -> None:
    seed_alerts(db_url)
    with serve(db_url, port=0) as exporter:
        samples = scrape(exporter.url)
    assert value(samples, "konduit_alerts_open", kind="window_at_risk") == 1
    assert value(samples, "konduit_alerts_open", kind="fan_in_wait") == 0
    assert value(samples, "konduit_alert_open_since_seconds", subject="0190b3c4-0000-7000-8000-"
                 "000000000001") > 0

    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as client:
        page = client.get("/alerts")
        assert page.status_code == 200
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>alert" not in page.text
        assert 'id="open-alerts"' in page.text and "back under 20s" in page.text
        assert 'href="/alerts"' in client.get("/stats").text
        api = client.get("/api/v1/alerts", params={"all": "true"}).json()
        assert {a["kind"] for a in api} == {"window_at_risk", "fan_in_wait"}
        assert [a["kind"] for a in client.get("/api/v1/alerts").json()] == ["window_at_risk"]
        assert client.get("/api/v1/alerts", params={"kind": "bogus"}).status_code == 422
        assert client.get("/api/alerts").status_code == 404  # the unversioned route is gone


def test_rules_over_history_run_every_30s_and_only_they_resolve_their_alerts(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    wf = quick_workflow("alerts-nightly", alert_after_no_success="1h")
    app = make_app(wf)
    app.start(wf.name, {})
    rows(db_url, "UPDATE konduit_workflows SET created_at = created_at - interval '2 hours' "
         "RETURNING name")

    async def go() -> list[Round]:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            alerting = Alerting(db, app.registry, history_every=3600)
            rounds = [await alerting.evaluate()]
            await asyncio.to_thread(run_once)
            rounds.append(await alerting.evaluate())  # no history rules this round: left open
            alerting.history_every = 0
            rounds.append(await alerting.evaluate())
            return rounds
        finally:
            await db.close()

    def run_once() -> None:
        with running_worker(app):
            app.start(wf.name, {}).wait(timeout=30)

    first, throttled, due = asyncio.run(go())
    assert [a.kind for a in first.raised] == ["no_success"]
    assert throttled.findings == throttled.resolved == []
    assert [a.id for a in due.resolved] == [first.raised[0].id]


def test_a_repair_is_not_judged_against_the_window(make_app: Callable[..., konduit.App],
                                                   db_url: str) -> None:
    wf = quick_workflow()
    app = make_app(wf)
    eid = app.start(wf.name, {}, deadline_at=datetime.now(UTC) - timedelta(seconds=1)).id
    [raised] = evaluate(db_url, app.registry).raised
    # As a repair reopens it: running again, a later generation, long after its window.
    rows(db_url, "UPDATE konduit_executions SET generation = 2 WHERE id = %s RETURNING id", eid)
    cleared = evaluate(db_url, app.registry)
    assert cleared.findings == [] and [a.id for a in cleared.resolved] == [raised.id]
    assert "being repaired" in cleared.resolved[0].details["resolution"]
    assert evaluate(db_url, app.registry).raised == []


def test_pruning_deletes_old_resolved_alerts_and_never_open_ones(db_url: str) -> None:
    seed_alerts(db_url)  # one open, one resolved just now
    rows(db_url, "INSERT INTO konduit_alerts (kind, subject, workflow, severity, message, "
         "raised_at, last_seen_at, resolved_at) SELECT 'no_success', 'wf' || i, 'wf', 'warning', "
         "'old', now() - interval '40 days', now() - interval '40 days', now() - interval '39 days' "
         "FROM generate_series(1, 5) i RETURNING id")
    rows(db_url, "UPDATE konduit_alerts SET raised_at = now() - interval '90 days', last_seen_at = "
         "now() - interval '90 days' WHERE resolved_at IS NULL RETURNING id")

    async def go() -> int:
        db = Database(db_url, min_size=1, max_size=1)
        await db.open()
        try:
            return await prune_resolved_alerts(db, "30d", batch=2)
        finally:
            await db.close()

    assert asyncio.run(go()) == 5
    left = rows(db_url, "SELECT kind, resolved_at IS NULL FROM konduit_alerts ORDER BY id")
    assert left == [("window_at_risk", True), ("fan_in_wait", False)]
