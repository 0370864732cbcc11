"""Starting executions set-based: a start costs a fixed number of statements however many roots
its workflow has, and ``start_many`` starts thousands of executions in one transaction with
idempotency keys honoured exactly like ``start``, all or nothing.

Statements are counted by wrapping the real ``Tx`` (every named query goes through it) on the
real database.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.db.database import Database, Tx
from konduit.engine.client import Client
from konduit.engine.registry import Registry
from tests.support.payloads import opened_rows
from tests.support.workers import running_worker

pytestmark = [pytest.mark.storage]

WAIT = 60.0
"""Bound for work expected to finish in seconds: only reached when something is broken."""


def fan(name: str, roots: int, *, queue: str = "default", version: int = 1) -> konduit.Workflow:
    """``roots`` no-op root steps and one join after all of them."""
    wf = konduit.Workflow(name, version=version)

    async def branch(ctx: Any) -> int:
        return 1

    async def join(ctx: Any) -> dict[str, Any]:
        return {"sum": sum(ctx.upstream.values()), "input": ctx.input}

    names = [f"r{i}" for i in range(roots)]
    for n in names:
        wf.step(name=n, queue=queue)(branch)
    wf.step(name="join", after=names, queue=queue)(join)
    return wf


@contextmanager
def counted() -> Iterator[Counter[str]]:
    """Count the named statements run through any ``Tx`` (all threads) during the block."""
    calls: Counter[str] = Counter()
    originals = {m: getattr(Tx, m) for m in ("one", "all", "run", "send", "later")}

    def wrap(method: Any) -> Any:
        async def counting(self: Tx, query: str, /, **params: Any) -> Any:
            calls[query] += 1
            return await method(self, query, **params)
        return counting

    for name, method in originals.items():
        setattr(Tx, name, wrap(method))
    try:
        yield calls
    finally:
        for name, method in originals.items():
            setattr(Tx, name, method)


def scalar(db_url: str, sql: str, *params: Any) -> Any:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row[0]


def stored(db_url: str) -> tuple[int, int, int]:
    """(executions, steps, tasks) rows in the database."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM konduit_executions), (SELECT count(*) FROM konduit_steps),"
            " (SELECT count(*) FROM konduit_tasks)"
        ).fetchone()
        assert row is not None
        return row


def wait_all_finished(db_url: str, count: int, timeout: float = WAIT) -> dict[str, int]:
    """Poll until ``count`` executions have finished (bounded); their statuses."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(db_url) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM konduit_executions GROUP BY status"
            ).fetchall()
        statuses = {s: n for s, n in rows}
        if sum(n for s, n in statuses.items() if s not in ("running", "pending")) >= count:
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"still unfinished after {timeout} s: {statuses}")
        time.sleep(0.2)


# -- one round trip per start -------------------------------------------------------------------


def test_a_start_makes_the_same_few_statements_for_5_roots_as_for_500(make_app, db_url):
    app = make_app(fan("five", 5), fan("wide", 500))
    app.start("five"), app.start("wide")  # the first start of each registers its workflow
    with counted() as small:
        app.start("five", input={"n": 1})
    with counted() as big:
        handle = app.start("wide", input={"n": 2})
    assert big == small, (big, small)
    assert sum(big.values()) <= 2, big  # today: one, the insert; + one lookup on a reused key
    steps = {s.step: s for s in app.steps(handle)}
    assert len(steps) == 501
    assert {s.status for n, s in steps.items() if n != "join"} == {"active"}
    assert steps["join"].status == "waiting" and steps["join"].up_pending == 500
    tasks = app.tasks(handle)
    assert sorted(t.step for t in tasks) == sorted(f"r{i}" for i in range(500))
    assert {t.status for t in tasks} == {"ready"}


def test_a_join_firing_500_steps_creates_their_tasks_in_one_statement(make_app, db_url):
    wf = konduit.Workflow("spread", version=1)

    @wf.step()
    async def seed(ctx):
        return 1

    children = [f"c{i}" for i in range(300)]
    for c in children:
        wf.step(name=c, after=["seed"])(lambda ctx: ctx.upstream["seed"])

    @wf.step(after=children)
    async def total(ctx):
        return sum(ctx.upstream.values())

    app = make_app(wf)
    with counted() as calls, running_worker(app, concurrency=8):
        result = app.start("spread").wait(timeout=WAIT)
    assert result.output == 300
    # seed's completion fires 300 steps: one insert for all of them, one more for the join
    assert calls["task_insert_many"] == 2, calls


# -- start_many ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_start_many_of_1000_executions_runs_them_all(make_app, db_url):
    # Five roots, not twenty: the point is 1,000 executions from one insert, all of them run;
    # 21,000 tasks took 28-139 s of the suite (the in-process worker's speed), 6,000 a third.
    app = make_app(fan("five", 5))
    app.list(limit=1)  # the pool is open
    with counted() as calls:
        handles = app.start_many(
            [konduit.StartRequest("five", input={"i": i}) for i in range(1000)]
        )
    assert len(handles) == 1000 and len({h.id for h in handles}) == 1000
    # ids in request order, and time-ordered: the claim drains the oldest execution first
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    assert all(h.id.version == 7 for h in handles)
    # the workflow's registration (once per process), then one insert: not one per execution
    assert calls == Counter(workflow_insert_if_absent=1, workflow_get_for_update=1,
                            execution_insert_many_with_roots=1), calls
    assert stored(db_url) == (1000, 6_000, 5_000)
    with running_worker(app, concurrency=16, poll_interval=0.05):
        # 6,000 tasks: bounded by the worker's speed, not by the start
        statuses = wait_all_finished(db_url, 1000, timeout=300)
    assert statuses == {"succeeded": 1000}
    assert handles[7].status().output == {"sum": 5, "input": {"i": 7}}
    assert scalar(db_url, "SELECT count(*) FROM konduit_tasks WHERE status = 'succeeded'") == 6_000


def test_dicts_and_requests_mix_and_every_option_is_honoured(make_app, db_url):
    old = fan("versioned", 2, version=1)
    new = fan("versioned", 3, version=2)
    app = make_app(old, new, fan("other", 4, queue="side"))
    started_before = scalar(db_url, "SELECT clock_timestamp()")
    deadline = started_before.replace(year=started_before.year + 1)
    handles = app.start_many([
        {"workflow": "versioned", "input": [1]},
        konduit.StartRequest("other", input="x", timeout="1h"),
        {"workflow": "versioned", "version": 1, "deadline_at": deadline},
        konduit.StartRequest("versioned", input=None, idempotency_key="k"),
    ])
    rows = {}
    with psycopg.connect(db_url) as conn:
        for h in handles:
            rows[h.id] = conn.execute(
                "SELECT workflow_name, workflow_version, input, idempotency_key, steps_pending,"
                " deadline_at, timeout_at - created_at AS timeout FROM konduit_executions"
                " WHERE id = %s", (h.id,)).fetchone()
    got = [opened_rows([rows[h.id]])[0] for h in handles]
    assert [g[:5] for g in got] == [
        ("versioned", 2, [1], None, 4),
        ("other", 1, "x", None, 5),
        ("versioned", 1, None, None, 3),
        ("versioned", 2, None, "k", 4),
    ]
    assert got[2][5] == deadline and got[0][5] is None
    assert 3590 < got[1][6].total_seconds() < 3610 and got[0][6] is None
    side = [t for t in app.tasks(handles[1])]
    assert len(side) == 4 and {t.step for t in side} == {"r0", "r1", "r2", "r3"}
    assert scalar(db_url, "SELECT count(DISTINCT queue) FROM konduit_tasks") == 2
    with running_worker(app, concurrency=8, queues=("default", "side")):
        outputs = [h.wait(timeout=WAIT).output for h in handles]
    assert outputs == [{"sum": 3, "input": [1]}, {"sum": 4, "input": "x"},
                       {"sum": 2, "input": None}, {"sum": 3, "input": None}]


def test_an_empty_list_starts_nothing_and_asks_nothing(make_app, db_url):
    app = make_app(fan("any", 2))
    app.list(limit=1)  # the pool is open
    with counted() as calls:
        assert app.start_many([]) == []
        assert app.start_many(iter(())) == []
    assert not calls and stored(db_url) == (0, 0, 0)


# -- idempotency --------------------------------------------------------------------------------


def test_a_key_repeated_in_one_batch_gives_one_execution(make_app, db_url):
    app = make_app(fan("idem", 2))
    handles = app.start_many([
        konduit.StartRequest("idem", input={"a": 1, "b": 2}, idempotency_key="k1"),
        konduit.StartRequest("idem", input={"a": 1}),
        konduit.StartRequest("idem", input={"b": 2, "a": 1}, idempotency_key="k1"),  # same JSON
        konduit.StartRequest("idem", input={"a": 1}, idempotency_key="k2"),
    ])
    ids = [h.id for h in handles]
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert stored(db_url) == (3, 9, 6)


def test_a_key_used_before_returns_that_execution_across_batches_and_start(make_app, db_url):
    app = make_app(fan("idem", 2))
    first = app.start_many([konduit.StartRequest("idem", input=i, idempotency_key=f"k{i}")
                            for i in range(3)])
    single = app.start("idem", input=5, idempotency_key="k5")
    again = app.start_many([
        konduit.StartRequest("idem", input=9, idempotency_key="k9"),  # new
        konduit.StartRequest("idem", input=1, idempotency_key="k1"),  # from the first batch
        konduit.StartRequest("idem", input=5, idempotency_key="k5"),  # from start()
        konduit.StartRequest("idem", input=9, idempotency_key="k9"),  # repeated in this batch
    ])
    assert again[1].id == first[1].id and again[2].id == single.id
    assert again[0].id == again[3].id and again[0].id not in {h.id for h in first}
    assert app.start("idem", input=0, idempotency_key="k0").id == first[0].id
    assert stored(db_url)[0] == 5  # k0 k1 k2 k5 k9


def test_a_key_reused_with_another_input_fails_the_whole_batch(make_app, db_url):
    app = make_app(fan("idem", 2))
    app.start("idem", input={"amount": 10}, idempotency_key="order-7")
    before = stored(db_url)
    with pytest.raises(konduit.IdempotencyConflict) as info:
        app.start_many([
            konduit.StartRequest("idem", input=1),
            konduit.StartRequest("idem", input={"amount": 11}, idempotency_key="order-7"),
            konduit.StartRequest("idem", input=2, idempotency_key="new"),
        ])
    assert "'order-7'" in str(info.value) and "different input" in str(info.value)
    assert stored(db_url) == before  # atomic: the other two were not started either
    with pytest.raises(konduit.IdempotencyConflict) as info:
        app.start_many([
            konduit.StartRequest("idem", input=1, idempotency_key="twice"),
            konduit.StartRequest("idem", input=2, idempotency_key="twice"),
        ])
    assert "'twice'" in str(info.value) and "requests 0 and 1" in str(info.value)
    assert stored(db_url) == before


def test_a_batch_waits_for_a_concurrent_batch_holding_its_keys_and_returns_its_executions(
    db_url: str,
):
    """B's insert meets A's uncommitted keys: it waits, and when A commits it must find A's
    executions by a fresh read (its own statement's snapshot predates A's commit)."""
    wf = fan("race", 2)

    async def go() -> None:
        db = Database(db_url, max_size=4)
        await db.open()
        client = Client(db, Registry([wf]))
        await client.register_all()
        original = Tx.one
        inserted, release = asyncio.Event(), asyncio.Event()
        held: list[bool] = []

        async def pausing(self: Tx, query: str, /, **params: Any) -> Any:
            row = await original(self, query, **params)
            if query == "execution_insert_many_with_roots" and not held:
                held.append(True)  # only A's transaction pauses, after its insert
                inserted.set()
                await release.wait()
            return row

        keys = [f"k{i}" for i in range(5)]
        try:
            Tx.one = pausing  # type: ignore[method-assign]
            a = asyncio.create_task(client.start_many(
                [konduit.StartRequest("race", input=k, idempotency_key=k) for k in keys]))
            await asyncio.wait_for(inserted.wait(), WAIT)
            b = asyncio.create_task(client.start_many(
                [konduit.StartRequest("race", input=k, idempotency_key=k)
                 for k in reversed(keys)] + [konduit.StartRequest("race", input="own")]))
            conflicting = asyncio.create_task(client.start_many(
                [konduit.StartRequest("race", input="other", idempotency_key="k3")]))
            await asyncio.to_thread(wait_for_lock_waiters, db_url, 2)
            assert not b.done()
            release.set()
            a_ids = await asyncio.wait_for(a, WAIT)
            b_ids = await asyncio.wait_for(b, WAIT)
            with pytest.raises(konduit.IdempotencyConflict, match="'k3'"):
                await asyncio.wait_for(conflicting, WAIT)
        finally:
            Tx.one = original  # type: ignore[method-assign]
            await db.close()
        assert b_ids[:5] == list(reversed(a_ids))
        assert b_ids[5] not in a_ids
        assert stored(db_url)[0] == 6

    asyncio.run(go())


def wait_for_lock_waiters(db_url: str, count: int, timeout: float = WAIT) -> None:
    """Poll until ``count`` backends of this database wait on a lock (bounded)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0] >= count:
                return
            time.sleep(0.01)
    raise AssertionError(f"fewer than {count} backends ever waited on a lock")


# -- bad requests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        ({"workflow": "ok", "input": {1, 2}}, konduit.PayloadError, "not JSON-serializable"),
        ({"workflow": "ok", "input": "\x00"}, konduit.PayloadError, "NUL"),
        ({"workflow": "nope"}, konduit.WorkflowNotFound, "unknown workflow 'nope'"),
        ({"workflow": "ok", "version": 9}, konduit.WorkflowNotFound, "version 9"),
        ({"workflow": "ok", "timeout": "soon"}, konduit.KonduitError, "timeout"),
        ({"workflow": "ok", "inptu": 1}, konduit.KonduitError, "unknown field(s) inptu"),
        ({"input": 1}, konduit.KonduitError, "needs a 'workflow'"),
        (("ok", 1), konduit.KonduitError, "not tuple"),
    ],
)
def test_a_bad_request_names_its_index_and_nothing_is_stored(make_app, db_url, bad, error, words):
    app = make_app(fan("ok", 3))
    app.start("ok")
    before = stored(db_url)
    requests: list[Any] = [konduit.StartRequest("ok", input=i) for i in range(5)]
    requests.insert(3, bad)
    with pytest.raises(error) as info:
        app.start_many(requests)
    message = str(info.value)
    assert message.startswith("start request 3: "), message
    assert words in message, message
    assert stored(db_url) == before


def test_an_oversized_input_in_a_batch_is_refused_before_anything_is_written(make_app, db_url):
    app = make_app(fan("ok", 1), max_payload_bytes=1000)
    app.list(limit=1)  # the pool is open
    requests = [konduit.StartRequest("ok", input="x" * 10) for _ in range(2000)]
    requests[1500] = konduit.StartRequest("ok", input="x" * 2000)
    with counted() as calls, pytest.raises(konduit.PayloadError, match=r"^start request 1500: "):
        app.start_many(requests)
    assert not calls and stored(db_url) == (0, 0, 0)


def test_start_keeps_its_own_messages(make_app, db_url):
    app = make_app(fan("ok", 1))
    with pytest.raises(konduit.PayloadError, match=r"^input of workflow 'ok' is not JSON"):
        app.start("ok", input=object())
    with pytest.raises(konduit.WorkflowNotFound, match=r"^unknown workflow 'nope'"):
        app.start("nope")


def test_a_batch_bigger_than_one_statement_is_still_one_transaction(make_app, db_url, monkeypatch):
    from konduit.engine import starts

    monkeypatch.setattr(starts, "BATCH_ROWS", 10)
    app = make_app(fan("ok", 2))
    app.start("ok", input="taken", idempotency_key="late")
    requests = [konduit.StartRequest("ok", input=i) for i in range(35)]
    with counted() as calls:
        handles = app.start_many(requests)
    assert calls["execution_insert_many_with_roots"] == 4
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    assert stored(db_url)[0] == 36
    # a conflict found in the last statement rolls back the statements before it
    requests.append(konduit.StartRequest("ok", input="other", idempotency_key="late"))
    with pytest.raises(konduit.IdempotencyConflict, match="'late'"):
        app.start_many(requests)
    assert stored(db_url)[0] == 36


def test_execution_ids_are_uuids_in_request_order(make_app, db_url):
    app = make_app(fan("ok", 1))
    ids = [h.id for h in app.start_many([{"workflow": "ok"}] * 50)]
    assert all(isinstance(i, UUID) and i.version == 7 for i in ids)
    assert ids == sorted(ids)
    created = scalar(db_url, "SELECT array_agg(id ORDER BY id) FROM konduit_executions")
    assert created == ids


def test_names_and_queues_that_are_tricky_in_an_array_literal_survive_the_template(
    make_app, db_url
):
    # step names are identifiers ("NULL" unquoted would be a null); queues are any text
    steps = ["NULL", "null", "a.b-c", "_"]
    queues = ['a"b', "c\\d", "e,f", "{g}", " h ", "ü\u00a0"]
    wf = konduit.Workflow("odd", version=1)
    for step, queue in zip(steps, queues, strict=False):
        wf.step(name=step, queue=queue)(lambda ctx: 1)
    wf.step(name="join", after=steps, queue="NULL")(lambda ctx: sorted(ctx.upstream))
    app = make_app(wf)
    [handle] = app.start_many([{"workflow": "odd"}])
    assert sorted(s.step for s in app.steps(handle)) == sorted([*steps, "join"])
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT step, queue FROM konduit_tasks WHERE execution_id = %s",
                            (handle.id,)).fetchall()
    assert sorted(rows) == sorted(zip(steps, queues, strict=False))
    with running_worker(app, concurrency=4, queues=[*queues, "NULL"]):
        assert handle.wait(timeout=WAIT).output == sorted(steps)
