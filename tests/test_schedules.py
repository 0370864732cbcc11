"""Schedules in the database: definitions stored from code, one execution per tick whoever
tries (the tick's idempotency key decides), missed policies after a pause driven with explicit
times, ctx.scheduled_at and the window through a real worker, and ``konduit schedules``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest

import konduit
from konduit.core.schedules import tick_key
from konduit.db.database import Database
from konduit.db.sealing import configured as configured_payloads
from konduit.engine import starts
from konduit.engine.client import Client
from konduit.engine.registry import Registry
from konduit.engine.schedules import Schedules
from tests.support.db import rows
from tests.support.payloads import opened, opened_rows
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]
T = TypeVar("T")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


T0 = utc(2026, 11, 30, 4, 0, 5)


def scheduled(missed: str = "latest", every: str = "1m", input: Any = None,
              **options: Any) -> konduit.Workflow:
    wf = konduit.Workflow("nightly-publish", version=1)

    @wf.step()
    def publish(ctx: konduit.Context) -> dict[str, Any]:
        return {"scheduled_at": ctx.scheduled_at.isoformat() if ctx.scheduled_at else None,
                "input": ctx.input}

    wf.schedule(every=every, name="nightly", missed=missed,
                input={"channel": "web"} if input is None else input, window="30m", **options)
    return wf


def run(url: str, workflows: list[konduit.Workflow],
        body: Callable[[Schedules], Awaitable[T]]) -> T:
    async def main() -> T:
        db = Database(url, min_size=1, max_size=4, payloads=configured_payloads())
        await db.open()
        try:
            registry = Registry(workflows)
            await Client(db, registry).register_all()
            return await body(Schedules(db, registry))
        finally:
            await db.close()

    return asyncio.run(main())


def keys_started(url: str) -> list[str]:
    return [r[0] for r in rows(url, "SELECT idempotency_key FROM konduit_executions "
                                    "ORDER BY scheduled_at")]


def state(url: str) -> tuple[Any, ...]:
    return opened_rows(rows(url, "SELECT last_tick, paused, updated_at, input "
                                 "FROM konduit_schedules WHERE name = 'nightly'"))[0]


@pytest.mark.parametrize(("missed", "after_resume"), [
    ("skip", []),
    ("latest", [utc(2026, 11, 30, 4, 10)]),
    ("all", [utc(2026, 11, 30, 4, m) for m in range(2, 11)]),
])
def test_missed_policy_after_a_pause(db_url: str, missed: str,
                                     after_resume: list[datetime]) -> None:
    wf = scheduled(missed)

    async def body(s: Schedules) -> list[list[datetime]]:
        await s.sync(now=T0)
        rounds = [await s.run_due(now=utc(2026, 11, 30, 4, 1, 2))]
        assert await s.set_paused("nightly", True)
        assert not await s.set_paused("nightly", True)  # already paused
        rounds.append(await s.run_due(now=utc(2026, 11, 30, 4, 5, 2)))  # paused: nothing
        assert await s.set_paused("nightly", False)
        rounds.append(await s.run_due(now=utc(2026, 11, 30, 4, 10, 30)))  # 04:02..04:10 missed
        rounds.append(await s.run_due(now=utc(2026, 11, 30, 4, 10, 40)))  # nothing new
        rounds.append(await s.run_due(now=utc(2026, 11, 30, 4, 11, 1)))  # on time again
        return [[x.tick for x in started] for started, _ in rounds]

    rounds = run(db_url, [wf], body)
    assert rounds == [[utc(2026, 11, 30, 4, 1)], [], after_resume, [], [utc(2026, 11, 30, 4, 11)]]
    expected = [utc(2026, 11, 30, 4, 1), *after_resume, utc(2026, 11, 30, 4, 11)]
    assert keys_started(db_url) == [tick_key("nightly", t) for t in expected]
    for key, scheduled_at, deadline_at, input_ in rows(
        db_url, "SELECT idempotency_key, scheduled_at, deadline_at, input FROM konduit_executions"
    ):
        assert key == tick_key("nightly", scheduled_at)
        assert deadline_at == scheduled_at + timedelta(minutes=30)  # window="30m"
        assert opened(input_) == {"channel": "web"}
    assert state(db_url)[0] == utc(2026, 11, 30, 4, 11)


def test_a_stored_schedule_keeps_its_state_and_a_new_timing_counts_from_now(db_url: str) -> None:
    run(db_url, [scheduled()], lambda s: s.sync(now=T0))
    first = state(db_url)
    assert first[0] == T0 and first[1] is False  # a new schedule counts from when it is stored
    run(db_url, [scheduled()], lambda s: s.sync(now=T0 + timedelta(hours=1)))
    assert state(db_url) == first  # unchanged definition: not even rewritten
    changed_input = scheduled(input={"channel": "app"})
    run(db_url, [changed_input], lambda s: s.sync(now=T0 + timedelta(hours=1)))
    assert state(db_url)[0] == T0 and state(db_url)[3] == {"channel": "app"}
    run(db_url, [scheduled(every="5m")], lambda s: s.sync(now=T0 + timedelta(hours=2)))
    assert state(db_url)[0] == T0 + timedelta(hours=2)  # new timing: the old ticks are not its


def test_racing_starts_of_the_same_ticks_make_one_execution_each(db_url: str) -> None:
    """Eight workers start the same ticks at the same instant, bypassing the schedule row's
    lock: the tick's idempotency key alone lets one execution per tick exist."""
    wf = scheduled()
    ticks = (utc(2026, 11, 30, 4, 1), utc(2026, 11, 30, 4, 2), utc(2026, 11, 30, 4, 3))

    async def main() -> list[list[Any]]:
        registry = Registry([wf])
        dbs = [Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
               for _ in range(8)]
        for db in dbs:
            await db.open()
        try:
            await Client(dbs[0], registry).register_all()
            await Schedules(dbs[0], registry).sync(now=T0)
            row = {"name": "nightly", "workflow_name": wf.name, "workflow_version": 1,
                   "input": {"channel": "web"}, "window_seconds": 1800.0}

            async def start(db: Database, gate: asyncio.Event,
                            trial_ticks: tuple[datetime, ...]) -> list[Any]:
                s = Schedules(db, registry)
                await gate.wait()
                started = await db.atomic(lambda tx: s._insert(tx, row, trial_ticks))
                return [x.execution_id for x in started]

            results = []
            for trial in range(4):
                gate = asyncio.Event()
                trial_ticks = tuple(t + timedelta(hours=trial) for t in ticks)
                jobs = [asyncio.create_task(start(db, gate, trial_ticks)) for db in dbs]
                await asyncio.sleep(0.2)
                gate.set()
                results.append(await asyncio.gather(*jobs))
            return results
        finally:
            for db in dbs:
                await db.close()

    for ids in asyncio.run(main()):
        assert len(ids) == 8 and all(got == ids[0] for got in ids)  # everyone got the same
    counted = rows(db_url, "SELECT idempotency_key, count(*) FROM konduit_executions "
                           "GROUP BY idempotency_key")
    assert len(counted) == 12 and all(n == 1 for _, n in counted)
    assert rows(db_url, "SELECT count(*) FROM konduit_executions WHERE scheduled_at IS NULL") \
        == [(0,)]


def test_rounds_racing_on_one_schedule_start_each_tick_once(db_url: str) -> None:
    wf = scheduled(missed="all")

    async def main() -> list[int]:
        registry = Registry([wf])
        dbs = [Database(db_url, min_size=1, max_size=2, payloads=configured_payloads())
               for _ in range(6)]
        for db in dbs:
            await db.open()
        try:
            await Client(dbs[0], registry).register_all()
            await Schedules(dbs[0], registry).sync(now=T0)
            counts = []
            for minute in range(1, 6):
                now = utc(2026, 11, 30, 4, minute, 30)  # 04:minute is due (and missed)
                rounds = await asyncio.gather(*[Schedules(db, registry).run_due(now=now)
                                                for db in dbs])
                counts.append(sum(len(started) for started, _ in rounds))
            return counts
        finally:
            for db in dbs:
                await db.close()

    counts = asyncio.run(main())
    assert all(n >= 1 for n in counts)  # each round some worker started the tick
    assert keys_started(db_url) == [tick_key("nightly", utc(2026, 11, 30, 4, m))
                                    for m in range(1, 6)]


def test_a_worker_starts_the_ticks_and_handlers_see_scheduled_at(make_app, db_url: str) -> None:
    wf = scheduled(every="1s")
    app = make_app(wf)
    with running_worker(app, concurrency=4):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = app.list(status="succeeded", workflow="nightly-publish")
            if len(done) >= 3:
                break
            time.sleep(0.1)
        assert len(done) >= 3
        by_hand = app.start("nightly-publish", input={"channel": "hand"}).wait(timeout=30)
    assert by_hand.output == {"scheduled_at": None, "input": {"channel": "hand"}}
    for result in done:
        full = app.status(result.id)
        [(key, scheduled_at, deadline_at)] = rows(
            db_url, "SELECT idempotency_key, scheduled_at, deadline_at FROM konduit_executions "
                    "WHERE id = %s", result.id)
        assert full.output == {"scheduled_at": scheduled_at.isoformat(),
                               "input": {"channel": "web"}}
        assert key == tick_key("nightly", scheduled_at)
        assert deadline_at == scheduled_at + timedelta(minutes=30)
    listed = {s.name: s for s in app.schedules()}
    nightly = listed["nightly"]
    assert nightly.workflow_name == "nightly-publish" and nightly.schedule == "every 1s"
    assert nightly.last_execution_id is not None and not nightly.paused
    assert not nightly.behind
    assert nightly.next_tick > nightly.last_tick


def test_flow_limited_steps_see_scheduled_at_too(make_app, db_url: str) -> None:
    """Steps with ``concurrency=`` or ``rate=`` are claimed by their own statement: its rows
    carry the execution's tick as the plain claim's do (they once left it out)."""
    wf = konduit.Workflow("limited-nightly", version=1)

    def tick(ctx: konduit.Context) -> str | None:
        return ctx.scheduled_at.isoformat() if ctx.scheduled_at else None

    @wf.step(concurrency=1)
    def one_at_a_time(ctx: konduit.Context) -> str | None:
        return tick(ctx)

    @wf.step(after=[one_at_a_time], rate="100/s")
    def throttled(ctx: konduit.Context) -> list[str | None]:
        return [ctx.upstream["one_at_a_time"], tick(ctx)]

    wf.schedule(every="1s", name="limited-nightly")
    app = make_app(wf)
    with running_worker(app, concurrency=4):
        deadline = time.monotonic() + 30
        while not (done := app.list(status="succeeded", workflow="limited-nightly")) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
    assert done
    [(scheduled_at,)] = rows(db_url, "SELECT scheduled_at FROM konduit_executions WHERE id = %s",
                             done[0].id)
    assert scheduled_at is not None
    assert app.status(done[0].id).output == [scheduled_at.isoformat()] * 2


def test_a_tick_whose_key_was_taken_by_hand_is_not_started_again(make_app, db_url: str) -> None:
    app = make_app(scheduled(missed="all"))
    run(db_url, [scheduled(missed="all")], lambda s: s.sync(now=T0))
    taken = app.start("nightly-publish", input={"by": "hand"},
                      idempotency_key=tick_key("nightly", utc(2026, 11, 30, 4, 2)))

    async def body(s: Schedules) -> list[datetime]:
        started, _ = await s.run_due(now=utc(2026, 11, 30, 4, 3, 30))
        return [x.tick for x in started]

    # 04:01 and 04:03 start; 04:02's key already has an execution (another input): left alone.
    assert run(db_url, [scheduled(missed="all")], body) == [utc(2026, 11, 30, 4, 1),
                                                           utc(2026, 11, 30, 4, 3)]
    assert sorted(keys_started(db_url)) == [tick_key("nightly", utc(2026, 11, 30, 4, m))
                                            for m in (1, 2, 3)]
    assert opened_rows(rows(db_url, "SELECT input, scheduled_at FROM konduit_executions "
                                    "WHERE id = %s", taken.id)) == [({"by": "hand"}, None)]
    assert state(db_url)[0] == utc(2026, 11, 30, 4, 3)


def test_a_deleted_last_execution_leaves_no_dangling_id(db_url: str) -> None:
    async def body(s: Schedules) -> None:
        await s.sync(now=T0)
        await s.run_due(now=utc(2026, 11, 30, 4, 1, 2))

    run(db_url, [scheduled()], body)
    [(eid,)] = rows(db_url, "SELECT last_execution_id FROM konduit_schedules")
    assert eid is not None
    with psycopg.connect(db_url) as conn:  # what retention's prune does to an old execution
        conn.execute("DELETE FROM konduit_executions WHERE id = %s", (eid,))
    assert rows(db_url, "SELECT last_execution_id FROM konduit_schedules") == [(None,)]


def test_pausing_an_unknown_schedule_names_it(make_app) -> None:
    app = make_app(scheduled())
    with pytest.raises(konduit.ScheduleNotFound, match="no schedule named 'nighty'"):
        app.pause_schedule("nighty")
    with pytest.raises(konduit.ScheduleNotFound, match="no schedule named 'nighty'"):
        app.resume_schedule("nighty")


# -- the command line -----------------------------------------------------------------------------


def konduit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KONDUIT_DATABASE_URL"}
    env["COLUMNS"] = "220"
    return subprocess.run([sys.executable, "-m", "konduit.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_cli_lists_pauses_and_resumes(db_url: str) -> None:
    empty = konduit_cli("schedules", "--database-url", db_url)
    assert empty.returncode == 0 and "no schedules" in empty.stdout
    wf = scheduled()

    async def body(s: Schedules) -> None:
        await s.sync(now=T0)
        await s.run_due(now=utc(2026, 11, 30, 4, 1, 2))

    run(db_url, [wf], body)
    [execution_id] = [r[0] for r in rows(db_url, "SELECT id FROM konduit_executions")]

    # Read before the command: the next tick it shows is after its own now, which is after
    # this (a now read after it could pass a minute's boundary the tick sits on).
    asked = datetime.now(UTC)
    listed = konduit_cli("schedules", "--database-url", db_url, "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert entry["name"] == "nightly" and entry["workflow_name"] == "nightly-publish"
    assert entry["last_execution_id"] == str(execution_id) and entry["last_status"] == "running"
    assert entry["paused"] is False and entry["behind"] is True  # no worker since 04:01
    assert datetime.fromisoformat(entry["next_tick"]) > asked

    table = konduit_cli("schedules", "--database-url", db_url)
    assert table.returncode == 0, table.stderr
    for text in ("nightly", "nightly-publish@1", "every 1m", str(execution_id), "running",
                 "behind", "is a worker of the App running?"):
        assert text in table.stdout, text

    paused = konduit_cli("schedules", "--database-url", db_url, "--pause", "nightly")
    assert paused.returncode == 0 and "schedule nightly paused" in paused.stdout
    again = konduit_cli("schedules", "--database-url", db_url, "--pause", "nightly")
    assert "(it was paused already)" in again.stdout
    [entry] = json.loads(konduit_cli("schedules", "--database-url", db_url, "--json").stdout)
    assert entry["paused"] is True and entry["next_tick"] is None and entry["behind"] is False
    assert "paused" in konduit_cli("schedules", "--database-url", db_url).stdout

    resumed = konduit_cli("schedules", "--database-url", db_url, "--resume", "nightly")
    assert resumed.returncode == 0 and "schedule nightly resumed" in resumed.stdout
    [entry] = json.loads(konduit_cli("schedules", "--database-url", db_url, "--json").stdout)
    assert entry["paused"] is False

    unknown = konduit_cli("schedules", "--database-url", db_url, "--pause", "nighty")
    assert unknown.returncode == 1 and "no schedule named 'nighty'" in unknown.stderr
    both = konduit_cli("schedules", "--database-url", db_url, "--pause", "a", "--resume", "b")
    assert both.returncode == 1 and "not both" in both.stderr


def test_a_key_function_that_never_returns_holds_no_worker(make_app, monkeypatch) -> None:
    """A tick's start runs the workflow's fair_by= (user code) on the worker's loop; one that
    never returned held every lease and claim of the worker. Now the tick's start fails (the
    next round tries again) and the worker runs on."""
    monkeypatch.setattr(starts, "START_CODE_SECONDS", 0.5)
    release = threading.Event()

    def stuck_fair(value: Any) -> str:
        release.wait(120)  # far beyond the test: only the time limit ends the wait here
        return "k"

    wf = konduit.Workflow("stuck-schedule", version=1, fair_by=stuck_fair)
    wf.step(name="publish")(lambda ctx: ctx.input)
    wf.schedule(every="1s", name="stuck", input={"n": 1})
    other = konduit.Workflow("other-work", version=1)
    other.step(name="only")(lambda ctx: ctx.input)
    app = make_app(wf, other)
    try:
        with running_worker(app, concurrency=2):
            time.sleep(1.5)  # a tick or two came due and their starts hang
            for n in range(3):
                assert app.start("other-work", input={"n": n}).wait(timeout=30).status \
                    == "succeeded"
        assert not release.is_set()
        assert app.list(workflow="stuck-schedule") == []
    finally:
        release.set()
