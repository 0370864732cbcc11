"""A moved execution reads the same through every door (migration 0041's history, read through
the konduit_<table>_all views; migration 0042's indexes).

One execution of a workflow with a map (one item failing its first attempt, so a retry), a
child workflow, a join, a durable call (journal), a stream and handler logs is read through the
App, ``konduit.Client``, ``konduit.AsyncClient``, the read model (the dashboard's execution page
reads, ``load_detail``), the HTTP API (code-less) and the command line; then it is moved into
the history and read again: every read gives what it gave before, by its whole id and by its
tail, and the hot tables hold none of its rows. A write to it (cancel, repair, redrive, answer,
an event, retry_now, migrate) is refused naming it and saying it is in the history (409 from
the API, one error line from the command line); a fork from it works (it only reads it).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest

import konduit
from konduit.core.ids import short_id
from konduit.engine import history
from konduit.web.detail import load_detail
from tests.support.workers import running_worker
from tests.test_api_v1 import api
from tests.test_cli_reads import run

pytestmark = pytest.mark.storage


def workflows() -> list[konduit.Workflow]:
    child = konduit.Workflow("hist-child", version=1)

    @child.step()
    def only(ctx: konduit.Context) -> dict[str, Any]:
        return {"child_of": ctx.input}

    wf = konduit.Workflow("hist-reads", version=1)

    @wf.step()
    async def root(ctx: konduit.Context) -> list[int]:
        n = await ctx.call("count", lambda: 3)
        ctx.stream.write({"n": n})
        ctx.stream.write("done")
        ctx.log("root counted %d", n)
        return list(range(n))

    @wf.map(after=["root"], over=lambda items: items,
            retry=konduit.Retry(max_attempts=2, backoff="fixed", base="0.05s"))
    def double(ctx: konduit.Context) -> int:
        if ctx.item == 1 and ctx.attempt == 1:
            raise RuntimeError("item 1 fails its first attempt")
        return int(ctx.item) * 2

    wf.subworkflow(name="call", after=["root"], workflow="hist-child",
                   input=lambda ctx: len(ctx.upstream["root"]))

    @wf.step(after=["double", "call"])
    def join(ctx: konduit.Context) -> dict[str, Any]:
        return {"sum": sum(ctx.upstream["double"]), "child": ctx.upstream["call"]}

    return [child, wf]


MODEL_READS: dict[str, Callable[[Any, UUID], Any]] = {
    "view": lambda m, e: m.view(e),
    "execution": lambda m, e: m.execution(e),
    "outputs": lambda m, e: m.outputs(e),
    "payloads": lambda m, e: m.payloads(e),
    "tasks": lambda m, e: m.tasks(e),
    "steps": lambda m, e: m.steps(e),
    "attempts": lambda m, e: m.attempts(e),
    "attempts_but_maps": lambda m, e: m.attempts(e, except_steps=["double"]),
    "attempt_logs": lambda m, e: m.attempt_logs(e),
    "journal": lambda m, e: m.journal(e),
    "streams": lambda m, e: m.streams(e),
    "failed_attempts": lambda m, e: m.failed_attempts(e, 20),
    "map_counts": lambda m, e: m.map_counts(e, ["double"]),
    "map_items": lambda m, e: m.map_items(e, "double"),
    "parent": lambda m, e: m.parent(e),
    "children": lambda m, e: m.children(e),
    "fork_origin": lambda m, e: m.fork_origin(e),
    "forks": lambda m, e: m.forks(e),
    "budgets": lambda m, e: m.budgets(e),
    "open_tasks": lambda m, e: m.open_tasks(e),
    "task_policies": lambda m, e: m.task_policies(e),
    "auto_repair_status": lambda m, e: m.auto_repair_status(e),
    "answers": lambda m, e: m.answers(e),
    "stall": lambda m, e: m.stall(e),
    "detail": lambda m, e: load_detail(m, str(e)),
    "detail_page": lambda m, e: load_detail(m, str(e), collapse_maps=True),
}


def faces(app: konduit.App, client: Any, eid: UUID | str) -> dict[str, Any]:
    """What the App and the code-less client (sync) answer about one execution."""
    read: dict[str, Any] = {}
    for name, face in (("app", app), ("client", client)):
        read[f"{name}.status"] = face.status(eid)
        read[f"{name}.wait"] = face.wait(eid, timeout=30)
        for what in ("steps", "tasks", "outputs", "payloads", "attempt_logs", "journal",
                     "streams", "auto_repair_status", "stall", "answers"):
            read[f"{name}.{what}"] = getattr(face, what)(eid)
        read[f"{name}.stream"] = list(face.stream(eid, "root", follow=False))
        read[f"{name}.stream_following"] = list(face.stream(eid, "root"))  # it ended: returns
    return read


def snapshot(app: konduit.App, db_url: str, eid: UUID, tmp_path: Any) -> dict[str, Any]:
    tail = short_id(eid)
    read: dict[str, Any] = {}
    with konduit.Client(db_url) as client:
        read |= faces(app, client, eid)
        read |= {f"tail.{k}": v for k, v in faces(app, client, tail).items()}
    for name, call in MODEL_READS.items():
        read[f"model.{name}"] = app._read(lambda m, c=call: c(m, eid))  # type: ignore[misc]

    async def by_async() -> dict[str, Any]:
        async with konduit.AsyncClient(db_url) as client:
            got = {"status": await client.status(tail), "wait": await client.wait(eid, 30),
                   "steps": await client.steps(eid), "tasks": await client.tasks(eid),
                   "journal": await client.journal(eid), "streams": await client.streams(eid),
                   "stream": [c async for c in client.stream(eid, "root", follow=False)]}
            return {f"async.{k}": v for k, v in got.items()}
    read |= asyncio.run(by_async())

    with api(None, db_url) as http:
        for path in ("", "/logs", "/journal", "/streams", "/streams/root?follow=false"):
            for which in (str(eid), tail):
                response = http.get(f"/api/v1/executions/{which}{path}")
                assert response.status_code == 200, (path, response.text)
                read[f"http{path}@{which == tail}"] = (
                    response.text if "follow" in path else response.json())
        live = http.get(f"/executions/{eid}/live.json")
        assert live.status_code == 200, live.text
        read["http.live"] = live.json()
        for page in (f"/executions/{eid}", f"/executions/{tail}",
                     f"/executions/{eid}/steps/double"):
            response = http.get(page)
            assert response.status_code == 200, (page, response.text[:300])
            assert str(eid) in response.text and "double" in response.text
            read[f"http.page{page.replace(str(eid), 'ID').replace(tail, 'TAIL')}"] = 200

    for args in (["status", tail, "--json", "--journal"], ["status", str(eid), "--json"],
                 ["stream", tail, "--name", "root", "--json"]):
        proc = run(*args, "--database-url", db_url, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr)
        read["cli." + " ".join(a if a not in (tail, str(eid)) else "ID" for a in args)] = (
            [json.loads(line) for line in proc.stdout.splitlines()] if "stream" in args
            else json.loads(proc.stdout))
    return read


HOT = {
    "konduit_executions": "id = %(id)s",
    "konduit_steps": "execution_id = %(id)s",
    "konduit_tasks": "execution_id = %(id)s",
    "konduit_attempts": "task_id = ANY(%(tasks)s)",
    "konduit_attempt_logs": "lease_token = ANY(%(leases)s)",
    "konduit_outputs": "execution_id = %(id)s",
    "konduit_execution_outputs": "execution_id = %(id)s",
    "konduit_journal": "execution_id = %(id)s",
    "konduit_journal_results": "execution_id = %(id)s",
    "konduit_streams": "execution_id = %(id)s",
    "konduit_stream_chunks": "execution_id = %(id)s",
    "konduit_map_chunks": "execution_id = %(id)s",
}


def rows_of(db_url: str, eid: UUID, tasks: list[int], leases: list[UUID],
            where: str = "") -> dict[str, int]:
    """How many rows each table holds of the execution (``where``: "" the hot tables,
    "_history" ... the history)."""
    counts = {}
    with psycopg.connect(db_url) as conn:
        for table, condition in HOT.items():
            name = table.replace("konduit_", "konduit_history_") if where else table
            row = conn.execute(f"SELECT count(*) FROM {name} WHERE {condition}",  # type: ignore
                               {"id": eid, "tasks": tasks, "leases": leases}).fetchone()
            assert row is not None
            counts[table] = row[0]
    return counts


def move(app: konduit.App) -> int:
    async def go() -> int:
        client = await app.client_async()
        return await history.move_finished(client.db, 0)
    return app._run(go())


def test_a_moved_execution_reads_the_same_through_every_door(make_app, db_url, tmp_path):
    app = make_app(*workflows())
    with running_worker(app, poll_interval=0.05):
        handle = app.start("hist-reads", {"who": "history"}, idempotency_key="k-history")
        done = handle.wait(timeout=60)
    assert done.output == {"sum": 6, "child": {"child_of": 3}}
    eid = handle.id
    child = app._read(lambda m: m.children(eid))[0].id
    tasks = [t.id for t in app.tasks(eid)]
    with psycopg.connect(db_url) as conn:
        leases = [r[0] for r in conn.execute(
            "SELECT lease_token FROM konduit_attempts WHERE task_id = ANY(%s)", [tasks])]
    hot = rows_of(db_url, eid, tasks, leases)
    # What the reads below cover is there: a retried map item, logs, a call, a stream.
    assert all(n > 0 for t, n in hot.items() if t != "konduit_map_chunks"), hot
    assert [a.outcome for a in app._read(lambda m: m.failed_attempts(eid, 5))] == ["retry"]

    before = snapshot(app, db_url, eid, tmp_path)
    child_before = app.status(child)

    assert move(app) == 2  # the execution and its child
    assert rows_of(db_url, eid, tasks, leases) == dict.fromkeys(HOT, 0)
    assert rows_of(db_url, eid, tasks, leases, "_history") == hot

    after = snapshot(app, db_url, eid, tmp_path)
    assert after.keys() == before.keys()
    differ = sorted(k for k in before if before[k] != after[k])
    assert differ == [], (differ, {k: (before[k], after[k]) for k in differ[:2]})
    assert app.status(child) == child_before
    assert app._read(lambda m: m.parent(child)).execution_id == eid  # type: ignore[union-attr]

    # The id's tail alone finds it in the history, as the whole id does.
    with konduit.Client(db_url) as client:
        assert client.status(short_id(eid)[-8:]).id == eid

    # A fork reads its origin only: it works from the history, and each links the other.
    with running_worker(app, poll_interval=0.05):
        fork = app.fork(short_id(eid), from_step="join")
        assert fork.wait(timeout=60).output == done.output
    assert app._read(lambda m: m.fork_origin(fork.id)) == {
        "forked_from": eid, "forked_at_step": "join", "origin_status": "succeeded"}
    assert [f["id"] for f in app._read(lambda m: m.forks(eid))] == [fork.id]


def test_a_write_to_a_moved_execution_says_it_is_in_the_history(make_app, db_url, tmp_path):
    app = make_app(*workflows())
    with running_worker(app, poll_interval=0.05):
        handle = app.start("hist-reads", {"who": "writes"})
        handle.wait(timeout=60)
    eid = handle.id
    task = app.tasks(eid)[0].id
    move(app)
    writes: dict[str, Callable[[Any], Any]] = {
        "cancel": lambda f: f.cancel(eid),
        "repair": lambda f: f.repair(eid),
        "redrive": lambda f: f.redrive(eid),
        "answer step 'join' of": lambda f: f.answer(eid, "join", {"x": 1}),
        "send event 'go' to": lambda f: f.send_event("go", execution_id=eid),
        "retry a task of": lambda f: f.retry_now(eid, task),
        "migrate": lambda f: f.migrate(eid, to_version=1),
    }
    with konduit.Client(db_url) as client:
        for face in (app, client):
            for action, write in writes.items():
                said = (rf"cannot {re.escape(action)} execution {eid}: it finished succeeded on "
                        r"\d{4}-\d\d-\d\d .* moved into the history on \d{4}-\d\d-\d\d")
                with pytest.raises(konduit.ExecutionInHistory, match=said) as refused:
                    write(face)
                assert refused.value.execution_id == eid
                assert refused.value.status == "succeeded"
                assert refused.value.moved_at is not None
    # Through the HTTP API: 409, saying so.
    with api(app, db_url) as http:
        for path, body in (("cancel", None), ("repair", None), ("redrive", None),
                           ("migrate", {"to_version": 1}), ("steps/join/answer", {"value": {}})):
            response = http.post(f"/api/v1/executions/{short_id(eid)}/{path}", json=body)
            assert response.status_code == 409, (path, response.text)
            problem = response.json()
            assert problem["code"] == "execution_in_history", problem
            assert str(eid) in problem["detail"] and "moved into the history" in problem["detail"]
        response = http.post("/api/v1/events", json={"name": "go", "execution_id": str(eid)})
        assert response.status_code == 409 and "history" in response.json()["detail"]
    # Through the command line: one error line.
    for args in (["cancel", short_id(eid)], ["answer", short_id(eid), "join", "--value", "{}"],
                 ["send-event", "go", "--execution-id", str(eid)]):
        proc = run(*args, "--database-url", db_url, cwd=tmp_path)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert str(eid) in proc.stderr and "moved into the history" in proc.stderr, proc.stderr


# The reads of one execution, as the faces make them: the history side of each view must be
# read through its partitions' indexes (the predicates push down through UNION ALL), never
# scanned whole. Sequential scans are turned off for the check: a history side with no index
# to use would still be scanned (at a prohibitive cost), which is what is looked for.
BY_EXECUTION = ["execution_get_with_history", "step_get_all_with_history",
                "task_list_by_execution", "attempt_list_by_execution",
                "attempt_log_list_by_execution", "output_list_by_execution",
                "execution_output_list", "journal_list_by_execution", "stream_list_of_execution",
                "stream_get_state", "stream_chunk_list_from", "task_summarize_by_step",
                "task_list_by_step_page", "execution_parent_of", "execution_children_list",
                "execution_get_fork_origin", "execution_list_forks",
                "task_list_open_or_waited_by_execution", "execution_get_auto_repair",
                "task_policy_list_by_execution", "execution_list_ids_by_prefix_or_tail",
                "attempt_list_failed_by_execution", "task_list_budgets_by_execution"]


def test_the_reads_of_a_moved_execution_use_the_history_indexes(make_app, db_url):
    from konduit.db.queries import q
    from tests.test_history import nodes

    wf = konduit.Workflow("hist-plans", version=1)
    wf.step(name="only")(lambda ctx: 1)
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handles = [app.start("hist-plans", {"n": n}) for n in range(3)]
        for h in handles:
            h.wait(timeout=60)
    assert move(app) == 3
    eid = handles[0].id
    values = {"id": eid, "execution_id": eid, "limit": 10, "sealed": False, "steps": ["only"],
              "step": "only", "status": None, "from_index": 0, "name": "s", "from_offset": 0,
              "per_step": 5, "low": eid, "high": eid,
              "tail_reversed": short_id(eid)[::-1] + "%"}
    with psycopg.connect(db_url) as conn:
        partitions = {r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid")}
        assert partitions, "the move made no partition"
        conn.execute("SET enable_seqscan = off")
        scanned = {}
        for name in BY_EXECUTION:
            row = conn.execute(f"EXPLAIN (FORMAT JSON) {q(name)}".encode(),  # type: ignore
                               values).fetchone()
            assert row is not None
            plan = row[0][0]["Plan"]
            history = [n for n in nodes(plan) if n.get("Relation Name") in partitions]
            assert history, f"{name}: does not read the history"
            whole = [n["Relation Name"] for n in history if n["Node Type"] == "Seq Scan"]
            if whole:
                scanned[name] = whole
        assert scanned == {}
        # The control: a read by what the history has no index on is scanned, and seen so.
        row = conn.execute("EXPLAIN (FORMAT JSON) SELECT id FROM konduit_executions_all "
                           "WHERE input_hash = 'h'").fetchone()
        assert row is not None
        assert any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") in partitions
                   for n in nodes(row[0][0]["Plan"]))
