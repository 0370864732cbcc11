"""Webhooks (docs/webhooks.md): the outbox is written with the terminal state and only then;
without a webhook the finish path sends no statement more; deliveries are signed, retried once
per failure, refused for internal addresses with nothing sent, listed, counted and pruned. Real
PostgreSQL, a real worker thread, a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import konduit
from konduit.core.webhooks import EVENTS, encode_body, retry_delay, signature, verify
from konduit.db.connect import open_database
from konduit.engine.alerting import AlertChange, alert_changed
from konduit.engine.finish import finish_execution
from konduit.observe.metrics import webhook_family
from konduit.records import AlertRecord
from tests.support.db import rows
from tests.support.waiting import until
from tests.support.webhooks import receiver
from tests.support.workers import running_worker
from tests.test_cli import konduit_cli
from tests.test_start_many import counted

SECRET = "s3cret-for-tests"


def one_step(name: str = "hooked") -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def only(ctx: Any) -> str:
        return "done"

    return wf


def waiting(name: str = "parked") -> konduit.Workflow:
    """A workflow that no worker runs in these tests: its executions stay running until
    cancelled (a finish the test controls)."""
    return one_step(name)


def deliveries(db_url: str) -> list[tuple[Any, ...]]:
    return rows(db_url, "SELECT id, event, status, attempts, last_error, execution_id, body "
                        "FROM konduit_webhook_deliveries ORDER BY created_at, event")


# -- pure parts -----------------------------------------------------------------------------------

def test_webhook_settings_are_checked_and_the_secret_never_shows() -> None:
    hook = konduit.Webhook("https://hooks.example.com/k", secret="hunter2")
    assert hook.events == ("execution.finished",) and hook.port == 443
    assert "hunter2" not in repr(hook) and len(hook.subscription_id) == 32
    for url, needle in (("ftp://h/x", "only http and https"), ("http:///x", "no host"),
                        ("https://u:p@h/x", "credentials"), ("http://h:99999/", "invalid port")):
        with pytest.raises(konduit.KonduitError, match=needle):
            konduit.Webhook(url, secret="x")
    with pytest.raises(konduit.KonduitError, match=r"unknown event 'execution\.done'"):
        konduit.Webhook("https://h/", events=["execution.done"], secret="x")
    with pytest.raises(konduit.KonduitError, match="not the string"):
        konduit.Webhook("https://h/", events="alert.raised", secret="x")
    with pytest.raises(konduit.KonduitError, match="secret"):
        konduit.Webhook("https://h/", secret="")
    with pytest.raises(konduit.KonduitError, match="configured twice"):
        konduit.App([], webhooks=[konduit.Webhook("https://h/", secret="x"),
                                  konduit.Webhook("https://h/", secret="x")])


def test_signature_verifies_and_tampering_or_age_fails() -> None:
    body = encode_body("execution.finished", "d-1", {"status": "succeeded"})
    header = signature(SECRET, 1_700_000_000, body)
    assert header.startswith("t=1700000000,v1=")
    assert verify(SECRET, header, body, now=1_700_000_010)
    assert not verify(SECRET, header, body + b" ", now=1_700_000_010)
    assert not verify("other", header, body, now=1_700_000_010)
    assert not verify(SECRET, header, body, now=1_700_000_000 + 3600)


def test_backoff_starts_within_seconds_and_is_capped_at_an_hour() -> None:
    assert retry_delay(1, jitter=0) == 2.0 and retry_delay(2, jitter=0) == 4.0
    assert retry_delay(30, jitter=0.1) == 3600.0


# -- storage ----------------------------------------------------------------------------------------

@pytest.mark.storage
def test_a_failed_delivery_is_retried_exactly_once_with_a_valid_signature(make_app, db_url):
    with receiver([500]) as hook_receiver:
        app = make_app(one_step(), webhooks=[konduit.Webhook(
            hook_receiver.url, secret=SECRET, allow_private=True, timeout=5)])
        with running_worker(app, concurrency=2):
            handle = app.start("hooked")
            handle.wait(timeout=30)
            got = hook_receiver.wait_for(2, timeout=30)
            until(lambda: app.webhook_deliveries(status="delivered"), 30, "a delivered webhook")
            time.sleep(1.5)  # room for a wrong third request to show up
        assert len(hook_receiver.requests) == 2
    first, second = got
    assert first.headers["Konduit-Delivery"] == second.headers["Konduit-Delivery"]
    assert first.body == second.body  # the same event, byte for byte
    for request in got:
        assert verify(SECRET, request.headers["Konduit-Signature"], request.body, now=time.time())
        assert request.headers["Konduit-Event"] == "execution.finished"
        assert request.path == "/hooks/konduit"
    payload = json.loads(second.body)
    assert payload["event"] == "execution.finished"
    assert payload["delivery_id"] == second.headers["Konduit-Delivery"]
    assert payload["execution_id"] == str(handle.id)
    assert (payload["workflow"], payload["version"], payload["status"]) == ("hooked", 1, "succeeded")
    assert payload["outcomes"] == {"only": "succeeded"}
    assert datetime.fromisoformat(payload["finished_at"]) <= datetime.now(UTC)
    (row,) = app.webhook_deliveries()
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 2, 200)
    assert row.last_error == "HTTP 500 Internal Server Error"


@pytest.mark.storage
def test_a_loopback_receiver_is_refused_and_sent_nothing(make_app, db_url):
    with receiver() as hook_receiver:
        app = make_app(one_step(), webhooks=[konduit.Webhook(hook_receiver.url, secret=SECRET)])
        with running_worker(app, concurrency=2):
            app.start("hooked").wait(timeout=30)
            (row,) = until(lambda: app.webhook_deliveries(status="refused"), 30, "a refused webhook")
        assert hook_receiver.requests == []
    assert row.attempts == 1
    assert "127.0.0.1 (loopback)" in row.last_error and "allow_private" in row.last_error


@pytest.mark.storage
def test_the_outbox_row_is_written_iff_the_finish_commits(make_app, db_url):
    hook = konduit.Webhook("https://hooks.example.com/k", secret=SECRET,
                           events=("execution.finished", "alert.raised"))
    app = make_app(waiting(), webhooks=[hook])
    eid = app.start("parked").id  # registers the webhook; the execution waits

    async def finish(commit: bool) -> None:
        db = await open_database(db_url, max_size=1)
        try:
            with pytest.raises(RuntimeError) if not commit else _nothing():
                async with db.transaction() as tx:
                    row = await tx.one("execution_lock", id=eid)
                    assert row is not None
                    assert await finish_execution(tx, eid, "cancelled", None, "test",
                                                  row["steps_pending"])
                    if not commit:
                        raise RuntimeError("roll it back")
        finally:
            await db.close()

    asyncio.run(finish(commit=False))
    assert deliveries(db_url) == []
    assert app.status(eid).status == "running"
    asyncio.run(finish(commit=True))
    (row,) = deliveries(db_url)
    assert (row[1], row[2], row[5]) == ("execution.finished", "pending", eid)
    assert row[6]["status"] == "cancelled"
    assert not app.cancel(eid)  # finishing again is refused: still one event
    assert len(deliveries(db_url)) == 1


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.storage
def test_finishing_costs_the_same_statements_with_or_without_webhooks(make_app, db_url):
    plain = make_app(waiting("plain"))
    hooked = make_app(waiting("hooked-wait"), webhooks=[konduit.Webhook(
        "https://hooks.example.com/k", secret=SECRET)])
    calls: list[Counter[str]] = []
    ended = []
    for app, name in ((plain, "plain"), (hooked, "hooked-wait")):  # no webhook registered yet,
        eid = app.start(name).id                                   # then one
        with counted() as made:
            assert app.cancel(eid)
        calls.append(made)
        ended.append(eid)
    # Without a webhook: no webhook statement at all. With one: that finish's outbox insert,
    # and otherwise the same statements, the same number of each.
    assert not any("webhook" in name for name in calls[0])
    assert calls[0]["execution_finish_if_running"] == 1
    assert calls[1] - calls[0] == Counter({"webhook_delivery_insert_for_execution_if_finished": 1})
    assert calls[0] - calls[1] == Counter()
    # ... and only the execution ended while a webhook was registered has an outbox row.
    assert [r[5] for r in deliveries(db_url)] == [ended[1]]


@pytest.mark.storage
def test_a_run_with_no_webhooks_sends_no_webhook_statement(make_app, db_url):
    app = make_app(one_step())
    with counted() as made, running_worker(app, concurrency=2):
        for _ in range(3):
            app.start("hooked").wait(timeout=30)
    assert made["execution_finish_if_running"] == 3
    assert not any("webhook" in name for name in made)
    assert deliveries(db_url) == []


@pytest.mark.storage
def test_degraded_executions_raise_their_own_event(make_app, db_url):
    wf = konduit.Workflow("optional", version=1)

    @wf.step()
    def start(ctx: Any) -> int:
        return 1

    @wf.step(after=[start], required=False, retry=konduit.Retry(max_attempts=1), deadline="10s")
    def flaky(ctx: Any) -> int:
        raise konduit.NonRetryableError("no")

    @wf.step(after=[start])
    def solid(ctx: Any) -> int:
        return 2

    @wf.step(after=[flaky, solid], join=konduit.Join.required())
    def publish(ctx: Any) -> str:
        return "out"

    app = make_app(wf, one_step(), webhooks=[konduit.Webhook(
        "https://hooks.example.com/k", events=("execution.degraded",), secret=SECRET)])
    with running_worker(app, concurrency=2):
        degraded = app.start("optional")
        clean = app.start("hooked")
        assert degraded.wait(timeout=30).status == clean.wait(timeout=30).status == "succeeded"
    assert app.status(degraded.id).outcomes["flaky"] == "failed"
    assert [(r[1], r[5]) for r in deliveries(db_url)] == [("execution.degraded", degraded.id)]


@pytest.mark.storage
def test_alert_changes_write_deliveries_in_their_transaction(make_app, db_url):
    app = make_app(one_step(), webhooks=[konduit.Webhook(
        "https://hooks.example.com/k", events=("alert.raised",), secret=SECRET)])
    app.list()  # registers the webhook
    now = datetime.now(UTC)
    alert = AlertRecord(id=41, kind="no_success", subject="hooked", workflow="hooked",
                        severity="warning", message="no success", details={"hours": 3},
                        raised_at=now, last_seen_at=now)

    async def change(event: str) -> None:
        db = await open_database(db_url, max_size=1)
        try:
            async with db.transaction() as tx:
                await alert_changed(tx, AlertChange(event, alert))  # type: ignore[arg-type]
        finally:
            await db.close()

    asyncio.run(change("raised"))
    asyncio.run(change("resolved"))  # not subscribed
    asyncio.run(change("raised"))  # the same raise twice: one delivery
    (row,) = deliveries(db_url)
    assert row[1] == "alert.raised" and row[6]["kind"] == "no_success"
    assert row[6]["alert_id"] == 41 and row[6]["details"] == {"hours": 3}


@pytest.mark.storage
def test_prune_deletes_old_ended_deliveries_and_keeps_pending_ones(make_app, db_url):
    app = make_app(waiting(), webhooks=[konduit.Webhook("https://hooks.example.com/k",
                                                        secret=SECRET)])
    for _ in range(3):
        app.cancel(app.start("parked").id)
    ids = [r[0] for r in deliveries(db_url)]
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE konduit_webhook_deliveries SET created_at = now() - interval '10 days'")
        conn.execute("UPDATE konduit_webhook_deliveries SET status = 'delivered', "
                     "delivered_at = now() WHERE id = %s", (ids[0],))
        conn.execute("UPDATE konduit_webhook_deliveries SET status = 'failed' WHERE id = %s",
                     (ids[1],))
    app.prune(older_than="7d")
    assert [r[0] for r in deliveries(db_url)] == [ids[2]]  # the pending one stays
    families = {s.labels["status"]: s.value for s in webhook_family(
        rows_as_dicts(db_url, "SELECT status, count(*) AS deliveries "
                              "FROM konduit_webhook_deliveries GROUP BY status")).samples}
    assert families == {"pending": 1, "delivered": 0, "failed": 0, "refused": 0}


def rows_as_dicts(db_url: str, sql: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.storage
def test_cli_lists_deliveries_and_retries_a_failed_one(make_app, db_url):
    app = make_app(waiting(), webhooks=[konduit.Webhook("https://hooks.example.com/k",
                                                        events=EVENTS, secret=SECRET)])
    parked = app.start("parked").id
    app.cancel(parked)
    (delivery,) = deliveries(db_url)
    proc = konduit_cli("webhooks", "--json", "--database-url", db_url)
    assert proc.returncode == 0, proc.stderr
    (listed,) = json.loads(proc.stdout)
    # One execution's deliveries (by a piece of its id), as app.webhook_deliveries takes it.
    mine = konduit_cli("webhooks", "--json", "--execution", str(parked)[-8:],
                       "--database-url", db_url)
    assert json.loads(mine.stdout) == [listed]
    other = konduit_cli("webhooks", "--json", "--execution", str(app.start("parked").id),
                        "--database-url", db_url)
    assert json.loads(other.stdout) == []
    assert (listed["event"], listed["status"], listed["attempts"]) == \
        ("execution.finished", "pending", 0)
    assert listed["url"] == "https://hooks.example.com/k" and listed["next_attempt_at"]
    proc = konduit_cli("webhooks", "--retry", str(delivery[0]), "--database-url", db_url)
    assert proc.returncode == 1 and "nothing to retry" in proc.stdout
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE konduit_webhook_deliveries SET status = 'failed', attempts = 30, "
                     "last_error = 'HTTP 503'")
    proc = konduit_cli("webhooks", "--database-url", db_url)
    assert proc.returncode == 0 and "hooks.example.com" in proc.stdout and "HTTP 503" in proc.stdout
    proc = konduit_cli("webhooks", "--retry", str(delivery[0]), "--database-url", db_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = app.webhook_deliveries()
    assert (row.status, row.attempts) == ("pending", 0)
    with pytest.raises(konduit.KonduitError, match="unknown delivery status"):
        app.webhook_deliveries(status="lost")


@pytest.mark.storage
def test_the_dashboard_lists_deliveries(make_app, db_url):
    import httpx

    from konduit.web.app import create_app, database_client
    from tests.test_dashboard import serving

    app = make_app(waiting(), webhooks=[konduit.Webhook(
        "https://hooks.example.com/<b>k</b>", secret=SECRET)])
    eid = app.start("parked").id
    app.cancel(eid)
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        listed = http.get("/webhooks")
        assert listed.status_code == 200
        assert 'data-status="pending"' in listed.text and str(eid)[:8] in listed.text
        assert "<b>k</b>" not in listed.text and "&lt;b&gt;k&lt;/b&gt;" in listed.text
        assert 'id="no-deliveries"' in http.get("/webhooks?status=delivered").text
        bad = http.get("/webhooks?status=lost")
        assert bad.status_code == 400 and "unknown delivery status" in bad.text
