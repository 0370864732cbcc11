"""Fair shares between keys (``Workflow(fair_by=...)``, migration 0027): one customer's backlog
of executions, started one by one or in one ``start_many``, does not hold back another
customer's execution started after it by more than a round of the claim.

The order is checked against the claim statement itself (direct ``transitions.claim`` calls),
each next to a control: the same starts without ``fair_by`` put the later customer behind the
whole backlog. Then the key's row and its cleanup, the key on the execution, and a bad key.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import konduit
from konduit import FairKeyError
from konduit.core.search import ExecutionFilter
from konduit.db.database import Database
from konduit.engine import retention, starts, transitions
from konduit.engine.client import Client
from konduit.engine.completer import Recorded, record
from konduit.engine.registry import Registry
from konduit.worker.executor import Claimed
from tests.support.scenario import run_scenario
from tests.support.waiting import until
from tests.support.workers import running_worker
from tests.test_api_v1 import api, refused

pytestmark = [pytest.mark.storage]
WORKER = "worker-fair-keys"
BACKLOG = 400


def customer_workflow(name: str, *, fair: bool = True, roots: int = 1) -> konduit.Workflow:
    wf = konduit.Workflow(name, version=1,
                          fair_by=(lambda input: input["customer"]) if fair else None)
    for i in range(roots):
        wf.step(name=f"r{i}")(lambda ctx: 1)
    return wf


async def claim(db: Database, registry: Registry, limit: int) -> list[Claimed]:
    rows = await transitions.claim(db, queues=["default"], workflows=registry.keys(),
                                   limit=limit, lease_seconds=15.0, worker_id=WORKER)
    return [Claimed.from_row(r) for r in rows]


def run(url: str, workflows: list[konduit.Workflow], scenario: Any) -> Any:
    return run_scenario(url, workflows, scenario, worker_id=WORKER)


async def claim_until(db: Database, registry: Registry, wanted: Any) -> list[Claimed]:
    """Claim 8 tasks at a time until one of the execution ``wanted`` is claimed: every task
    claimed, in order."""
    claimed: list[Claimed] = []
    while not any(t.execution_id == wanted for t in claimed):
        got = await claim(db, registry, limit=8)
        assert got, "the execution was never claimed"
        claimed += got
    return claimed


async def claims_before(db: Database, registry: Registry, wanted: Any) -> int:
    """How many tasks are claimed (8 a claim) before the execution ``wanted``'s first."""
    claimed = await claim_until(db, registry, wanted)
    return [t.execution_id for t in claimed].index(wanted)


async def start_backlog(client: Client, workflow: str, shape: str) -> None:
    if shape == "one by one":
        for _ in range(BACKLOG):
            await client.start(workflow, {"customer": "a"})
    else:
        await client.start_many([{"workflow": workflow, "input": {"customer": "a"}}] * BACKLOG)


@pytest.mark.parametrize("shape", ["one by one", "start_many"])
def test_a_later_customer_is_claimed_within_a_round_of_a_backlog(db_url, shape):
    async def scenario(db: Database, registry: Registry, client: Client) -> list[int]:
        waited = []
        for workflow in ("fair", "plain"):
            await start_backlog(client, workflow, shape)
            assert len(await claim(db, registry, limit=16)) == 16  # the backlog is being claimed
            b = await client.start(workflow, {"customer": "b"})
            waited.append(await claims_before(db, registry, b))
            while await claim(db, registry, limit=500):
                pass  # the rest of the backlog, out of the control's way
        return waited

    fair, plain = run(db_url, [customer_workflow("fair"), customer_workflow("plain", fair=False)],
                      scenario)
    # Customer b is claimed with the turn being claimed: after at most that turn's and the
    # next's tasks of customer a (8 each).
    assert fair <= 8 * 2, f"{fair} tasks were claimed before customer b's execution"
    # Control: the same starts without fair_by. One by one, every execution of the backlog took
    # the clock's turn at its start, so b waited for all of it; a start_many is one flow already
    # (migration 0019), so b waits a turn there too.
    if shape == "one by one":
        assert plain >= BACKLOG - 16, f"without fair_by b waited for {plain} tasks only"
    else:
        assert plain <= 8 * 2


def test_the_next_step_of_a_later_customer_is_claimed_within_a_round_too(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        for _ in range(200):
            await client.start("two", {"customer": "a"})
        first = await claim(db, registry, limit=8)
        b = await client.start("two", {"customer": "b"})
        claimed = [*first, *await claim_until(db, registry, b)]
        assert len(claimed) - 8 <= 8 * 3
        # Everything claimed succeeds, b's first step with it: the next steps are made ready
        # at the turn being claimed (older executions first), so b's next step, like a's, comes
        # within a round, not behind a's backlog of first steps.
        for task in claimed:
            await succeed(db, registry, task)
        assert await claims_before(db, registry, b) <= 8 * 3

    wf = konduit.Workflow("two", version=1, fair_by=lambda input: input["customer"])
    first_step = wf.step(name="a")(lambda ctx: 1)
    wf.step(name="b", after=[first_step])(lambda ctx: 2)
    run(db_url, [wf], scenario)


async def succeed(db: Database, registry: Registry, task: Claimed) -> None:
    outcome, _ = await record(db, registry, task.completion(
        "succeeded", payload_json="1", payload=1))
    assert outcome is Recorded.ENDED


def test_a_key_takes_eight_tasks_a_turn_and_its_row_moves_on(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        for _ in range(20):
            await client.start("wide", {"customer": "a"})  # 3 roots each
        await client.start_many([{"workflow": "wide", "input": {"customer": "a"}}] * 20)
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT t.fair_turn, count(*) FROM konduit_tasks t"
                " GROUP BY t.fair_turn ORDER BY t.fair_turn")
            turns = await cur.fetchall()
            cur = await tx.conn.execute("SELECT queue, fair_key, next_slot FROM konduit_fair_keys")
            keys = await cur.fetchall()
        # 40 executions x 3 roots = 120 slots, 8 a turn: turns 0..14, 8 tasks each.
        assert [(r["fair_turn"], r["count"]) for r in turns] == [(t, 8) for t in range(15)]
        assert [(r["queue"], r["fair_key"], r["next_slot"]) for r in keys] == [
            ("default", "a", 120)]

    run(db_url, [customer_workflow("wide", roots=3)], scenario)


def test_the_key_is_on_the_execution_and_a_stale_key_row_is_pruned(db_url):
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        a = await client.start("fair", {"customer": "acme"})
        b = await client.start("fair", {"customer": "globex"})
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT fair_key FROM konduit_executions WHERE id = ANY(%s) ORDER BY id",
                ([a, b],))
            assert [r["fair_key"] for r in await cur.fetchall()] == ["acme", "globex"]
        # Both keys' rows are one slot ahead of the clock's turn 0: kept.
        await retention.prune(db, "1h")
        assert await _key_rows(db) == ["acme", "globex"]
        # The queue's clock passes acme's next slot but not globex's: acme's row goes.
        async with db.transaction() as tx:
            await tx.conn.execute(
                "UPDATE konduit_fair_keys SET next_slot = 100 WHERE fair_key = 'globex'")
            await tx.conn.execute("UPDATE konduit_queue_clocks SET fair_turn = 5")
        await retention.prune(db, "1h")
        assert await _key_rows(db) == ["globex"]
        # A start after the prune takes the clock's turn, as a fresh key does.
        c = await client.start("fair", {"customer": "acme"})
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT fair_turn FROM konduit_tasks WHERE execution_id = %s", (c,))
            assert [r["fair_turn"] for r in await cur.fetchall()] == [5]

    run(db_url, [customer_workflow("fair")], scenario)


async def _key_rows(db: Database) -> list[str]:
    async with db.transaction() as tx:
        cur = await tx.conn.execute("SELECT fair_key FROM konduit_fair_keys ORDER BY fair_key")
        return [r["fair_key"] for r in await cur.fetchall()]


@pytest.mark.parametrize("fair_by, fault", [
    (lambda input: input["customer"], "KeyError"),
    (lambda input: 42, "returned int"),
    (lambda input: "", "1 to 200"),
    (lambda input: (_ for _ in ()).throw(SystemExit(3)), "SystemExit"),
])
def test_a_bad_key_is_refused_at_start_naming_the_workflow_and_nothing_is_stored(
        make_app, fair_by, fault):
    wf = konduit.Workflow("keyed", version=1, fair_by=fair_by)
    wf.step(name="work")(lambda ctx: 1)
    other = konduit.Workflow("other", version=1)
    other.step(name="work")(lambda ctx: 1)
    app = make_app(wf, other)
    with pytest.raises(FairKeyError, match=f"fair_by of workflow 'keyed'.*{fault}"):
        app.start("keyed", {"other": 1})
    with pytest.raises(FairKeyError, match="start request 1: fair_by of workflow 'keyed'"):
        app.start_many([{"workflow": "other", "input": {}}, {"workflow": "keyed", "input": {}}])
    with psycopg.connect(app.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM konduit_executions").fetchone()
        assert row is not None and row[0] == 0


def test_a_key_function_that_never_returns_fails_its_start_and_holds_no_other(
        make_app, monkeypatch):
    """A start runs fair_by= (user code) off the App's loop, which every thread of the process
    shares: one that never returns fails its own start after the limit, and the other threads'
    starts go through meanwhile."""
    monkeypatch.setattr(starts, "START_CODE_SECONDS", 5.0)
    entered, release = threading.Event(), threading.Event()

    def stuck(value: Any) -> str:
        entered.set()
        release.wait(120)  # far beyond the test: only the time limit ends the wait here
        return "k"

    wf = konduit.Workflow("stuck-key", version=1, fair_by=stuck)
    wf.step(name="work")(lambda ctx: 1)
    other = konduit.Workflow("other", version=1)
    other.step(name="work")(lambda ctx: 1)
    app = make_app(wf, other)
    failed: list[BaseException] = []

    def start_stuck() -> None:
        try:
            app.start("stuck-key", {"n": 1})
        except konduit.KonduitError as exc:
            failed.append(exc)

    stuck_start = threading.Thread(target=start_stuck)
    try:
        stuck_start.start()
        assert entered.wait(30)
        app.start("other", {"n": 2})
        # Returned while the stuck start still waits for its limit: the loop was free.
        assert stuck_start.is_alive()
        stuck_start.join(30)
        assert len(failed) == 1
        assert "the start of workflow 'stuck-key': its input checks and key functions did " \
               "not return within 5 s" in str(failed[0])
        assert [r.workflow for r in app.list()] == ["other"]
    finally:
        release.set()
        stuck_start.join(30)


def test_fair_by_is_a_path_into_the_input_or_a_function():
    with pytest.raises(konduit.WorkflowDefinitionError, match="a key path looks like"):
        konduit.Workflow("keyed", version=1, fair_by="customer")
    with pytest.raises(konduit.WorkflowDefinitionError, match="fair_by is a path"):
        konduit.Workflow("keyed", version=1, fair_by=3)  # type: ignore[arg-type]
    konduit.Workflow("keyed", version=1, fair_by="input.customer")


# -- end to end, one worker of 8 slots -----------------------------------------------------------

E2E_BACKLOG = 10_000


@pytest.mark.slow  # the backlog's 100 start_many calls take 5-15 s here
def test_customer_b_finishes_within_a_round_of_a_10k_backlog_of_customer_a(make_app):
    app = make_app(customer_workflow("keyed"))
    for _ in range(E2E_BACKLOG // 100):  # 100 starts: 100 flows of turns without fair_by
        app.start_many([{"workflow": "keyed", "input": {"customer": "a"}}] * 100)
    with running_worker(app, concurrency=8):
        until(lambda: _count(app, "SELECT count(*) FROM konduit_executions"
                             " WHERE status = 'succeeded'") > 200, timeout=60)
        b = app.start("keyed", {"customer": "b"}).id
        assert app.wait(b, timeout=30).status == "succeeded"
        running = _count(app, "SELECT count(*) FROM konduit_executions"
                              " WHERE status = 'running'")
    with psycopg.connect(app.database_url) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM e.finished_at - e.created_at)::float8,"
            " (SELECT count(*) FROM konduit_tasks a JOIN konduit_executions x"
            "   ON x.id = a.execution_id"
            "  WHERE x.fair_key = 'a' AND a.created_at < e.created_at"
            "    AND a.started_at >= e.created_at AND a.started_at < t.started_at)"
            " FROM konduit_executions e JOIN konduit_tasks t ON t.execution_id = e.id"
            " WHERE e.id = %s", (b,)).fetchone()
    assert row is not None
    seconds, ahead = float(row[0]), int(row[1])
    print(f"customer b: {seconds:.3f} s start -> finish, {ahead} tasks of customer a ahead")
    assert running > E2E_BACKLOG // 2, "customer a's backlog was still running"
    # Claimed within a round (8) of the backlog ready before it, give or take the claims
    # already under way when it started; the time only with a loaded machine's margin.
    assert ahead <= 8 * 3, f"{ahead} tasks of customer a were claimed after b started, before b"
    assert seconds < 10.0, f"customer b took {seconds:.2f} s"


def _count(app: konduit.App, sql_text: str) -> int:
    with psycopg.connect(app.database_url) as conn:
        row = conn.execute(sql_text.encode()).fetchone()
    assert row is not None
    return int(row[0])


def test_the_key_is_seen_and_searched_through_every_face(make_app, db_url):
    app = make_app(customer_workflow("keyed"))
    acme = app.start("keyed", {"customer": "acme"}).id
    app.start("keyed", {"customer": "globex"})
    assert [(r.id, r.fair_key) for r in app.search(ExecutionFilter(fair_key="acme"))] == [
        (acme, "acme")]
    assert [r.id for r in app.list(fair_key="acme")] == [acme]
    with api(app, db_url) as http:
        # A start through the API of a process with the workflow's code takes its key too.
        response = http.post("/api/v1/executions", json={"workflow": "keyed",
                                                          "input": {"customer": "acme"}})
        assert response.status_code == 201, response.text
        second = response.json()["id"]
        assert http.get(f"/api/v1/executions/{second}").json()["fair_key"] == "acme"
        items = http.get("/api/v1/executions", params={"fair_key": "acme"}).json()["items"]
        assert [i["id"] for i in items] == [second, str(acme)]
        page = http.get(f"/executions/{acme}").text
        assert 'id="fair-key"' in page and "acme" in page
        listed = http.get("/", params={"fair_key": "globex"}).text
        assert "globex" in listed and str(acme) not in listed


# -- racing starts of one key --------------------------------------------------------------------


def test_racing_starts_of_one_key_take_distinct_slots_and_never_deadlock(make_app):
    """8 threads start executions of one key at once (a barrier before each round), half of
    them with idempotency keys another thread uses too: every start took its own slot (no turn
    holds more than 8 of the key's tasks; the key's row counts every execution made), and the
    starts that share keys never deadlocked with the key row's lock."""
    app = make_app(customer_workflow("keyed"))
    app.start("keyed", {"customer": "warm"})  # the App's pool, opened once
    threads, rounds = 8, 12
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    with psycopg.connect(app.database_url) as conn:
        before = _one(conn, DEADLOCKS)

    def starter(n: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait(timeout=30)
                shared = f"round-{r}-{n % 4}" if n % 2 else None  # pairs of threads collide
                app.start("keyed", {"customer": "a"}, idempotency_key=shared)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=starter, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors
    with psycopg.connect(app.database_url) as conn:
        made = _one(conn, "SELECT count(*) FROM konduit_executions WHERE fair_key = 'a'")
        per_turn = conn.execute(
            "SELECT t.fair_turn, count(*) FROM konduit_tasks t JOIN konduit_executions e"
            " ON e.id = t.execution_id WHERE e.fair_key = 'a' GROUP BY t.fair_turn").fetchall()
        next_slot = _one(conn, "SELECT next_slot FROM konduit_fair_keys WHERE fair_key = 'a'")
    # 4 threads without keys, and 4 that share 2 keys a round: 6 executions a round.
    assert made == rounds * 6
    assert max(n for _, n in per_turn) <= 8
    # Every start took its slot under the row's lock (a start whose key was taken still took
    # one: a gap, never an overlap).
    assert made <= next_slot <= rounds * threads
    assert _deadlocks_since(app, before) == 0  # a start retries one: count them on the server


DEADLOCKS = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"


def _deadlocks_since(app: konduit.App, before: int) -> int:
    with psycopg.connect(app.database_url) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")  # the count lags a stats flush
        return _one(conn, DEADLOCKS) - before


def _one(conn: psycopg.Connection[Any], sql_text: str) -> int:
    row = conn.execute(sql_text.encode()).fetchone()
    assert row is not None
    return int(row[0])


def test_a_start_later_takes_no_share_of_its_key(db_url):
    """Executions of a key started for later take turns as unkeyed ones do: they neither move
    the key's row (its starts now would wait behind turns nobody claims yet) nor use it."""
    async def scenario(db: Database, registry: Registry, client: Client) -> None:
        await client.start_many([{"workflow": "fair", "input": {"customer": "a"},
                                  "delay": "1h"}] * 80)
        now = await client.start("fair", {"customer": "a"})
        async with db.transaction() as tx:
            cur = await tx.conn.execute(
                "SELECT fair_turn FROM konduit_tasks WHERE execution_id = %s", (now,))
            assert [r["fair_turn"] for r in await cur.fetchall()] == [0]
            cur = await tx.conn.execute("SELECT next_slot FROM konduit_fair_keys")
            assert [r["next_slot"] for r in await cur.fetchall()] == [1]

    run(db_url, [customer_workflow("fair")], scenario)


def test_a_process_without_the_code_gives_the_key_itself(make_app, db_url):
    """A start by name (konduit.Client, an API server without the App) cannot run a fair_by
    function: it passes fair_key (a start request's field, the API body's), checked like
    fair_by's; without one the start is refused naming the fix, never started keyless."""
    app = make_app(customer_workflow("keyed"))
    app.start("keyed", {"customer": "warm"})  # registers the workflow
    with konduit.Client(db_url) as client:
        [given] = client.start_many([
            {"workflow": "keyed", "input": {"customer": "x"}, "fair_key": "acme"}])
        with pytest.raises(konduit.KeyNeedsCode, match=r"start request 1: workflow 'keyed' "
                           r"computes its fair_by key with the function .*fair_by='input\.cus"):
            client.start_many([{"workflow": "keyed", "input": {"customer": "x"}, "fair_key": "a"},
                               {"workflow": "keyed", "input": {"customer": "x"}}])
        with pytest.raises(FairKeyError, match="start request 0: fair_key of a start of 'keyed'"):
            client.start_many([{"workflow": "keyed", "fair_key": ""}])
        # One start by name takes the same options as the App's start.
        later = datetime.now(UTC) + timedelta(hours=1)
        one = client.start("keyed", {"customer": "x"}, fair_key="umbrella",
                           tags={"team": "billing"}, run_at=later, priority=-3)
        delayed = client.start("keyed", {"customer": "x"}, delay="1h", fair_key="x")
    found = {r.id: r.fair_key for r in app.search(workflow="keyed")}
    assert found[given.id] == "acme"
    with psycopg.connect(db_url) as conn:
        stored = {eid: rest for eid, *rest in conn.execute(
            "SELECT id, fair_key, tags, status, run_at, priority FROM konduit_executions"
            " WHERE id = ANY(%s)", ([one.id, delayed.id],))}
    fair_key, tags, status, run_at, priority = stored[one.id]
    assert (fair_key, tags, status, priority) == ("umbrella", {"team": "billing"}, "scheduled", -3)
    assert abs((run_at - later).total_seconds()) < 1
    assert stored[delayed.id][2] == "scheduled"
    # With the code, a given key wins over fair_by's.
    assert app.search(fair_key="globex") == []
    mine = app.start("keyed", {"customer": "acme"}, fair_key="globex").id
    assert [r.id for r in app.search(fair_key="globex")] == [mine]
    with api(None, db_url) as http:
        response = http.post("/api/v1/executions", json={
            "workflow": "keyed", "input": {}, "fair_key": "initech"})
        assert response.status_code == 201, response.text
        assert http.get(f"/api/v1/executions/{response.json()['id']}").json()["fair_key"] == \
            "initech"
        refused(http.post("/api/v1/executions", json={"workflow": "keyed", "fair_key": ""}),
                422, "body.fair_key")
    with api(app, db_url) as http:  # fair_by raising on the input: the input is at fault
        body = refused(http.post("/api/v1/executions", json={"workflow": "keyed", "input": {}}),
                       422, "body.input")
        assert "fair_by of workflow 'keyed' raised KeyError" in body["detail"]


def test_two_batches_taking_two_keys_in_opposite_orders_never_deadlock(make_app, monkeypatch):
    """A start_many of more than BATCH_ROWS executions is several statements; each locks its
    keys' rows. Two such batches whose statements take keys a and b in opposite orders would
    wait for each other crosswise (a deadlock, one batch refused) unless every key of the batch
    is locked first, in one order. (Statements of 5 rows here, to race 10 rounds quickly.)"""
    monkeypatch.setattr(starts, "BATCH_ROWS", 5)
    app = make_app(customer_workflow("keyed"))
    app.start("keyed", {"customer": "warm"})  # the App's pool, opened once
    rounds = 10

    def batch(first: str, then: str) -> list[dict[str, Any]]:
        return ([{"workflow": "keyed", "input": {"customer": first}}] * 6
                + [{"workflow": "keyed", "input": {"customer": then}}] * 5)

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    with psycopg.connect(app.database_url) as conn:
        before = _one(conn, DEADLOCKS)

    def starter(first: str, then: str) -> None:
        for _ in range(rounds):
            try:
                barrier.wait(timeout=30)
                app.start_many(batch(first, then))
            except BaseException as exc:  # reported below
                errors.append(exc)

    threads = [threading.Thread(target=starter, args=args) for args in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with psycopg.connect(app.database_url) as conn:
        # (A deadlock is retried by the start, so it shows in the server's count, not as an
        # error; the count is per database and lags up to a stats flush: read it last.)
        assert _one(conn, "SELECT count(*) FROM konduit_executions") == 1 + 2 * 11 * rounds
        slots = dict(conn.execute("SELECT fair_key, next_slot FROM konduit_fair_keys").fetchall())
    assert slots == {"warm": 1, "a": 11 * rounds, "b": 11 * rounds}
    assert _deadlocks_since(app, before) == 0
