"""Durable waits: event steps (docs/durable-waits.md), on real PostgreSQL with real workers."""

from __future__ import annotations

import json
import threading
import time
from uuid import UUID

import psycopg
import pytest

import konduit
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

FAST = {"poll_interval": 0.1, "maintenance_interval": 0.3}


def review_workflow(deadline: str = "30s", name: str = "review-flow") -> konduit.Workflow:
    """Seed 004: a human review of a translation, with the machine translation as fallback."""
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def translate(ctx):
        return {"de": "maschinell", "episode": ctx.input["episode"]}

    review = wf.wait_for_event(
        "translation-approved", name="review", after=[translate],
        key=lambda ctx: f"episode-{ctx.upstream['translate']['episode']}",
        deadline=deadline, fallback=lambda ctx: {"de": ctx.upstream["translate"]["de"],
                                                 "by": "machine"})

    @wf.step(after=[review])
    def publish(ctx):
        return {"text": ctx.upstream["review"], "outcome": ctx.outcomes["review"]}

    return wf


def task_row(url: str, execution_id: UUID, step: str) -> tuple[object, ...]:
    """(status, wait_kind, wait_event, wait_key, worker_id) of a step's task; (None,) before
    the step has a task."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, wait_kind, wait_event, wait_key, worker_id FROM konduit_tasks "
            "WHERE execution_id = %s AND step = %s", (execution_id, step)).fetchone()
    return (None,) if row is None else tuple(row)


def wait_status(url: str, execution_id: UUID, step: str, status: str, timeout: float = 20
                ) -> tuple[object, ...]:
    end = time.monotonic() + timeout
    while True:
        row = task_row(url, execution_id, step)
        if row[0] == status:
            return row
        if time.monotonic() > end:
            raise AssertionError(f"{step} is {row[0]}, not {status}")
        time.sleep(0.05)


def test_an_approval_at_one_second_wakes_the_join(make_app, db_url):
    app = make_app(review_workflow())
    with running_worker(app, **FAST):
        handle = app.start("review-flow", input={"episode": 42})
        row = wait_status(db_url, handle.id, "review", "waiting")
        assert row[1:4] == ("event", "translation-approved", "episode-42")
        time.sleep(1.0)
        assert app.send_event("translation-approved", key="episode-42",
                              payload={"de": "menschlich", "by": "ana"}) == "woke"
        result = handle.wait(timeout=20)
    assert result.status == "succeeded"
    assert result.output == {"text": {"de": "menschlich", "by": "ana"}, "outcome": "succeeded"}
    # Consumed once: a second approval changes nothing for the ended step. Sent by key it is
    # kept for an execution yet to come (one more may wait for that key); sent to this
    # execution, nothing could take it.
    assert app.send_event("translation-approved", key="episode-42", payload={"by": "bo"}) \
        == "stored"
    assert app.send_event("translation-approved", execution_id=handle.id) == "no match"
    assert app.status(handle.id).output["text"] == {"de": "menschlich", "by": "ana"}


def test_an_approval_after_the_deadline_is_refused_and_the_fallback_stands(make_app, db_url):
    app = make_app(review_workflow(deadline="1s"))
    with running_worker(app, deadline_grace=0.2, **FAST):
        handle = app.start("review-flow", input={"episode": 7})
        wait_status(db_url, handle.id, "review", "degraded")
        result = handle.wait(timeout=20)
        # Sent to this execution: refused. Sent by key: kept for an execution yet to come,
        # never for this one's ended step.
        assert app.send_event("translation-approved", execution_id=handle.id,
                              payload={"by": "late"}) == "no match"
        assert app.send_event("translation-approved", key="episode-7",
                              payload={"by": "late"}) == "stored"
    assert result.status == "succeeded"
    assert result.output == {"text": {"de": "maschinell", "by": "machine"}, "outcome": "degraded"}
    assert app.status(handle.id).output == result.output
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*), count(consumed_by) FROM konduit_events"
                            ).fetchone() == (1, 0)


def test_an_event_late_before_the_sweep_ended_the_task_changes_nothing(make_app, db_url):
    """Past the deadline but before any sweep ended the task (no worker runs: a waiting task
    gets no grace, a running sweep ends it at its deadline): not taken by it, since the deadline
    is checked in the statement that would accept it (sent by key it is kept for an execution
    yet to come, never for a task that already waits); the next worker's sweep degrades it."""
    app = make_app(review_workflow(deadline="1s"))
    with running_worker(app, **FAST):
        handle = app.start("review-flow", input={"episode": 8})
        wait_status(db_url, handle.id, "review", "waiting")
    time.sleep(1.3)
    assert task_row(db_url, handle.id, "review")[0] == "waiting"
    outcome = app.send_event("translation-approved", key="episode-8", payload={"by": "x"})
    assert outcome == "stored"
    assert task_row(db_url, handle.id, "review")[0] == "waiting"
    with running_worker(app, **FAST):
        result = handle.wait(timeout=20)
    assert result.outcomes["review"] == "degraded"
    assert result.output["text"]["by"] == "machine"


def test_an_event_sent_before_the_step_waits_is_kept_and_consumed(make_app, db_url):
    app = make_app(review_workflow())
    handle = app.start("review-flow", input={"episode": 9})
    assert app.send_event("translation-approved", key="episode-9", payload={"by": "early"}) \
        == "stored"
    assert app.send_event("no-such-event", key="episode-9") == "no match"
    with running_worker(app, **FAST):
        result = handle.wait(timeout=20)
    assert result.output == {"text": {"by": "early"}, "outcome": "succeeded"}
    with psycopg.connect(db_url) as conn:
        consumed = conn.execute(
            "SELECT consumed_by IS NOT NULL FROM konduit_events").fetchall()
    assert consumed == [(True,)]


def test_two_racing_events_wake_the_task_exactly_once(make_app, db_url):
    app = make_app(review_workflow())
    with running_worker(app, **FAST):
        handle = app.start("review-flow", input={"episode": 5})
        wait_status(db_url, handle.id, "review", "waiting")
        barrier = threading.Barrier(2)
        answers: list[str] = []

        def send(who: str) -> None:
            barrier.wait()
            answers.append(app.send_event("translation-approved", key="episode-5",
                                          payload={"by": who}))

        threads = [threading.Thread(target=send, args=(who,)) for who in ("ana", "bo")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result = handle.wait(timeout=20)
    # The loser finds the step ended: it is kept for an execution yet to come, never taken by
    # this one.
    assert sorted(answers) == ["stored", "woke"]
    assert result.output["text"]["by"] in ("ana", "bo")
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*), count(consumed_by) FROM konduit_events"
                            ).fetchone() == (2, 1)
        assert conn.execute("SELECT count(*) FROM konduit_outputs o JOIN konduit_tasks t "
                            "ON t.execution_id = o.execution_id AND t.step = o.step "
                            "WHERE t.step = 'review'").fetchone() == (1,)


def _exit(ctx):
    raise SystemExit("a key that exits the process")  # BaseException: hostile user code


@pytest.mark.parametrize("key, says", [(lambda ctx: ctx.input["missing"], "missing"),
                                       (_exit, "SystemExit")])
def test_a_raising_key_fails_the_attempt_not_the_worker(make_app, key, says):
    wf = konduit.Workflow("bad-key", version=1)
    wf.wait_for_event("approved", name="review", key=key, retry=konduit.Retry(max_attempts=1))
    ok = konduit.Workflow("fine", version=1)

    @ok.step()
    def hello(ctx):
        return "hi"

    app = make_app(wf, ok)
    with running_worker(app, **FAST):
        bad = app.start("bad-key", input={})
        with pytest.raises(konduit.ExecutionFailed) as failed:
            bad.wait(timeout=20)
        assert says in (failed.value.result.error or "")
        assert app.start("fine").wait(timeout=20).output == "hi"  # the worker runs on


def test_send_event_refuses_bad_input(make_app):
    app = make_app(review_workflow())
    with pytest.raises(konduit.KonduitError, match="key= or execution_id="):
        app.send_event("translation-approved")
    with pytest.raises(konduit.KonduitError, match="invalid event name"):
        app.send_event("", key="x")
    with pytest.raises(konduit.KonduitError):
        app.send_event("translation-approved", key="x", payload={"bad": object()})


def test_cli_status_shows_what_a_step_waits_for_and_send_event_wakes_it(make_app, db_url):
    from tests.test_cli import assert_clean_error, konduit_cli

    # A deadline far off: four CLI processes can take 30 s on a loaded machine, and a send past
    # the deadline is (rightly) not taken by the step.
    app = make_app(review_workflow(deadline="10m"))
    with running_worker(app, **FAST):
        handle = app.start("review-flow", input={"episode": 11})
        wait_status(db_url, handle.id, "review", "waiting")
        shown = konduit_cli("status", str(handle.id), "--database-url", db_url)
        assert shown.returncode == 0, shown.stderr
        assert "waiting review: event 'translation-approved' key 'episode-11'" in shown.stdout
        as_json = json.loads(konduit_cli("status", str(handle.id), "--json",
                                         "--database-url", db_url).stdout)
        assert as_json["waiting"][0]["key"] == "episode-11"
        # Without --app the CLI accepts it; the worker's maintenance completes the task.
        sent = konduit_cli("send-event", "translation-approved", "--key", "episode-11",
                           "--payload", '{"by": "cli"}', "--database-url", db_url)
        assert (sent.returncode, sent.stdout.strip()) == (0, "woke"), sent.stderr
        assert handle.wait(timeout=20).output == {"text": {"by": "cli"}, "outcome": "succeeded"}
    again = konduit_cli("send-event", "translation-approved", "--execution-id", str(handle.id),
                        "--database-url", db_url)
    assert (again.returncode, again.stdout.strip()) == (3, "no match")
    assert_clean_error(konduit_cli("send-event", "translation-approved", "--payload", "{",
                                   "--key", "k", "--database-url", db_url), "--payload")
    assert_clean_error(konduit_cli("send-event", "translation-approved",
                                   "--database-url", db_url), "key= or execution_id=")


def test_waiting_tasks_are_a_metric(make_app, db_url):
    from konduit.observe.metrics import KonduitCollector

    app = make_app(review_workflow())
    with running_worker(app, **FAST):
        handle = app.start("review-flow", input={"episode": 12})
        wait_status(db_url, handle.id, "review", "waiting")
        collector = KonduitCollector(db_url)
        try:
            families = {f.name: f for f in collector.collect()}
        finally:
            collector.close()
    samples = {s.labels["kind"]: s.value for s in families["konduit_tasks_waiting"].samples}
    assert samples == {"event": 1.0, "timer": 0.0, "child": 0.0}
