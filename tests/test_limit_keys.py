"""Limits per key: ``step(concurrency=konduit.Limit(2, key=...))``, ``rate=konduit.Rate(...,
key=...)`` and ``Workflow(max_running=N, key=...)`` (migration 0026, docs/many-customers.md).

Checked here, on real PostgreSQL:

- definitions and bad key functions: a key function that raises or returns a non-string
  refuses that start, naming the workflow, the step and the function; nothing is written and a
  running worker is unaffected;
- keys are stored on every task of a keyed step (roots, later steps, map items);
- claimers released together by a barrier on a key limited to 1 never run two of it (the test
  fails with the key row lock removed);
- two real worker processes: a per-key concurrency of 2 is never exceeded for any of 20 keys
  (handler start/end times written to a table) while the keys run side by side; a per-key rate
  of 2/s never has 3 starts within a second for any key (attempt start times);
- max_running: racing starts (threads released by a barrier, many trials) never leave more than
  N running per key; pending executions start in start order as slots free (a finish fills
  the slot in its own transaction); a repaired or redriven execution takes a slot again, one
  started before the workflow had max_running too (its key computed then: none, a path, a
  function), under a real worker, from the App and from a code-less Client;
- a million keys cost storage, not claim time: with 200,000 idle key rows and 200,000 finished
  keyed tasks, the claim's lock statement touches a few buffers (EXPLAIN ANALYZE BUFFERS);
- idle key rows are retired by the maintenance pass, their throttled time kept on the step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import psycopg
import pytest

import konduit
from konduit.core.flow import FlowLimit, KeyContext, parse_flow_limit
from konduit.db.database import Database
from konduit.db.queries import q
from konduit.engine import later, limit_keys, transitions
from konduit.errors import KeyNeedsCode, LimitKeyError, WorkflowDefinitionError
from konduit.observe.metrics import metric_families
from konduit.observe.stats import load_stats, stats_renderables
from konduit.web import create_app, database_client
from tests.support.browser import serving
from tests.support.workers import running_worker, spawn_worker, stop_workers

pytestmark = pytest.mark.storage


def _customer(ctx: KeyContext) -> str:
    return str(ctx.input["customer"])


# -- definitions -----------------------------------------------------------------------------


def test_limits_per_key_are_read_at_definition():
    limit = parse_flow_limit(konduit.Limit(2, key=_customer), None)
    assert limit == FlowLimit(2, None, None) and limit is not None and limit.key is _customer
    both = parse_flow_limit(konduit.Limit(2, key=_customer), konduit.Rate("5/s", key=_customer))
    assert both is not None and (both.concurrency, both.rate, both.keyed) == (2, "5/s", True)
    plain = parse_flow_limit(konduit.Limit(3), konduit.Rate("1/m"))
    assert plain == FlowLimit(3, 1, 60.0) and plain is not None and not plain.keyed
    with pytest.raises(ValueError, match="must use the same key"):
        parse_flow_limit(konduit.Limit(2, key=_customer), konduit.Rate("5/s", key=lambda c: "x"))
    with pytest.raises(ValueError, match="all per key or all for the whole step"):
        parse_flow_limit(konduit.Limit(2, key=_customer), "5/s")
    with pytest.raises(ValueError, match="concurrency must be a positive integer"):
        parse_flow_limit(konduit.Limit(0, key=_customer), None)
    wf = konduit.Workflow("keys-def", version=1)
    with pytest.raises(WorkflowDefinitionError, match=r"step 'x'.*a key path looks like"):
        wf.step(name="x", concurrency=konduit.Limit(2, key="customer"))(lambda ctx: 1)
    with pytest.raises(WorkflowDefinitionError, match=r"step 'x'.*a limit's key is a path"):
        wf.step(name="x", concurrency=konduit.Limit(2, key=7))(lambda ctx: 1)  # type: ignore[arg-type]
    same = parse_flow_limit(konduit.Limit(2, key="input.c"), konduit.Rate("5/s", key="input.c"))
    assert same is not None and same.keyed
    with pytest.raises(WorkflowDefinitionError, match="max_running must be a positive integer"):
        konduit.Workflow("keys-def", max_running=0)
    with pytest.raises(WorkflowDefinitionError, match="key= needs max_running="):
        konduit.Workflow("keys-def", key=lambda i: i)
    # Keyed or not is part of the shape (which claim takes the tasks); the values are not.
    def build(concurrency: Any) -> konduit.Workflow:
        w = konduit.Workflow("keys-hash", version=1)
        w.step(name="a", concurrency=concurrency)(lambda ctx: 1)
        return w
    assert build(konduit.Limit(2, key=_customer)).spec.spec_hash == \
        build(konduit.Limit(5, key=_customer)).spec.spec_hash
    assert build(konduit.Limit(2, key=_customer)).spec.spec_hash != build(2).spec.spec_hash


def _bad_keys() -> list[konduit.Workflow]:
    def explode(ctx: KeyContext) -> str:
        raise RuntimeError("no customer")

    def exits(ctx: KeyContext) -> str:
        raise SystemExit(3)

    out = []
    for name, fn in (("keys-raises", explode), ("keys-exits", exits),
                     ("keys-number", lambda ctx: 42)):
        w = konduit.Workflow(name, version=1)
        w.step(name="charge", concurrency=konduit.Limit(1, key=fn))(lambda ctx: 1)
        out.append(w)
    mr = konduit.Workflow("keys-run-raises", version=1, max_running=1,
                          key=lambda i: i["missing"])
    mr.step(name="only")(lambda ctx: 1)
    return [*out, mr]


def test_a_bad_key_function_refuses_its_start_and_the_worker_runs_on(db_url):
    good = konduit.Workflow("keys-good", version=1)
    good.step(name="charge", concurrency=konduit.Limit(1, key=_customer))(lambda ctx: "ok")
    app = konduit.App([good, *_bad_keys()], database_url=db_url)
    try:
        with running_worker(app, concurrency=2):
            for name, says in (("keys-raises", "raised RuntimeError: no customer"),
                               ("keys-exits", "raised SystemExit: 3"),
                               ("keys-number", "returned int 42, not a string")):
                with pytest.raises(LimitKeyError) as err:
                    app.start(name, input={"customer": "c1"})
                assert f"workflow {name!r}, step 'charge'" in str(err.value)
                assert says in str(err.value) and "the key function" in str(err.value)
            with pytest.raises(LimitKeyError, match=r"'keys-run-raises', max_running key.*"
                                                     r"KeyError"):
                app.start("keys-run-raises", input={})
            # Nothing was written for them, and the worker serves the good workflow.
            assert app.start("keys-good", input={"customer": "c1"}).wait(timeout=30).output \
                == "ok"
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT array_agg(DISTINCT workflow_name) FROM "
                                "konduit_executions").fetchone() == (["keys-good"],)
    finally:
        app.close()


def test_keys_are_stored_on_every_task_of_a_keyed_step(db_url):
    wf = konduit.Workflow("keys-stored", version=1)

    @wf.step(concurrency=konduit.Limit(2, key=_customer))
    def first(ctx: konduit.Context) -> list[int]:
        return [1, 2, 3]

    @wf.map(after=[first], over=lambda xs: xs, rate=konduit.Rate("100/s", key=_customer))
    def each(ctx: konduit.Context) -> int:
        return int(ctx.item)

    @wf.step(after=[each])
    def plain(ctx: konduit.Context) -> str:
        return "done"

    app = konduit.App([wf], database_url=db_url)
    try:
        with running_worker(app, concurrency=4):
            handle = app.start("keys-stored", input={"customer": "acme"})
            assert handle.wait(timeout=30).output == "done"
        with psycopg.connect(db_url) as conn:
            rows = conn.execute("SELECT step, limit_key, limited FROM konduit_tasks "
                                "ORDER BY step, map_index").fetchall()
            # An execution with no key for a keyed step (migrated from a version where it was
            # not keyed) gets the shared key '': never a keyed task out of every claim's reach.
            fallback = conn.execute(
                "SELECT konduit_limit_key(NULL, 'keys-stored@1', 'first'),"
                "       konduit_limit_key('{}', 'keys-stored@1', 'plain')").fetchone()
    finally:
        app.close()
    assert rows == [("each", "acme", True)] * 3 + [("first", "acme", True),
                                                    ("plain", None, False)]
    assert fallback == ("", None)


# -- across worker processes -----------------------------------------------------------------


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(b, 1) for b, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def test_claimers_released_together_never_run_two_of_a_key_limited_to_one(db_url):
    wf = konduit.Workflow("keys-collide", version=1)
    wf.step(name="call", concurrency=konduit.Limit(1, key=_customer))(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)
    claimers, trials = 6, 8
    try:
        app.start_many([{"workflow": "keys-collide", "input": {"customer": f"t{trial}"}}
                         for trial in range(trials) for _ in range(claimers)])
    finally:
        app.close()

    async def main() -> None:
        db = Database(db_url, max_size=claimers + 1)
        await db.open()
        try:
            for _ in range(trials):
                barrier = asyncio.Barrier(claimers)

                async def one(barrier: asyncio.Barrier = barrier) -> None:
                    async def body(tx: Any) -> None:
                        await barrier.wait()  # every claimer in its transaction, then all at once
                        await transitions.claim(
                            tx, queues=["default"], workflows=["keys-collide@1"], limit=4,
                            lease_seconds=30, worker_id="w", limited=True,
                            key_cursors=transitions.KeyCursors())
                    await db.atomic(body)

                await asyncio.gather(*(one() for _ in range(claimers)))
        finally:
            await db.close()

    asyncio.run(main())
    with psycopg.connect(db_url) as conn:
        running = dict(conn.execute("SELECT limit_key, count(*) FROM konduit_tasks "
                                    "WHERE status = 'running' GROUP BY 1").fetchall())
    # Each key had 6 ready tasks and 6 claimers racing: exactly one of them ran per key.
    assert running == {f"t{trial}": 1 for trial in range(trials)}, running


@pytest.mark.slow
def test_per_key_limits_hold_across_two_worker_processes(db_url):
    from tests.apps import key_limits_app

    # 19 keys with 3 executions each and one hot key with 24: 8 slots in all (2 x 4), so
    # both processes claim, and the hot key always has more ready tasks than its limit.
    keys = [f"c{k:02}" for k in range(19)] + ["hot"]
    count = {k: 24 if k == "hot" else 3 for k in keys}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE key_spans (key text, began float8, ended float8)")
    app = konduit.App([key_limits_app.wf, key_limits_app.rated], database_url=db_url)
    workers = [spawn_worker("tests.apps.key_limits_app:app", db_url, concurrency=4,
                            poll_interval=0.5) for _ in range(2)]
    try:
        # All at once: every key has a backlog for the workers to hold back.
        handles = app.start_many([{"workflow": "key-limits",
                                   "input": {"customer": k, "dsn": db_url}}
                                  for k in keys for _ in range(count[k])])
        rated = app.start_many([{"workflow": "key-rates", "input": {"customer": f"r{k}"}}
                                for _ in range(6) for k in range(3)])
        for h in [*handles, *rated]:
            assert h.wait(timeout=120).status == "succeeded"
    finally:
        stop_workers(workers)
        app.close()
    with psycopg.connect(db_url) as conn:
        spans = conn.execute("SELECT key, began, ended FROM key_spans").fetchall()
        starts = conn.execute("""
            SELECT t.limit_key, a.started_at FROM konduit_attempts a
            JOIN konduit_tasks t ON t.id = a.task_id
            WHERE t.workflow = 'key-rates@1' ORDER BY a.started_at""").fetchall()
        claimers = conn.execute("""
            SELECT count(DISTINCT a.worker_id) FROM konduit_attempts a
            JOIN konduit_tasks t ON t.id = a.task_id WHERE t.limit_key IS NOT NULL""").fetchone()
    by_key: dict[str, list[tuple[float, float]]] = {}
    for key, began, ended in spans:
        by_key.setdefault(key, []).append((began, ended))
    assert {k: len(s) for k, s in by_key.items()} == count
    most = {key: _most_at_once(s) for key, s in by_key.items()}
    assert max(most.values()) == 2 == most["hot"], most  # never 3 of a key; the limit was used
    # Keys side by side: more at once than one key may run (a loaded machine leaves fewer
    # than the 8 slots busy).
    assert _most_at_once([(b, e) for _, b, e in spans]) >= 3
    assert claimers == (2,)  # both processes claimed keyed tasks
    rate_starts: dict[str, list[Any]] = {}
    for key, at in starts:
        rate_starts.setdefault(key, []).append(at)
    assert sorted(rate_starts) == ["r0", "r1", "r2"]
    for key, at in rate_starts.items():
        gaps = [(at[i + 2] - at[i]).total_seconds() for i in range(len(at) - 2)]
        assert min(gaps) >= 1.0, (key, gaps)  # never 3 starts of one key within a second


# -- max_running -----------------------------------------------------------------------------


def _statuses(url: str, workflow: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT run_key, status FROM konduit_executions "
                            "WHERE workflow_name = %s ORDER BY created_at, id",
                            (workflow,)).fetchall()
    out: dict[str, list[str]] = {}
    for key, status in rows:
        out.setdefault(key, []).append(status)
    return out


def test_max_running_holds_under_racing_starts(db_url):
    wf = konduit.Workflow("mr-race", version=1, max_running=2, key=lambda i: i["k"])
    wf.step(name="only")(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)
    racers, trials = 6, 12
    try:
        app.start("mr-race", input={"k": "warm-up"})  # registered before the races
        for trial in range(trials):
            barrier = threading.Barrier(racers)
            errors: list[BaseException] = []

            def race(key: str = f"t{trial}", barrier: threading.Barrier = barrier,
                     errors: list[BaseException] = errors) -> None:
                try:
                    barrier.wait()
                    app.start("mr-race", input={"k": key})
                except BaseException as exc:  # reported below
                    errors.append(exc)

            threads = [threading.Thread(target=race) for _ in range(racers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors
        statuses = _statuses(db_url, "mr-race")
    finally:
        app.close()
    for trial in range(trials):
        got = statuses[f"t{trial}"]
        assert sorted(got) == ["pending"] * (racers - 2) + ["running"] * 2, (trial, got)


def test_pending_executions_start_in_order_when_slots_free(db_url):
    wf = konduit.Workflow("mr-order", version=1, max_running=1, key=lambda i: i["k"])

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return int(ctx.input["n"])

    app = konduit.App([wf], database_url=db_url)
    try:
        ids = [app.start("mr-order", input={"k": "a", "n": n}).id for n in range(5)]
        other = app.start("mr-order", input={"k": "b", "n": 9}).id
        assert _statuses(db_url, "mr-order") == {"a": ["running"] + ["pending"] * 4,
                                                 "b": ["running"]}
        # A pending execution's tasks are out of every claim's reach until it starts.
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM konduit_tasks t JOIN konduit_executions e "
                                "ON e.id = t.execution_id WHERE e.status = 'pending' "
                                "AND NOT t.limited").fetchone() == (0,)
        # Each cancel frees the slot in its own transaction: the oldest pending one starts.
        for n in range(2):
            assert app.cancel(ids[n])
            assert _statuses(db_url, "mr-order")["a"] == (
                ["cancelled"] * (n + 1) + ["running"] + ["pending"] * (3 - n))
        # A pending execution can be cancelled too (it frees nothing).
        assert app.cancel(ids[4])
        with running_worker(app, concurrency=2):
            outputs = [app.wait(i, timeout=30).output for i in (ids[2], ids[3], other)]
        assert outputs == [2, 3, 9]
        with psycopg.connect(db_url) as conn:
            done = [r[0] for r in conn.execute(
                "SELECT (input->>'n')::int FROM konduit_executions WHERE status = 'succeeded' "
                "AND run_key = 'a' ORDER BY finished_at").fetchall()]
        assert done == [2, 3]  # in start order, one at a time
    finally:
        app.close()


def test_a_redriven_execution_takes_a_slot_of_its_key_again(db_url):
    """Running again (redrive, repair) takes a slot as a start does: with its key's slots
    taken it waits pending, its new tasks set aside, and starts when a slot frees; with the
    key's row retired meanwhile (idle keys), the row is made again."""
    wf = konduit.Workflow("mr-redrive", version=1, max_running=1, key=lambda i: i["k"])

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return int(ctx.input["n"])

    app = konduit.App([wf], database_url=db_url)
    try:
        first = app.start("mr-redrive", input={"k": "a", "n": 1}).id
        assert app.cancel(first)
        second = app.start("mr-redrive", input={"k": "a", "n": 2}).id
        assert _statuses(db_url, "mr-redrive") == {"a": ["cancelled", "running"]}
        assert app.redrive(first) == ["only"]
        assert _statuses(db_url, "mr-redrive") == {"a": ["pending", "running"]}
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                                "AND status = 'ready' AND NOT limited",
                                (first,)).fetchone() == (0,)
        # The running one's end frees the slot: the redriven one starts in that transaction.
        assert app.cancel(second)
        assert _statuses(db_url, "mr-redrive") == {"a": ["running", "cancelled"]}
        # The key's row retired while nothing of it ran: a redrive makes it again.
        assert app.cancel(first)
        with psycopg.connect(db_url) as conn:
            conn.execute("DELETE FROM konduit_run_slots WHERE workflow_name = 'mr-redrive'")
        assert app.redrive(second) == ["only"]
        assert _statuses(db_url, "mr-redrive") == {"a": ["cancelled", "running"]}
        assert app.redrive(first) == ["only"]
        assert _statuses(db_url, "mr-redrive") == {"a": ["pending", "running"]}
        with running_worker(app, concurrency=2):
            assert [app.wait(i, timeout=30).output for i in (second, first)] == [2, 1]
    finally:
        app.close()


def test_a_rerun_waits_behind_the_executions_already_pending(db_url):
    """A re-run (redrive, repair) waits from its re-run, not from its first start: with one
    slot taken and an execution already pending, a redrive of an older execution queues
    behind that one; the slot freed goes to the one waiting longer. A real worker then runs
    them one at a time, in that order."""
    wf = konduit.Workflow("mr-requeue", version=1, max_running=1, key=lambda i: i["k"])

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return int(ctx.input["n"])

    app = konduit.App([wf], database_url=db_url)
    try:
        old = app.start("mr-requeue", input={"k": "a", "n": 1}).id
        assert app.cancel(old)
        holder = app.start("mr-requeue", input={"k": "a", "n": 2}).id
        waiting = app.start("mr-requeue", input={"k": "a", "n": 3}).id
        assert app.redrive(old) == ["only"]
        assert [app.status(i).status for i in (old, holder, waiting)] == [
            "pending", "running", "pending"]
        assert app.cancel(holder)  # frees the slot: the one waiting longer starts
        assert [app.status(i).status for i in (old, waiting)] == ["pending", "running"]
        with running_worker(app, concurrency=2):
            assert app.wait(old, timeout=60).output == 1
            assert app.wait(waiting, timeout=60).output == 3
        with psycopg.connect(db_url) as conn:
            done = [r[0] for r in conn.execute(
                "SELECT (input->>'n')::int FROM konduit_executions WHERE status = 'succeeded' "
                "AND workflow_name = 'mr-requeue' ORDER BY finished_at").fetchall()]
        assert done == [3, 1]
    finally:
        app.close()


def test_a_start_later_waits_from_its_time_not_from_its_start_call(db_url):
    """An execution started later (delay=) begins waiting for a slot when its time comes: one
    already pending then starts before it, though it was started after the delayed one's
    start call."""
    wf = konduit.Workflow("mr-later-order", version=1, max_running=1, key=lambda i: i["k"])

    @wf.step()
    def only(ctx: konduit.Context) -> int:
        return int(ctx.input["n"])

    app = konduit.App([wf], database_url=db_url)

    async def due_pass() -> None:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            await later.start_due(db)
        finally:
            await db.close()

    try:
        delayed = app.start("mr-later-order", input={"k": "a", "n": 1}, delay="0.2s").id
        holder = app.start("mr-later-order", input={"k": "a", "n": 2}).id
        waiting = app.start("mr-later-order", input={"k": "a", "n": 3}).id
        time.sleep(0.3)
        asyncio.run(due_pass())
        assert [app.status(i).status for i in (delayed, holder, waiting)] == [
            "pending", "running", "pending"]
        assert app.cancel(holder)  # frees the slot: the one waiting longer starts
        assert [app.status(i).status for i in (delayed, waiting)] == ["pending", "running"]
    finally:
        app.close()


def _rerun_probe(name: str, **limit: Any) -> tuple[konduit.Workflow, dict[str, Any]]:
    """A workflow whose one step fails while ``state["broken"]``, blocks the execution of input
    n="holder" until ``state["release"]`` is set (``state["holding"]`` says it runs), and keeps
    the most handlers it saw running at once in ``state["peak"]``."""
    wf = konduit.Workflow(name, version=1, **limit)
    state: dict[str, Any] = {"broken": True, "release": threading.Event(),
                             "holding": threading.Event(), "running": 0, "peak": 0,
                             "lock": threading.Lock()}

    @wf.step(retry=konduit.Retry(max_attempts=1))
    def only(ctx: konduit.Context) -> str:
        with state["lock"]:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        try:
            if ctx.input["n"] == "holder":
                state["holding"].set()
                assert state["release"].wait(120)
            elif state["broken"]:
                raise konduit.NonRetryableError("the service is down")
            return str(ctx.input["n"])
        finally:
            with state["lock"]:
                state["running"] -= 1

    return wf, state


@pytest.mark.parametrize("how", ["redrive", "repair"])
@pytest.mark.parametrize("key", [None, "input.k", "function"])
def test_a_rerun_started_before_max_running_was_set_takes_a_slot(db_url, how, key):
    """max_running is an operating setting (out of the definition's hash): a workflow gets one
    while executions started without it exist. Running one of those again (redrive, repair)
    takes a slot like a start: with the slots taken it waits pending, its key (none, a path or a
    function of its input) computed now and kept; it starts when a slot frees. A real worker
    runs them: at no moment do two handlers run."""
    name = f"mr-rerun-{how}-{'global' if key is None else 'path' if key == 'input.k' else 'fn'}"
    before, broken = _rerun_probe(name)
    app = konduit.App([before], database_url=db_url)
    try:
        with running_worker(app, concurrency=4):
            old = app.start(name, input={"k": "a", "n": "old"})
            with pytest.raises(konduit.ExecutionFailed):
                old.wait(timeout=60)
    finally:
        app.close()
    limit: dict[str, Any] = {"max_running": 1}
    if key is not None:
        limit["key"] = (lambda i: i["k"]) if key == "function" else key
    wf, state = _rerun_probe(name, **limit)
    app = konduit.App([wf], database_url=db_url)
    try:
        with running_worker(app, concurrency=4):
            holder = app.start(name, input={"k": "a", "n": "holder"}).id
            assert state["holding"].wait(60)
            state["broken"] = False
            assert getattr(app, how)(old.id) == ["only"]
            # The slot is the holder's: the re-run waits, out of every claim's reach.
            assert app.status(old.id).status == "pending"
            with psycopg.connect(db_url) as conn:
                assert conn.execute(
                    "SELECT run_key FROM konduit_executions WHERE id = %s", (old.id,)
                ).fetchone() == ("" if key is None else "a",)
                assert conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                                    "AND status = 'ready' AND NOT limited",
                                    (old.id,)).fetchone() == (0,)
            state["release"].set()
            assert app.wait(holder, timeout=60).output == "holder"
            assert app.wait(old.id, timeout=60).output == "old"
        assert state["peak"] == 1 and broken["peak"] == 1
    finally:
        state["release"].set()
        app.close()


def _step_limit_probe(name: str, limit: Any = None) -> tuple[konduit.Workflow, dict[str, Any]]:
    """_rerun_probe's step, with ``limit`` as its ``concurrency=``."""
    wf = konduit.Workflow(name, version=1)
    state: dict[str, Any] = {"broken": True, "release": threading.Event(),
                             "holding": threading.Event(), "running": 0, "peak": 0,
                             "lock": threading.Lock()}

    @wf.step(retry=konduit.Retry(max_attempts=1), concurrency=limit)
    def only(ctx: konduit.Context) -> str:
        with state["lock"]:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        try:
            if ctx.input["n"] == "holder":
                state["holding"].set()
                assert state["release"].wait(120)
            elif state["broken"]:
                raise konduit.NonRetryableError("the service is down")
            return str(ctx.input["n"])
        finally:
            with state["lock"]:
                state["running"] -= 1

    return wf, state


@pytest.mark.parametrize("how", ["redrive", "repair"])
@pytest.mark.parametrize("key", ["input.k", "function"])
def test_a_rerun_started_before_a_step_was_limited_per_key_takes_its_key(db_url, how, key):
    """A step's per-key limit (concurrency= with key=) is an operating setting too: one added
    after an execution started leaves that execution without the step's key. Running it again
    (redrive, repair) gives its re-run tasks the key its start would compute now (kept on the
    execution, as a start keeps it), so the re-run waits for the key's running task: a real
    worker never runs two handlers of the key at once."""
    name = f"fk-rerun-{how}-{'path' if key == 'input.k' else 'fn'}"
    before, broken = _step_limit_probe(name)
    app = konduit.App([before], database_url=db_url)
    try:
        with running_worker(app, concurrency=4):
            old = app.start(name, input={"k": "a", "n": "old"})
            with pytest.raises(konduit.ExecutionFailed):
                old.wait(timeout=60)
    finally:
        app.close()
    wf, state = _step_limit_probe(name, konduit.Limit(
        1, key=(lambda c: c.input["k"]) if key == "function" else key))
    app = konduit.App([wf], database_url=db_url)
    try:
        with running_worker(app, concurrency=4):
            holder = app.start(name, input={"k": "a", "n": "holder"}).id
            assert state["holding"].wait(60)
            state["broken"] = False
            assert getattr(app, how)(old.id) == ["only"]
            with psycopg.connect(db_url) as conn:
                assert conn.execute("SELECT limit_keys FROM konduit_executions WHERE id = %s",
                                    (old.id,)).fetchone() == ({"only": "a"},)
                # Its re-run task carries the key: the holder's running task keeps it waiting.
                assert conn.execute(
                    "SELECT limit_key FROM konduit_tasks WHERE execution_id = %s "
                    "ORDER BY generation DESC LIMIT 1", (old.id,)).fetchone() == ("a",)
            state["release"].set()
            assert app.wait(holder, timeout=60).output == "holder"
            assert app.wait(old.id, timeout=60).output == "old"
        assert state["peak"] == 1 and broken["peak"] == 1
    finally:
        state["release"].set()
        app.close()


def test_a_code_less_client_reruns_one_started_before_max_running_under_its_limit(db_url):
    """Without the workflow's code (konduit.Client, the CLI, the API, the dashboard), the key of
    an execution started before max_running comes from the registered definition: a path is
    read from its input; a function refuses the redrive (KeyNeedsCode), as it refuses a start
    by name, rather than run the execution past its limit."""
    for key in ("input.k", "function"):
        name = f"mr-rerun-codeless-{'path' if key == 'input.k' else 'fn'}"
        before, _ = _rerun_probe(name)
        app = konduit.App([before], database_url=db_url)
        try:
            old = app.start(name, input={"k": "a", "n": "old"}).id
            assert app.cancel(old)
        finally:
            app.close()
        wf, _ = _rerun_probe(name, max_running=1,
                             key=(lambda i: i["k"]) if key == "function" else key)
        app = konduit.App([wf], database_url=db_url)
        try:
            holder = app.start(name, input={"k": "a", "n": "holder"}).id
            with konduit.Client(db_url) as client:
                if key == "function":
                    with pytest.raises(KeyNeedsCode):
                        client.redrive(old)
                    assert app.status(old).status == "cancelled"
                    assert app.redrive(old) == ["only"]  # with the code: its key computed
                else:
                    assert client.redrive(old) == ["only"]
            assert _statuses(db_url, name) == {"a": ["pending", "running"]}
            assert app.cancel(holder)
            assert _statuses(db_url, name) == {"a": ["running", "cancelled"]}
        finally:
            app.close()


def test_a_fork_takes_a_slot_of_its_key(db_url):
    """A fork is a new execution of the key: with its slots taken it waits pending (no task of
    it claimed meanwhile) and starts when a slot frees."""
    wf = konduit.Workflow("mr-fork", version=1, max_running=1, key=lambda i: i["k"])

    @wf.step()
    def first(ctx: konduit.Context) -> int:
        return int(ctx.input["n"])

    @wf.step(after=[first])
    def second(ctx: konduit.Context) -> int:
        return ctx.upstream["first"] * 10

    app = konduit.App([wf], database_url=db_url)
    try:
        with running_worker(app, concurrency=2):
            done = app.start("mr-fork", input={"k": "a", "n": 1})
            assert done.wait(timeout=30).output == 10
        holder = app.start("mr-fork", input={"k": "a", "n": 2}).id
        fork = app.fork(done.id, from_step="second", input={"k": "a", "n": 3})
        assert _statuses(db_url, "mr-fork") == {"a": ["succeeded", "running", "pending"]}
        with running_worker(app, concurrency=2):
            assert app.wait(holder, timeout=30).output == 20
            assert fork.wait(timeout=30).output == 10  # "first" copied from its origin
    finally:
        app.close()


def test_a_start_later_waits_for_its_keys_slot_when_its_time_comes(db_url):
    """run_at=/delay= starts count under max_running too: when due, an execution of a key whose
    slots are taken becomes pending (its tasks set aside), and starts when a slot frees; the
    key's row is kept while only a scheduled execution names it."""
    wf = konduit.Workflow("mr-later", version=1, max_running=1, key=lambda i: i["k"])
    wf.step(name="only")(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)

    async def maintenance_pass(idle_seconds: float = 60.0) -> None:
        db = Database(db_url, min_size=1, max_size=2)
        await db.open()
        try:
            await later.start_due(db)
            await limit_keys.maintain(db, idle_seconds=idle_seconds)
        finally:
            await db.close()

    try:
        lone = app.start("mr-later", input={"k": "lone"}, delay="0.2s").id
        # Only a scheduled execution names key "lone": its row stays, however idle.
        asyncio.run(maintenance_pass(idle_seconds=0.0))
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM konduit_run_slots WHERE key = 'lone'"
                                ).fetchone() == (1,)
        now = app.start("mr-later", input={"k": "a"}).id
        due = [app.start("mr-later", input={"k": "a"}, delay="0.2s").id for _ in range(2)]
        assert _statuses(db_url, "mr-later")["a"] == ["running", "scheduled", "scheduled"]
        time.sleep(0.3)
        asyncio.run(maintenance_pass())
        # Key "a" has its one slot taken: both due ones wait; "lone" has a free slot: it runs.
        assert _statuses(db_url, "mr-later") == {"lone": ["running"],
                                                 "a": ["running", "pending", "pending"]}
        with psycopg.connect(db_url) as conn:
            assert conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = ANY(%s)"
                                " AND NOT limited", (due,)).fetchone() == (0,)
        assert app.cancel(now)  # frees the slot: the oldest pending one starts
        assert _statuses(db_url, "mr-later")["a"] == ["cancelled", "running", "pending"]
        assert app.status(due[0]).status == "running" and app.status(lone).status == "running"
    finally:
        app.close()


def test_the_maintenance_pass_fills_free_slots(db_url):
    wf = konduit.Workflow("mr-fill", version=1, max_running=1)  # no key: 1 running in all
    wf.step(name="only")(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)
    try:
        ids = [app.start("mr-fill", input=n).id for n in range(3)]
    finally:
        app.close()
    assert _statuses(db_url, "mr-fill") == {"": ["running", "pending", "pending"]}
    with psycopg.connect(db_url, autocommit=True) as conn:
        # A slot freed without the finish that fills it (say a raised max_running).
        conn.execute("UPDATE konduit_run_slots SET max_running = 2")

    async def maintain() -> int:
        db = Database(db_url, max_size=2)
        await db.open()
        try:
            return (await limit_keys.maintain(db)).started
        finally:
            await db.close()

    assert asyncio.run(maintain()) == 1
    assert _statuses(db_url, "mr-fill") == {"": ["running", "running", "pending"]}
    with psycopg.connect(db_url) as conn:
        started = conn.execute("SELECT status FROM konduit_executions WHERE id = %s",
                               (ids[1],)).fetchone()
        released = conn.execute("SELECT count(*) FROM konduit_tasks WHERE execution_id = %s "
                                "AND status = 'ready' AND NOT limited", (ids[1],)).fetchone()
    assert started == ("running",) and released == (1,)  # the oldest, its task claimable


# -- many keys -------------------------------------------------------------------------------


IDLE_KEYS = 200_000


@pytest.mark.slow
def test_a_million_keys_cost_storage_not_claim_time(db_url):
    wf = konduit.Workflow("many-keys", version=1)
    wf.step(name="work", concurrency=konduit.Limit(1, key=_customer))(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)
    try:
        first = app.start("many-keys", input={"customer": "a"}).id
        for key in ("b", "c"):
            app.start("many-keys", input={"customer": key})
    finally:
        app.close()
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Idle keys: their rows, and finished tasks that carried them.
        conn.execute(f"""INSERT INTO konduit_flow_keys (workflow, step, key, updated_at)
            SELECT 'many-keys@1', 'work', 'idle-' || i, now() - interval '1 hour'
            FROM generate_series(1, {IDLE_KEYS}) i""")
        conn.execute(f"""INSERT INTO konduit_tasks (execution_id, workflow, step, map_index,
                                                    max_attempts, status, finished_at, limit_key)
            SELECT %s, 'many-keys@1', 'work', i, 1, 'succeeded', now(), 'idle-' || i
            FROM generate_series(1, {IDLE_KEYS}) i""", (first,))
        conn.execute("ANALYZE konduit_tasks")
        conn.execute("ANALYZE konduit_flow_keys")
        (pages,) = conn.execute(
            "SELECT (pg_relation_size('konduit_flow_keys') + pg_relation_size('konduit_tasks'))"
            " / current_setting('block_size')::int").fetchone()  # type: ignore[misc]
        params = {"queues": ["default"], "workflows": ["many-keys@1"], "cursor_workflows": [],
                  "cursor_steps": [], "cursor_keys": [], "keys_per_step": 32}
        with conn.transaction(force_rollback=True):  # warm: the function's plan, the catalog
            conn.execute(q("flow_limit_lock_keys_if_ready"), params)
        with conn.transaction(force_rollback=True):
            row = conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {q('flow_limit_lock_keys_if_ready')}".encode(),
                params).fetchone()
        assert row is not None
        plan = row[0][0]["Plan"]
        touched = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
        assert plan["Actual Rows"] == 3  # the keys with ready tasks, and only them
        # A few index pages per key found; the idle keys' rows and tasks (pages) are not read.
        assert touched < 150 and pages > 4000, (touched, pages)
        # The claim takes one task of each key (Limit(1)).
        locked = conn.execute(q("flow_limit_lock_keys_if_ready"), params).fetchall()
        assert sorted(r[2] for r in locked) == ["a", "b", "c"]
    # The retention pass retires idle rows, never those of keys with work.
    async def retire() -> int:
        db = Database(db_url, max_size=2)
        await db.open()
        try:
            claimed = await transitions.claim(
                db, queues=["default"], workflows=["many-keys@1"], limit=8, lease_seconds=30,
                worker_id="w", limited=True, key_cursors=transitions.KeyCursors())
            assert len(claimed) == 3
            return (await limit_keys.maintain(db, limit=100)).retired
        finally:
            await db.close()

    assert asyncio.run(retire()) == 1000
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_flow_keys WHERE key IN ('a', 'b', 'c')"
                            ).fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM konduit_flow_keys").fetchone() == (
            IDLE_KEYS + 3 - 1000,)


# -- visible ---------------------------------------------------------------------------------


def test_per_key_running_and_throttled_time_are_visible(db_url):
    wf = konduit.Workflow("keys-seen", version=1)
    wf.step(name="call", concurrency=konduit.Limit(1, key=_customer))(lambda ctx: 1)
    app = konduit.App([wf], database_url=db_url)
    try:
        app.start_many([{"workflow": "keys-seen", "input": {"customer": c}}
                        for c in ("hot", "hot", "hot", "cold")])
    finally:
        app.close()

    async def main() -> Any:
        db = Database(db_url, max_size=2)
        await db.open()
        try:
            cursors = transitions.KeyCursors()
            for expected in (2, 0):  # one of each key, then the hot key is held back
                claimed = await transitions.claim(
                    db, queues=["default"], workflows=["keys-seen@1"], limit=8,
                    lease_seconds=30, worker_id="w", limited=True, key_cursors=cursors)
                assert len(claimed) == expected
            return await load_stats(db)
        finally:
            await db.close()

    stats = asyncio.run(main())
    [flow] = stats.flow
    assert (flow.keyed, flow.concurrency, flow.running, flow.ready) == (True, 1, 2, 2)
    assert (flow.keys, flow.keys_throttled, flow.throttled_now) == (2, 1, True)
    top = {k.key: k for k in flow.top_keys}
    assert top["hot"].running == 1 and top["hot"].throttled_now
    assert top["cold"].running == 1 and not top["cold"].throttled_now
    assert flow.to_json()["top_keys"][0]["key"] in {"hot", "cold"}
    lines = [r for r in stats_renderables(stats) if isinstance(r, str)]
    assert any("keys-seen@1/call: 2 key(s), 1 throttled now" in line and "hot 1 running" in line
               for line in lines), lines
    # Metrics are labelled by the limit (its step), never by key.
    families = {m.name: m for m in metric_families(stats, [], [])}
    [keys] = families["konduit_step_flow_keys"].samples
    assert keys.labels == {"workflow": "keys-seen", "version": "1", "step": "call"}
    assert keys.value == 2
    assert families["konduit_step_flow_keys_throttled"].samples[0].value == 1
    assert not any("key" in s.labels for m in families.values() for s in m.samples)
    # The dashboard's stats page: the flow limits table, with the busiest keys.
    with serving(create_app(database_client(db_url))) as base, \
            httpx.Client(base_url=base) as http:
        page = http.get("/stats")
        metrics = http.get("/metrics").text
    assert page.status_code == 200
    assert "Flow limits" in page.text and "1 per key" in page.text
    assert "2 key(s), 1 throttled now" in page.text and '<span class="key">hot</span>' in page.text
    assert 'konduit_step_flow_keys{step="call",version="1",workflow="keys-seen"} 2.0' in metrics
