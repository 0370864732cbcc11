"""Stored events (docs/durable-waits.md): an event sent by key before the execution that will
wait for it exists is kept for a retention and consumed when its step waits; on real PostgreSQL
with real workers, and racing armings forced together by a barrier."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest

import konduit
from konduit.bench.harness import LoopThread, claim
from konduit.core.model import Command
from konduit.core.waits import Armed, WaitKind
from konduit.engine.waits import arm, send_event
from konduit.errors import KonduitError, WorkflowDefinitionError
from tests.support.db import rows, value
from tests.support.payloads import opened_rows
from tests.support.waiting import until, wait_for_passes
from tests.support.workers import running_worker
from tests.test_waits_events import FAST, review_workflow

pytestmark = pytest.mark.storage


def approval_workflow(name: str = "approval", retention: str | None = None) -> konduit.Workflow:
    """One event step, keyed by the input: the whole execution is its wait."""
    wf = konduit.Workflow(name, version=1)
    wf.wait_for_event("approved", name="approve", key=lambda ctx: ctx.input["k"],
                      deadline="1h", retention=retention)
    return wf


def events(url: str) -> list[tuple[Any, ...]]:
    """(key, consumed_by, expired) of every event, oldest first."""
    return rows(url, "SELECT key, consumed_by, expires_at <= clock_timestamp() "
                     "FROM konduit_events ORDER BY id")


def test_an_event_sent_before_its_execution_exists_is_consumed_when_its_step_waits(
        make_app, db_url):
    app = make_app(review_workflow())
    with running_worker(app, **FAST):
        assert app.send_event("translation-approved", key="episode-1",
                              payload={"by": "early"}) == "stored"
        # Another key's event is kept apart: this execution does not take it.
        assert app.send_event("translation-approved", key="episode-2",
                              payload={"by": "other"}) == "stored"
        handle = app.start("review-flow", input={"episode": 1})
        result = handle.wait(timeout=30)  # no second send: the step took the stored one
    assert result.output == {"text": {"by": "early"}, "outcome": "succeeded"}
    task = value(db_url, "SELECT id FROM konduit_tasks WHERE execution_id = %s AND step = "
                         "'review'", handle.id)
    assert events(db_url) == [("episode-1", task, False), ("episode-2", None, False)]
    kept = value(db_url, "SELECT extract(epoch FROM expires_at - created_at)::int "
                         "FROM konduit_events WHERE key = 'episode-2'")
    assert kept == 24 * 3600  # the default retention


def test_the_oldest_stored_event_is_consumed_first(make_app, db_url):
    app = make_app(approval_workflow())
    with running_worker(app, **FAST):
        for n in range(3):
            assert app.send_event("approved", key="k", payload=n) == "stored"
        outputs = [app.start("approval", input={"k": "k"}).wait(timeout=30).output
                   for _ in range(3)]
    assert outputs == [0, 1, 2]


def test_nothing_could_take_it_no_match_and_nothing_kept(make_app, db_url):
    wf = konduit.Workflow("by-id-only", version=1)
    wf.wait_for_event("poked", name="poke", deadline="1h")  # no key=: reached by id only
    app = make_app(review_workflow(), wf)
    with running_worker(app, **FAST):
        assert app.send_event("nobody-waits-for-this", key="k") == "no match"
        assert app.send_event("poked", key="k") == "no match"
        handle = app.start("by-id-only")
        assert app.send_event("poked", execution_id=handle.id, payload=1) in ("stored", "woke")
        assert handle.wait(timeout=30).output == 1
    assert value(db_url, "SELECT count(*) FROM konduit_events WHERE name <> 'poked'") == 0


def test_the_step_retention_beats_the_app_default_and_the_longest_counts(make_app, db_url):
    app = make_app(approval_workflow("short", retention="2h"),
                   approval_workflow("long", retention="3h"), event_retention="10m")
    other = make_app(review_workflow(), event_retention="10m")
    # No worker runs: the sending App registers its workflows first.
    assert app.send_event("approved", key="x") == "stored"
    assert other.send_event("translation-approved", key="y") == "stored"
    kept = dict(rows(db_url, "SELECT key, extract(epoch FROM expires_at - created_at)::int "
                             "FROM konduit_events"))
    assert kept == {"x": 3 * 3600, "y": 600}


def test_an_expired_event_is_never_consumed_and_is_deleted(make_app, db_url):
    app = make_app(approval_workflow(), event_retention=1)
    assert app.send_event("approved", key="late", payload="stale") == "stored"
    until(lambda: events(db_url)[0][2], what="the event to expire")
    handle = app.start("approval", input={"k": "late"})
    lt = LoopThread(app.database_url)
    try:  # the arming, with no worker (whose waits pass would delete the event first)
        (task,) = lt.run(claim(lt.db, app.registry, 1))
        lt.run(arm(lt.db, app.registry, task.completion(
            Command.WAIT, payload=Armed(WaitKind.EVENT, event="approved", key="late"))))
    finally:
        lt.close()
    assert events(db_url) == [("late", None, True)]
    assert value(db_url, "SELECT status FROM konduit_tasks WHERE id = %s", task.id) == "waiting"
    with running_worker(app, **FAST) as worker:
        # The waits pass deletes it (whether or not the App prunes executions).
        wait_for_passes(worker, "waits", 2)
        assert events(db_url) == []
        assert app.send_event("approved", key="late", payload="fresh") == "woke"
        assert handle.wait(timeout=30).output == "fresh"


def test_prune_deletes_expired_events_and_keeps_live_ones(make_app, db_url):
    app = make_app(approval_workflow())
    assert app.send_event("approved", key="old") == "stored"
    assert app.send_event("approved", key="new") == "stored"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE konduit_events SET expires_at = clock_timestamp() - interval '1s' "
                     "WHERE key = 'old'")
    app.prune("30d")
    assert [e[0] for e in events(db_url)] == ["new"]  # the old one went, though only 1 s late


def test_bad_retentions_are_refused_naming_the_setting(make_app, monkeypatch):
    with pytest.raises(WorkflowDefinitionError, match="retention"):
        approval_workflow(retention="0s")
    with pytest.raises(KonduitError, match="event_retention"):
        make_app(event_retention="soon")
    monkeypatch.setenv("KONDUIT_EVENT_RETENTION", "-5")
    with pytest.raises(KonduitError, match="KONDUIT_EVENT_RETENTION"):
        make_app()
    monkeypatch.setenv("KONDUIT_EVENT_RETENTION", "90m")
    assert make_app().event_retention == 5400
    # Declared only when given: a workflow without retention= keeps its spec (and hash).
    assert "retention" not in str(approval_workflow().spec.spec_json)
    assert approval_workflow(retention="2h").spec.spec_json["steps"][0]["wait"]["retention"] \
        == 7200


TRIALS = 30


def racing_arms(app: konduit.App, threads: list[LoopThread], trial: int,
                sender: bool) -> tuple[list[str], list[str]]:
    """Two executions waiting for key ``r<trial>``, one event stored for it; their two armings
    (and, with ``sender``, a second send) released together. Returns the send answers and the
    executions' ids, in the order started."""
    key = f"r{trial}"
    lt = threads[0]
    ids = [str(app.start("approval", input={"k": key}).id) for _ in range(2)]
    answers = [app.send_event("approved", key=key, payload="first")]
    tasks = lt.run(claim(lt.db, app.registry, 2))
    assert sorted(str(t.execution_id) for t in tasks) == sorted(ids)
    barrier = threading.Barrier(3 if sender else 2)

    async def arming(t: LoopThread, task: Any) -> None:
        barrier.wait(timeout=30)
        completion = task.completion(Command.WAIT, payload=Armed(WaitKind.EVENT, event="approved",
                                                                 key=key))
        await arm(t.db, app.registry, completion)

    async def sending(t: LoopThread) -> None:
        barrier.wait(timeout=30)
        answers.append(await send_event(t.db, app.registry, "approved", key=key,
                                        payload="second"))

    futures = [threads[i + 1].submit(arming(threads[i + 1], task)) for i, task in
               enumerate(tasks)]
    if sender:
        futures.append(threads[3].submit(sending(threads[3])))
    for f in futures:
        f.result(timeout=60)
    return answers, ids


@pytest.fixture
def arming_threads(make_app):
    app = make_app(approval_workflow())
    threads = [LoopThread(app.database_url) for _ in range(4)]
    try:
        yield app, threads
    finally:
        for t in threads:
            t.close()


def test_two_armings_racing_for_one_stored_event_exactly_one_takes_it(arming_threads, db_url):
    app, threads = arming_threads
    for trial in range(TRIALS):
        answers, ids = racing_arms(app, threads, trial, sender=False)
        assert answers == ["stored"]
        consumed = rows(db_url, "SELECT t.execution_id::text FROM konduit_events e "
                                "JOIN konduit_tasks t ON t.id = e.consumed_by WHERE e.key = %s",
                        f"r{trial}")
        assert len(consumed) == 1 and consumed[0][0] in ids, consumed
        statuses = sorted(rows(db_url, "SELECT e.status, t.status FROM konduit_executions e "
                                       "JOIN konduit_tasks t ON t.execution_id = e.id "
                                       "WHERE e.id = ANY(%s::uuid[])", ids))
        # One took it and finished; the other still waits for an event of its own.
        assert statuses == [("running", "waiting"), ("succeeded", "succeeded")], statuses


def test_two_armings_and_a_sender_racing_each_event_taken_once(arming_threads, db_url):
    app, threads = arming_threads
    for trial in range(TRIALS):
        answers, ids = racing_arms(app, threads, trial, sender=True)
        assert answers[0] == "stored" and answers[1] in ("stored", "woke"), answers
        taken = sorted(opened_rows(rows(
            db_url, "SELECT e.payload #>> '{}', t.execution_id::text FROM konduit_events e "
                    "JOIN konduit_tasks t ON t.id = e.consumed_by WHERE e.key = %s", f"r{trial}")))
        # Two events, two waiters: each event taken by exactly one, each waiter took one.
        assert [p for p, _ in taken] == ["first", "second"], taken
        assert sorted(e for _, e in taken) == sorted(ids)
        until(lambda ids=ids: value(db_url, "SELECT count(*) FROM konduit_executions WHERE "
                                            "id = ANY(%s::uuid[]) AND status = 'succeeded'",
                                    ids) == 2, what="both executions to finish")
        assert value(db_url, "SELECT count(*) FROM konduit_events WHERE key = %s "
                             "AND consumed_by IS NULL", f"r{trial}") == 0


def test_stored_events_are_counted_in_stats_the_metrics_and_the_dashboard(make_app, db_url):
    import httpx

    from konduit.observe.metrics import KonduitCollector
    from konduit.web import create_app, database_client
    from tests.support.browser import serving
    from tests.test_cli import konduit_cli

    app = make_app(approval_workflow(retention="2h"))
    for key in ("a", "b"):
        assert app.send_event("approved", key=key) == "stored"
    shown = konduit_cli("stats", "--json", "--database-url", db_url)
    assert shown.returncode == 0, shown.stderr
    [stored] = json.loads(shown.stdout)["stored_events"]
    assert (stored["name"], stored["events"]) == ("approved", 2)
    assert stored["next_expiry"] is not None
    collector = KonduitCollector(db_url)
    try:
        families = {f.name: f for f in collector.collect()}
    finally:
        collector.close()
    assert [(s.labels, s.value) for s in families["konduit_events_stored"].samples] \
        == [({"event": "approved"}, 2.0)]
    with serving(create_app(database_client(db_url))) as base, \
            httpx.Client(base_url=base) as http:
        page = http.get("/stats")
        assert page.status_code == 200
        assert '<table class="stored-events">' in page.text
        assert "<td>approved</td><td class=\"num\">2</td>" in page.text
        assert http.get("/api/v1/stats").json()["stored_events"][0]["events"] == 2


def test_the_cli_says_when_nothing_waits_and_how_long_the_event_is_kept(make_app, db_url):
    """`konduit send-event` for a key nothing waits for (a mistyped order id, say) is not a
    success: it says the event is kept and until when (its retention), with exit code 4;
    `woke`/`started` stay 0 and `no match` 3."""
    from datetime import UTC, datetime, timedelta

    from tests.test_cli import konduit_cli

    app = make_app(approval_workflow(retention="2h"))
    assert app.send_event("approved", key="registers-it") == "stored"  # registered in the db
    sent = konduit_cli("send-event", "approved", "--key", "order-1O7", "--database-url", db_url)
    assert sent.returncode == 4, (sent.stdout, sent.stderr)
    line = " ".join(sent.stdout.split())
    assert line.startswith("stored: nothing waits for this event now; it is kept until "), line
    assert "UTC (in 1h59m" in line or "UTC (in 2h00m" in line, line
    as_json = konduit_cli("send-event", "approved", "--key", "order-1O8", "--json",
                          "--database-url", db_url)
    assert as_json.returncode == 4, as_json.stderr
    out = json.loads(as_json.stdout)
    assert (out["event"], out["key"], out["result"]) == ("approved", "order-1O8", "stored")
    kept = datetime.fromisoformat(out["kept_until"]) - datetime.now(UTC)
    assert timedelta(hours=1, minutes=58) < kept <= timedelta(hours=2)
    assert [k for k, _, _ in events(db_url)] == ["registers-it", "order-1O7", "order-1O8"]
