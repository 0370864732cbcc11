"""Events that start work (wf.on_event; docs/events.md), on real PostgreSQL: one execution per
event however often and however concurrently it is sent, debounce and batching exactly once
under racing senders and racing workers, hostile input=/key= code."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

import konduit
from konduit.db.database import Database
from konduit.db.sealing import configured as configured_payloads
from konduit.engine import starts, triggers
from konduit.engine.registry import Registry
from tests.support.db import rows, value
from tests.support.payloads import opened
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

FAST = {"poll_interval": 0.1, "maintenance_interval": 0.2}


def echo(name: str, event: str, **on_event: Any) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1)

    @wf.step()
    def only(ctx: konduit.Context) -> Any:
        return ctx.input

    wf.on_event(event, **on_event)
    return wf


def executions(url: str, workflow: str) -> list[Any]:
    """The inputs of the workflow's executions, oldest first (opened under a payload codec)."""
    return [opened(r[0]) for r in rows(url, "SELECT input FROM konduit_executions "
                                            "WHERE workflow_name = %s ORDER BY created_at, id",
                                       workflow)]


def trigger_events(url: str, workflow: str) -> list[tuple[Any, ...]]:
    # (the error opened: under a codec it is sealed, docs/payload-codecs.md)
    return [(*r[:3], opened(r[3])) for r in rows(
        url, "SELECT status, key, execution_id, error FROM konduit_trigger_events "
             "WHERE workflow_name = %s ORDER BY id", workflow)]


# -- definition ----------------------------------------------------------------------------------


def test_on_event_is_checked_when_it_is_declared():
    wf = konduit.Workflow("checked", version=1)

    @wf.step()
    def only(ctx: konduit.Context) -> None: ...

    for bad, words in [
        (lambda: wf.on_event("no spaces allowed"), "invalid event name"),
        (lambda: wf.on_event("a", input={"x": 1}), "input= must be callable"),
        (lambda: wf.on_event("a", key="id"), "key= must be callable"),
        (lambda: wf.on_event("a", debounce="soon"), "debounce"),
        (lambda: wf.on_event("a", debounce="0s"), "positive"),
        (lambda: wf.on_event("a", batch=100), "konduit.Batch"),
        (lambda: wf.on_event("a", debounce="1s", batch=konduit.Batch()), "exclude each other"),
    ]:
        with pytest.raises(konduit.WorkflowDefinitionError, match=words) as caught:
            bad()
        assert "'checked'" in str(caught.value)
    with pytest.raises(konduit.KonduitError, match="max"):
        konduit.Batch(max=0)
    with pytest.raises(konduit.KonduitError, match="window"):
        konduit.Batch(window="-1s")
    wf.on_event("a")
    with pytest.raises(konduit.WorkflowDefinitionError, match="declared twice"):
        wf.on_event("a")
    wf.compile()
    with pytest.raises(konduit.WorkflowDefinitionError, match="after the workflow was compiled"):
        wf.on_event("b")
    assert [t.event for t in wf.triggers] == ["a"]


# -- one execution per event ---------------------------------------------------------------------


def test_an_event_starts_one_execution_and_a_resent_one_nothing_new(make_app, db_url):
    wf = echo("upload-flow", "doc.uploaded", input=lambda e: {"doc": e["id"]},
              key=lambda e: e["id"])
    app = make_app(wf)
    assert app.send_event("doc.uploaded", payload={"id": "d1"}) == "started"
    assert app.send_event("doc.uploaded", payload={"id": "d1", "again": True}) == "started"
    assert app.send_event("doc.uploaded", payload={"id": "d2"}) == "started"
    assert executions(db_url, "upload-flow") == [{"doc": "d1"}, {"doc": "d2"}]
    recorded = trigger_events(db_url, "upload-flow")
    assert [(s, k) for s, k, _, _ in recorded] == [("started", "d1")] * 2 + [("started", "d2")]
    assert recorded[0][2] == recorded[1][2] != recorded[2][2]
    # An event no trigger and no step takes, without a key, is refused as before.
    with pytest.raises(konduit.KonduitError, match="needs key= or execution_id="):
        app.send_event("nothing.listens", payload={})
    with running_worker(app, **FAST):
        assert app.list(workflow="upload-flow")[0].id is not None
        until(lambda: {r.status for r in app.list(workflow="upload-flow")} == {"succeeded"},
              what="both executions succeeded")


def test_the_key_an_event_is_sent_with_names_it_when_the_trigger_has_no_key(make_app, db_url):
    app = make_app(echo("keyed-by-sender", "order.paid"))
    for _ in range(3):
        assert app.send_event("order.paid", key="o-1", payload={"n": 1}) == "started"
    assert app.send_event("order.paid", payload={"n": 2}) == "started"  # no key: always new
    assert app.send_event("order.paid", payload={"n": 2}) == "started"
    assert executions(db_url, "keyed-by-sender") == [{"n": 1}, {"n": 2}, {"n": 2}]


def test_an_event_sent_five_times_at_once_starts_exactly_one_execution(make_app, db_url):
    """Five senders (threads, each its own App and connections) released together by a
    barrier send the same event, trial after trial: each event starts one execution."""
    wf = echo("racing-upload", "doc.raced", key=lambda e: e["id"])
    senders, trials = 5, 25
    apps = [make_app(wf) for _ in range(senders)]
    apps[0].send_event("doc.raced", payload={"id": "warm"})  # registered before the race
    barrier = threading.Barrier(senders)
    answers: list[str] = []
    errors: list[BaseException] = []

    def send(app: konduit.App) -> None:
        try:
            for trial in range(trials):
                barrier.wait(timeout=60)
                answers.append(app.send_event("doc.raced", payload={"id": f"t{trial}"}))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=send, args=(a,)) for a in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert answers == ["started"] * senders * trials
    per_key = Counter(e["id"] for e in executions(db_url, "racing-upload"))
    assert per_key == Counter({f"t{i}": 1 for i in range(trials)} | {"warm": 1})
    assert value(db_url, "SELECT count(*) FROM konduit_trigger_events WHERE status = 'started' "
                         "AND workflow_name = 'racing-upload'") == senders * trials + 1


def test_a_sender_without_the_code_leaves_the_mapping_to_a_worker(make_app, db_url):
    wf = echo("codeless-flow", "doc.scanned", input=lambda e: {"pages": e["pages"] * 2},
              key=lambda e: e["id"])
    app = make_app(wf)
    app.send_event("doc.scanned", payload={"id": "warm", "pages": 0})  # registers it
    with konduit.Client(db_url) as client:
        for _ in range(3):  # resent: one execution all the same
            assert client.send_event("doc.scanned", payload={"id": "s1", "pages": 4}) == "started"
    assert [s for s, *_ in trigger_events(db_url, "codeless-flow")] == ["started"] + ["pending"] * 3
    with running_worker(app, **FAST) as w:
        w.wait_for_passes("triggers")
    assert executions(db_url, "codeless-flow") == [{"pages": 0}, {"pages": 8}]
    assert [(s, k) for s, k, *_ in trigger_events(db_url, "codeless-flow")] == \
        [("started", "warm")] + [("started", "s1")] * 3


def test_hostile_trigger_code_fails_its_event_only(make_app, db_url):
    def hostile(e: dict[str, Any]) -> Any:
        if e.get("bad"):
            raise SystemExit("gave up")
        return e

    wf = echo("hostile-flow", "risky.thing", input=hostile)
    app = make_app(wf)
    with pytest.raises(konduit.TriggerCodeFailed, match=r"input= raised SystemExit: gave up"):
        app.send_event("risky.thing", payload={"bad": True})
    assert app.send_event("risky.thing", payload={"bad": False}) == "started"
    # A key= that returns what cannot be a key is named too.
    keyed = echo("bad-key-flow", "risky.key", key=lambda e: {"not": "text"})
    with pytest.raises(konduit.TriggerCodeFailed, match="key= must return text"):
        make_app(keyed).send_event("risky.key", payload={})
    # Through a worker (a sender without the code): the event is recorded failed, the worker
    # lives on and applies the next event.
    with konduit.Client(db_url) as client:
        assert client.send_event("risky.thing", payload={"bad": True}) == "started"
        assert client.send_event("risky.thing", payload={"bad": False, "n": 2}) == "started"
    with running_worker(app, **FAST) as w:
        w.wait_for_passes("triggers")
        w.wait_for_passes("maintenance")
    statuses = [(s, e) for s, _, _, e in trigger_events(db_url, "hostile-flow")]
    assert [s for s, _ in statuses] == ["failed", "started", "failed", "started"]
    assert "input= raised SystemExit: gave up" in str(statuses[2][1])
    assert executions(db_url, "hostile-flow") == [{"bad": False}, {"bad": False, "n": 2}]


def test_trigger_code_that_never_returns_fails_its_event_and_the_worker_runs_on(
        make_app, db_url, monkeypatch):
    monkeypatch.setattr(triggers, "TRIGGER_CODE_SECONDS", 0.5)
    monkeypatch.setattr(starts, "START_CODE_SECONDS", 0.5)
    release = threading.Event()

    def stuck_key(e: dict[str, Any]) -> str:
        if e.get("stuck"):
            release.wait(120)  # far beyond the test: only the time limit ends the wait here
        return str(e["id"])

    wf = echo("stuck-flow", "slow.thing", key=stuck_key)
    other = echo("other-flow", "unused.event")
    # The start an event makes runs the workflow's own code too (here its fair_by=).
    fair = konduit.Workflow("stuck-fair", version=1,
                            fair_by=lambda i: str(stuck_key(i)))
    fair.step(name="only")(lambda ctx: ctx.input)
    fair.on_event("fair.thing")
    app = make_app(wf, other, fair)
    try:
        # A sender with the code is told, after the limit, not after the code returns.
        with pytest.raises(konduit.TriggerCodeFailed, match=r"key= did not return within 0.5 s"):
            app.send_event("slow.thing", payload={"id": "a", "stuck": True})
        # Through a worker (a sender without the code): the stuck event fails, the next one
        # starts, and the worker's loop keeps running other work while the code still blocks.
        with konduit.Client(db_url) as client:
            assert client.send_event("slow.thing", payload={"id": "b", "stuck": True}) == "started"
            assert client.send_event("slow.thing", payload={"id": "c"}) == "started"
            assert client.send_event("fair.thing", payload={"id": "d", "stuck": True}) \
                == "started"
        with running_worker(app, **FAST) as w:
            w.wait_for_passes("triggers")
            handle = app.start("other-flow", {"n": 1})
            assert handle.wait(timeout=30).status == "succeeded"
            until(lambda: [s for s, *_ in trigger_events(db_url, "stuck-flow")]
                  == ["failed", "failed", "started"], timeout=30)
            until(lambda: [s for s, *_ in trigger_events(db_url, "stuck-fair")] == ["failed"],
                  timeout=30)
        assert not release.is_set()  # both stuck calls were still blocked: nothing waited for them
        errors = [e for *_, e in trigger_events(db_url, "stuck-flow")]
        assert "key= did not return within 0.5 s" in str(errors[1])
        assert executions(db_url, "stuck-flow") == [{"id": "c"}]
        [(*_, fair_error)] = trigger_events(db_url, "stuck-fair")
        assert "the start of workflow 'stuck-fair': its input checks and key functions did " \
               "not return within 0.5 s" in fair_error
        assert executions(db_url, "stuck-fair") == []
    finally:
        release.set()


def test_an_input_the_workflow_refuses_fails_the_event_with_its_error(make_app, db_url):
    wf = konduit.Workflow("typed-flow", version=1, input={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})

    @wf.step()
    def only(ctx: konduit.Context) -> None: ...

    wf.on_event("typed.thing")
    app = make_app(wf)
    with pytest.raises(konduit.TriggerCodeFailed, match="n"):
        app.send_event("typed.thing", payload={"m": 1})
    assert app.send_event("typed.thing", payload={"n": 1}) == "started"
    assert [s for s, *_ in trigger_events(db_url, "typed-flow")] == ["failed", "started"]


# -- debounce and batching -----------------------------------------------------------------------


def test_a_burst_starts_one_execution_with_its_last_event(make_app, db_url):
    wf = echo("debounce-flow", "doc.edited", key=lambda e: e["doc"], debounce="0.5s")
    app = make_app(wf)
    for i in range(5):
        assert app.send_event("doc.edited", payload={"doc": "a", "v": i}) == "started"
        assert app.send_event("doc.edited", payload={"doc": "b", "v": i}) == "started"
    assert executions(db_url, "debounce-flow") == []  # nothing before the burst ends
    with running_worker(app, **FAST):
        until(lambda: len(executions(db_url, "debounce-flow")) == 2, what="two bursts started")
        # The next burst of a key is a new execution.
        app.send_event("doc.edited", payload={"doc": "a", "v": 9})
        until(lambda: len(executions(db_url, "debounce-flow")) == 3, what="a second burst")
    assert sorted((e["doc"], e["v"]) for e in executions(db_url, "debounce-flow")) == \
        [("a", 4), ("a", 9), ("b", 4)]
    assert value(db_url, "SELECT count(*) FROM konduit_trigger_groups") == 0
    assert {s for s, *_ in trigger_events(db_url, "debounce-flow")} == {"started"}


def test_a_burst_is_due_its_debounce_after_its_last_event(make_app, db_url):
    wf = echo("debounce-timing", "doc.typed", debounce="2s")
    app = make_app(wf)
    app.send_event("doc.typed", payload=1)
    first = value(db_url, "SELECT due_at FROM konduit_trigger_groups")
    app.send_event("doc.typed", payload=2)
    [(due, last)] = rows(db_url, "SELECT due_at, last_event_at FROM konduit_trigger_groups")
    assert due > first
    assert (due - last).total_seconds() == pytest.approx(2.0)


def test_a_batch_starts_when_full_or_when_its_window_ends(make_app, db_url):
    wf = echo("batch-flow", "page.clicked", input=lambda e: e["n"],
              batch=konduit.Batch(max=4, window="0.5s"))
    app = make_app(wf)
    for n in range(10):
        assert app.send_event("page.clicked", payload={"n": n}) == "started"
    # Two full batches started in the senders' transactions; two events wait for the window.
    assert executions(db_url, "batch-flow") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with running_worker(app, **FAST):
        until(lambda: len(executions(db_url, "batch-flow")) == 3, what="the window's batch")
    assert executions(db_url, "batch-flow")[2] == [8, 9]


@pytest.mark.parametrize("mode", ["debounce", "batch"])
def test_racing_senders_and_racing_workers_start_each_group_once(make_app, db_url, mode):
    """Senders without the code (threads at a barrier) record events for 6 keys; then four
    maintenance passes race (threads at a barrier) to apply them and start the groups when
    due, trial after trial: every group starts exactly once, with every event of a batch."""
    option: dict[str, Any] = ({"debounce": "0.3s"} if mode == "debounce"
                              else {"batch": konduit.Batch(max=1000, window="0.3s")})
    wf = echo(f"race-{mode}", f"race.{mode}", key=lambda e: e["k"], **option)
    app = make_app(wf)
    app.send_event(f"race.{mode}", payload={"k": "warm", "i": -1})  # registers it
    registry = Registry([wf])
    racers, trials, keys = 4, 6, 6

    def send_burst(trial: int) -> None:
        barrier = threading.Barrier(racers)

        def send(r: int) -> None:
            with konduit.Client(db_url) as client:
                barrier.wait(timeout=60)
                for k in range(keys):
                    client.send_event(f"race.{mode}", payload={"k": f"{trial}-{k}", "i": r})

        threads = [threading.Thread(target=send, args=(r,)) for r in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def race_passes() -> None:
        barrier = threading.Barrier(racers)

        def run() -> None:
            async def go() -> None:
                db = Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
                await db.open()
                try:
                    barrier.wait(timeout=60)
                    await triggers.run_pass(db, registry)
                finally:
                    await db.close()
            asyncio.run(go())

        threads = [threading.Thread(target=run) for _ in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for trial in range(trials):
        send_burst(trial)
        race_passes()  # applies the events; the groups are not due yet
        assert value(db_url, "SELECT count(*) FROM konduit_trigger_events WHERE status = "
                             "'pending'") == 0, trigger_events(db_url, wf.name)
        until(lambda: value(db_url, "SELECT coalesce(bool_and(due_at < now()), true) "
                                    "FROM konduit_trigger_groups"),
              what="the groups are due")
        race_passes()
    race_passes()
    assert value(db_url, "SELECT count(*) FROM konduit_trigger_groups WHERE group_key <> 'warm'") == 0
    started = [e for e in executions(db_url, wf.name) if e != {"k": "warm", "i": -1}
               and e != [{"k": "warm", "i": -1}]]
    if mode == "debounce":
        per_key = Counter(e["k"] for e in started)
    else:
        per_key = Counter(batch[0]["k"] for batch in started)
        for batch in started:  # every event of the key, once
            assert sorted(e["i"] for e in batch) == list(range(racers)), batch
    assert per_key == Counter({f"{t}-{k}": 1 for t in range(trials) for k in range(keys)})
    assert value(db_url, "SELECT count(*) FROM konduit_trigger_events WHERE status <> 'started' "
                         "AND key <> 'warm'") == 0


def test_triggers_are_stored_with_the_registration_and_listed(make_app, db_url):
    wf = echo("listed-flow", "thing.happened", key=lambda e: e["id"], debounce="5s")
    app = make_app(wf)
    app.send_event("thing.happened", payload={"id": "x"})
    with psycopg.connect(db_url) as conn:
        [(event, spec)] = conn.execute(
            "SELECT event, spec FROM konduit_event_triggers WHERE workflow_name = 'listed-flow'"
        ).fetchall()
    assert event == "thing.happened"
    assert spec == {"mode": "debounce", "input": False, "keyed": True, "debounce_seconds": 5.0,
                    "batch_max": None, "batch_window_seconds": None}
    [listed] = app.triggers("listed-flow")
    assert (listed.event, listed.mode, listed.open_groups, listed.pending) == \
        ("thing.happened", "debounce", 1, 0)
    assert "debounced 5s" in listed.description
    assert listed.last_event_at is not None


def test_the_dashboard_and_the_api_show_a_workflows_triggers(make_app, db_url):
    import httpx

    from konduit.web import create_app, database_client
    from tests.support.browser import serving

    wf = echo("shown-flow", "shown.event", batch=konduit.Batch(max=50, window="1m"))
    app = make_app(wf)
    app.send_event("shown.event", payload={"n": 1})
    app.start("shown-flow", input=[])  # the stats page shows workflows that ran
    with serving(create_app(database_client(db_url))) as base, httpx.Client(base_url=base) as http:
        assert http.post("/api/v1/events", json={"name": "shown.event", "payload": {"n": 2}}
                         ).json() == {"result": "started"}
        page = http.get("/schedules").text
        assert 'data-event="shown.event"' in page and "shown-flow v1" in page
        assert "batched (at most 50 events, window 1m)" in page
        stats = http.get("/stats").text
        assert "Event triggers" in stats and 'data-event="shown.event"' in stats
        [listed] = [w for w in http.get("/api/v1/workflows").json() if w["name"] == wf.name]
        [trigger] = listed["triggers"]
        assert (trigger["event"], trigger["mode"], trigger["open_groups"], trigger["pending"]) \
            == ("shown.event", "batch", 1, 1)


def test_konduit_send_event_without_the_code_starts_a_workflow(make_app, db_url):
    from tests.test_cli import konduit_cli

    app = make_app(echo("cli-started", "cli.thing", key=lambda e: e["id"]))
    app.send_event("cli.thing", payload={"id": "warm"})  # registers it
    sent = konduit_cli("send-event", "cli.thing", "--payload", '{"id": "c1"}', "--json",
                       "--database-url", db_url)
    assert sent.returncode == 0, sent.stderr
    assert '"result": "started"' in sent.stdout
    with running_worker(app, **FAST):
        until(lambda: len(executions(db_url, "cli-started")) == 2, what="the CLI's event started")


def test_an_event_that_moves_a_due_burst_while_it_starts_keeps_it_open(make_app, db_url):
    """A burst is due and a worker starts it while an event of its key holds the burst's row
    (moving its due time): the start waits for the event, re-checks the due time in its own
    statement, and leaves the burst open; nothing starts early and nothing twice."""
    wf = echo("moved-burst", "doc.moved", debounce="0.1s")
    app = make_app(wf)
    app.send_event("doc.moved", payload={"v": 1})
    until(lambda: value(db_url, "SELECT due_at < now() FROM konduit_trigger_groups"),
          what="the burst is due")
    group = value(db_url, "SELECT id FROM konduit_trigger_groups")
    outcome: list[Any] = []

    def start() -> None:
        async def go() -> Any:
            db = Database(db_url, min_size=1, max_size=1, payloads=configured_payloads())
            await db.open()
            try:
                return await db.atomic(
                    lambda tx: triggers.start_group(tx, Registry([wf]), group))
            finally:
                await db.close()
        outcome.append(asyncio.run(go()))

    with psycopg.connect(db_url) as event:
        event.execute("UPDATE konduit_trigger_groups SET due_at = now() + interval '1 hour', "
                      "size = size + 1 WHERE id = %s", (group,))
        starter = threading.Thread(target=start)
        starter.start()
        until(lambda: value(db_url, "SELECT count(*) FROM pg_stat_activity "
                                    "WHERE %s = ANY(pg_blocking_pids(pid))",
                            event.info.backend_pid) > 0,
              what="the start waits for the event's row lock")
        event.commit()
    starter.join()
    assert outcome[-1] is None
    assert value(db_url, "SELECT size FROM konduit_trigger_groups WHERE id = %s", group) == 2
    assert executions(db_url, "moved-burst") == []
