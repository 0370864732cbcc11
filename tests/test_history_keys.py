"""An idempotency key stays taken after its execution moved into the history (migration 0041):
a start with it returns that execution through every door and creates nothing, a different input
is refused as before the move, and a start racing the move never makes a second execution of a
key (the start holds the key's advisory lock in a statement before its insert, which sees the
history; the move skips a key a start holds). Controls run the same races with the start's lock
(and the insert's look at the history) taken out, and catch the duplicate.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest

import konduit
from konduit.core.waits import child_idempotency_key
from konduit.db import queries
from konduit.db.queries import q
from konduit.engine import starts
from konduit.web import create_app, database_client
from tests.support.browser import serving
from tests.support.db import rows, value
from tests.support.waiting import until
from tests.support.workers import running_worker

pytestmark = pytest.mark.storage

TRIALS = 30
STARTERS = 4
KEYS = 4
WAIT = 30.0
JITTER = 0.03  # seconds: about a move's span here, so starts land on every side of it


def pay() -> konduit.Workflow:
    wf = konduit.Workflow("pay", version=1)

    @wf.step()
    def charge(ctx: Any) -> dict[str, Any]:
        return {"charged": ctx.input["amount"]}

    return wf


def move(url: str) -> int:
    """One batch of the history's move: every finished execution (older_than 0)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return len(conn.execute(q("execution_move_to_history_if_still_finished"), {
            "older_than_seconds": 0, "after_finished_at": None, "after_id": None,
            "batch_size": 500}).fetchall())


def partition_today(url: str) -> None:
    """Make the history's partitions of the days the finished executions ended on."""
    rows(url, "SELECT konduit_history_partition(d) FROM (SELECT DISTINCT "
         "(finished_at AT TIME ZONE 'UTC')::date AS d FROM konduit_executions "
         "WHERE finished_at IS NOT NULL) AS days")


def executions_of(url: str, key: str) -> list[UUID]:
    """The executions of workflow 'pay' with this key, hot and moved."""
    return [r[0] for r in rows(
        url, "SELECT id FROM konduit_executions WHERE workflow_name = 'pay' "
        "AND idempotency_key = %s UNION ALL SELECT id FROM konduit_history_executions "
        "WHERE workflow_name = 'pay' AND idempotency_key = %s", key, key)]


def counts(url: str) -> tuple[int, int]:
    """(hot, history) executions."""
    return value(url, "SELECT count(*) FROM konduit_executions"), \
        value(url, "SELECT count(*) FROM konduit_history_executions")


def finished(app: konduit.App, requests: list[dict[str, Any]]) -> list[UUID]:
    """Start these requests and cancel them (a finished execution the move takes; no worker)."""
    ids = [h.id for h in app.start_many(requests)]
    for eid in ids:
        assert app.cancel(eid)
    return ids


@contextmanager
def api(app: konduit.App, db_url: str) -> Iterator[httpx.Client]:
    with serving(create_app(database_client(db_url, app), app)) as base, \
            httpx.Client(base_url=base, timeout=30) as http:
        yield http


# -- every door returns the moved execution --------------------------------------------------


def test_a_moved_executions_key_returns_it_through_every_door_and_creates_nothing(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    app = make_app(pay())
    one, two = finished(app, [{"workflow": "pay", "input": {"amount": 1}, "idempotency_key": "k1"},
                              {"workflow": "pay", "input": {"amount": 2}, "idempotency_key": "k2"}])
    with pytest.raises(konduit.IdempotencyConflict) as before:
        app.start("pay", {"amount": 9}, idempotency_key="k1")
    assert move(db_url) == 2
    assert counts(db_url) == (0, 2)

    assert app.start("pay", {"amount": 1}, idempotency_key="k1").id == one
    assert [h.id for h in app.start_many([
        {"workflow": "pay", "input": {"amount": 2}, "idempotency_key": "k2"},
        {"workflow": "pay", "input": {"amount": 1}, "idempotency_key": "k1"},
        {"workflow": "pay", "input": {"amount": 2}, "idempotency_key": "k2"},
    ])] == [two, one, two]
    with konduit.Client(db_url) as client:
        assert client.start("pay", {"amount": 1}, idempotency_key="k1").id == one
        assert [h.id for h in client.start_many([
            {"workflow": "pay", "input": {"amount": 2}, "idempotency_key": "k2"}])] == [two]
    with api(app, db_url) as http:
        started = http.post("/api/v1/executions", json={
            "workflow": "pay", "input": {"amount": 1}, "idempotency_key": "k1"})
        assert started.status_code == 201, started.text
        assert started.json()["id"] == str(one)
        batch = http.post("/api/v1/executions:batch", json={"requests": [
            {"workflow": "pay", "input": {"amount": 2}, "idempotency_key": "k2"}]})
        assert batch.status_code == 201, batch.text
        assert [s["id"] for s in batch.json()["executions"]] == [str(two)], batch.json()
        refused = http.post("/api/v1/executions", json={
            "workflow": "pay", "input": {"amount": 9}, "idempotency_key": "k1"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["field"] == "body.idempotency_key"
    assert counts(db_url) == (0, 2)  # nothing created

    # A different input: the same error as before the move, in every door.
    with pytest.raises(konduit.IdempotencyConflict) as after:
        app.start("pay", {"amount": 9}, idempotency_key="k1")
    assert str(after.value) == str(before.value)
    assert f"already started execution {one} of 'pay' with a different input" in str(after.value)
    with pytest.raises(konduit.IdempotencyConflict):
        app.start_many([{"workflow": "pay", "input": {"amount": 3}, "idempotency_key": "new"},
                        {"workflow": "pay", "input": {"amount": 9}, "idempotency_key": "k2"}])
    with konduit.Client(db_url) as client, pytest.raises(konduit.IdempotencyConflict):
        client.start("pay", {"amount": 9}, idempotency_key="k2")
    assert counts(db_url) == (0, 2)  # the refused batch's new key was rolled back too

    # A new key beside a moved one creates only the new one.
    three, again = [h.id for h in app.start_many([
        {"workflow": "pay", "input": {"amount": 3}, "idempotency_key": "k3"},
        {"workflow": "pay", "input": {"amount": 1}, "idempotency_key": "k1"}])]
    assert again == one and three not in (one, two)
    assert counts(db_url) == (1, 2)


# -- starts racing the move -----------------------------------------------------------------


def old_start_sql() -> dict[str, tuple[str, bool | None]]:
    """The start's statements as they were before this fix: the insert without its look at the
    history, the lookup of a key's execution in the hot table only."""
    insert, prepare = queries.statement("execution_insert_many_with_roots")
    bare, n = re.subn(r"\n\s*-- A key whose execution moved.*?idempotency_key\)\)", "", insert,
                      flags=re.DOTALL)
    assert n == 1 and "konduit_history" not in bare
    lookup, lookup_prepare = queries.statement("execution_get_by_idempotency_keys")
    hot_only = lookup.split("UNION ALL")[0]
    assert "konduit_history" not in hot_only
    return {"execution_insert_many_with_roots": (bare, prepare),
            "execution_get_by_idempotency_keys": (hot_only, lookup_prepare)}


def unlocked(monkeypatch: pytest.MonkeyPatch, *, old_sql: bool) -> None:
    """Take the start's lock of its keys out (and, with ``old_sql``, the insert's look at the
    history and the lookup's): the control of the races below."""
    async def no_lock(tx: Any, batch: Any) -> None:
        return None

    monkeypatch.setattr(starts, "_lock_idempotency_keys", no_lock)
    if old_sql:
        for name, text in old_start_sql().items():
            monkeypatch.setitem(queries._STATEMENTS, name, text)


def race(app: konduit.App, db_url: str, clients: list[konduit.Client], trial: int, *,
         tolerate: bool = False) -> dict[str, Any]:
    """One trial: KEYS finished executions; STARTERS clients start the same keys (in a shuffled
    order each) while the move runs, all released by one barrier. Returns what each key ended
    with (its executions, hot and moved) and what each start returned."""
    keys = [f"t{trial}-k{j}" for j in range(KEYS)]
    original = finished(app, [{"workflow": "pay", "input": {"amount": j}, "idempotency_key": k}
                              for j, k in enumerate(keys)])
    moved_event = threading.Event()
    barrier = threading.Barrier(STARTERS + 1)
    returned: list[dict[str, UUID]] = []
    errors: list[BaseException] = []
    refused: list[konduit.KonduitError] = []  # tolerated in the control only
    moved: list[UUID] = []

    def starter(client: konduit.Client) -> None:
        # One start released with the move (spread over the move's span by a random pause of up
        # to JITTER: before it, against it, after it), and one more once the move ended.
        try:
            barrier.wait(WAIT)
            for then in (random.uniform(0, JITTER), None):
                if then is None:
                    assert moved_event.wait(WAIT)
                else:
                    time.sleep(then)
                order = list(enumerate(keys))
                random.shuffle(order)
                try:
                    handles = client.start_many([{"workflow": "pay", "input": {"amount": j},
                                                  "idempotency_key": k} for j, k in order])
                    returned.append({k: h.id for (_, k), h in zip(order, handles, strict=True)})
                except konduit.KonduitError as exc:
                    if not tolerate:
                        raise
                    refused.append(exc)
        except BaseException as exc:
            errors.append(exc)

    def mover() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                statement = q("execution_move_to_history_if_still_finished")
                barrier.wait(WAIT)
                moved.extend(r[0] for r in conn.execute(statement, {
                    "older_than_seconds": 0, "after_finished_at": None, "after_id": None,
                    "batch_size": 500}).fetchall())
        except BaseException as exc:
            errors.append(exc)
        finally:
            moved_event.set()

    threads = [threading.Thread(target=starter, args=(c,)) for c in clients]
    threads.append(threading.Thread(target=mover))
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return {"keys": keys, "original": dict(zip(keys, original, strict=True)),
            "executions": {k: executions_of(db_url, k) for k in keys},
            "returned": returned, "refused": refused, "moved": set(moved) & set(original),
            "in_history": {r[0] for r in rows(
                db_url, "SELECT id FROM konduit_history_executions WHERE id = ANY(%s)",
                original)}}


@pytest.fixture
def racing(make_app: Callable[..., konduit.App], db_url: str
           ) -> Iterator[tuple[konduit.App, list[konduit.Client]]]:
    app = make_app(pay())
    app.start("pay", {"amount": -1}, idempotency_key="warm")  # registers the workflow
    clients = [konduit.Client(db_url) for _ in range(STARTERS)]
    try:
        for c in clients:  # each opened and warmed (its definition read) before the races
            c.start("pay", {"amount": -1}, idempotency_key="warm")
        yield app, clients
    finally:
        for c in clients:
            c.close()


def test_starts_racing_the_move_never_make_a_second_execution_of_a_key(
        racing: tuple[konduit.App, list[konduit.Client]], db_url: str) -> None:
    app, clients = racing
    finished(app, [{"workflow": "pay", "input": {"amount": -2}}])
    partition_today(db_url)  # (see the test below: the day's partitions exist)
    moved_all = moved_some = moved_none = starts = 0
    for trial in range(TRIALS):
        got = race(app, db_url, clients, trial)
        for k in got["keys"]:
            assert got["executions"][k] == [got["original"][k]], (trial, k, got)
            assert all(r[k] == got["original"][k] for r in got["returned"]), (trial, k, got)
        assert len(got["returned"]) >= STARTERS and not got["refused"]
        starts += len(got["returned"])
        # Whatever the move skipped (a start held its key) stays hot, moved by a later pass.
        assert got["in_history"] == got["moved"], got
        moved_all += len(got["moved"]) == KEYS
        moved_some += 0 < len(got["moved"]) < KEYS
        moved_none += not got["moved"]
    print(f"moves: all keys {moved_all}, some {moved_some}, none {moved_none} of {TRIALS}; "
          f"{starts} start_many calls of {KEYS} keys")
    assert moved_all + moved_some > 0  # the races did meet moved executions


def test_control_without_the_starts_lock_and_history_check_the_race_makes_duplicates(
        racing: tuple[konduit.App, list[konduit.Client]], db_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    app, clients = racing
    unlocked(monkeypatch, old_sql=True)
    finished(app, [{"workflow": "pay", "input": {"amount": -2}}])
    partition_today(db_url)
    duplicated = 0
    for trial in range(TRIALS):
        got = race(app, db_url, clients, trial, tolerate=True)
        duplicated += any(len(got["executions"][k]) > 1 for k in got["keys"])
    print(f"trials with a duplicate execution: {duplicated} of {TRIALS}")
    assert duplicated > 0


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "control-unlocked"])
def test_a_start_waiting_on_a_moves_open_transaction_sees_the_moved_execution(
        make_app: Callable[..., konduit.App], db_url: str, monkeypatch: pytest.MonkeyPatch,
        locked: bool) -> None:
    """The narrow window, held open: the move deleted the hot row (and holds the key's lock) but
    has not committed when the start comes. With its lock, the start waits for the move and its
    insert then sees the history row. Without it (the control: the insert's look at the history
    kept), the insert waits on the deleted row, goes on once the move commits, and its snapshot,
    older than that commit, does not see the history: a second execution of the key."""
    app = make_app(pay())
    [original] = finished(app, [{"workflow": "pay", "input": {"amount": 1},
                                 "idempotency_key": "held"}])
    # The day's partitions exist already (as they do after a day's first move): a move that
    # makes them locks the history's tables, and a start would wait on that lock before its
    # insert's snapshot, which would then see the move.
    partition_today(db_url)
    if not locked:
        unlocked(monkeypatch, old_sql=False)
    with konduit.Client(db_url) as client, psycopg.connect(db_url) as mover:
        client.start("pay", {"amount": 0}, idempotency_key="warm")
        pid = mover.info.backend_pid
        moved = mover.execute(q("execution_move_to_history_if_still_finished"), {
            "older_than_seconds": 0, "after_finished_at": None, "after_id": None,
            "batch_size": 500}).fetchall()
        assert len(moved) == 1  # deleted from the hot table, not committed
        got: list[UUID] = []
        start = threading.Thread(target=lambda: got.append(
            client.start("pay", {"amount": 1}, idempotency_key="held").id))
        start.start()
        until(lambda: value(db_url, "SELECT count(*) FROM pg_stat_activity "
                            "WHERE %s = ANY(pg_blocking_pids(pid))", pid),
              WAIT, "the start to wait for the move")
        mover.commit()
        start.join(WAIT)
        assert not start.is_alive()
    found = executions_of(db_url, "held")
    if locked:
        assert got == [original] and found == [original]
    else:
        assert len(found) == 2 and got[0] != original  # the duplicate payment


# -- child workflows ------------------------------------------------------------------------


def family() -> list[konduit.Workflow]:
    """A parent whose child-workflow step's child ends at once, then waits for an event (it
    keeps running while its child moves into the history)."""
    child = konduit.Workflow("charge-card", version=1)

    @child.step()
    def charge(ctx: Any) -> dict[str, Any]:
        return {"charged": ctx.input["amount"]}

    parent = konduit.Workflow("checkout", version=1)
    parent.subworkflow(name="pay", workflow="charge-card", input=lambda ctx: ctx.input)
    parent.wait_for_event("shipped", name="ship", after=["pay"])
    return [child, parent]


def test_a_parent_starting_its_child_again_after_the_child_moved_starts_no_second_child(
        make_app: Callable[..., konduit.App], db_url: str) -> None:
    """The arming of a child-workflow step run again for the same task (its child's key is the
    task's, konduit-child:<task id>): the statement the arm runs returns the moved child, and
    starts none."""
    app = make_app(*family())
    with running_worker(app, poll_interval=0.05):
        parent = app.start("checkout", {"amount": 5})
        until(lambda: value(db_url, "SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                            "AND step = 'ship' AND status = 'waiting'", parent.id),
              WAIT, "the parent to wait for its event, its child done")
    [(child, key, task_id)] = rows(
        db_url, "SELECT c.id, c.idempotency_key, t.id FROM konduit_executions c "
        "JOIN konduit_tasks t ON t.wait_child = c.id WHERE c.workflow_name = 'charge-card'")
    assert key == child_idempotency_key(task_id)
    assert move(db_url) == 1  # the child, finished; its parent still runs
    assert counts(db_url) == (1, 1)

    async def arm_again() -> UUID:
        client = await app.client_async()
        prepared = await starts.prepare_off_loop(app.registry, konduit.StartRequest(
            "charge-card", {"amount": 5}, idempotency_key=child_idempotency_key(task_id)),
            max_bytes=client.max_payload_bytes)
        [again] = await client.db.atomic(lambda tx: starts.insert_executions(tx, [prepared]))
        return again

    assert app._run(arm_again()) == child
    assert counts(db_url) == (1, 1)
    assert rows(db_url, "SELECT id FROM konduit_executions_all "
                "WHERE workflow_name = 'charge-card'") == [(child,)]
