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
                "attempt_list_failed_by_execution", "task_list_budgets_by_execution",
                "event_list_answers_by_execution"]


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


def found_everywhere(app: konduit.App, db_url: str, tmp_path: Any) -> dict[str, Any]:
    """What every face's search and list finds of the batch (ids, newest first)."""
    from datetime import UTC, datetime, timedelta

    def ids(results: Any) -> list[str]:
        return [str(r.id) for r in results]

    since = datetime.now(UTC) - timedelta(days=3)
    read: dict[str, Any] = {}
    read["app.list"] = ids(app.list(workflow="hist-child"))
    read["app.list.status"] = ids(app.list(status="succeeded", workflow="hist-child"))
    read["app.list.tag"] = ids(app.list(tags={"batch": "b"}))
    for name, where in {
        "tag": {"tags": {"batch": "b"}},
        "key": {"idempotency_key": "k2"},
        "input": {"input": {"n": 2}},
        "since": {"since": since, "workflow": "hist-child"},
        "until": {"until": datetime.now(UTC) - timedelta(days=1), "workflow": "hist-child"},
        "status": {"status": "succeeded", "tags": {"batch": "b"}},
    }.items():
        read[f"app.search.{name}"] = ids(app.search(**where))
    # A keyset walk two at a time crosses from the hot table into the history and back.
    walked: list[str] = []
    before = None
    while True:
        page = app.search(tags={"batch": "b"}, before=before, limit=2)
        if not page:
            break
        walked += ids(page)
        before = (page[-1].created_at, page[-1].id)
    read["app.search.walk"] = walked
    with konduit.Client(db_url) as client:
        read["client.search"] = ids(client.search(tags={"batch": "b"}))
        read["client.list"] = ids(client.list(workflow="hist-child"))
        some = read["app.search.tag"][2]
        read["client.search.id_start"] = ids(client.search(id_prefix=some[:8]))
        read["client.search.id_end"] = ids(client.search(id_prefix=some[-8:]))

    async def by_async() -> list[str]:
        async with konduit.AsyncClient(db_url) as client:
            return ids(await client.search(tags={"batch": "b"}))
    read["async.search"] = asyncio.run(by_async())

    with api(None, db_url) as http:
        walked, cursor = [], None
        while True:
            response = http.get("/api/v1/executions", params={
                "tag": "batch=b", "limit": 2, **({"cursor": cursor} if cursor else {})})
            assert response.status_code == 200, response.text
            body = response.json()
            walked += [item["id"] for item in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        read["http.walk"] = walked
        page = http.get("/", params={"tag": "batch=b"})
        assert page.status_code == 200, page.text[:300]
        read["http.page"] = [i for i in read["app.search.tag"] if i in page.text]
    proc = run("list", "--tag", "batch=b", "--json", "--database-url", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    read["cli.list"] = [e["id"] for e in json.loads(proc.stdout)]
    return read


def test_a_moved_execution_is_found_by_every_search_and_list(make_app, db_url, tmp_path):
    """Search and list read the history beside the hot table (migration 0044): what every face
    finds is the same before and after half of it moved, in the same order, each once; a
    keyset walk crosses between the two. A bulk action acts on the hot table only."""
    app = make_app(*workflows())
    with running_worker(app, poll_interval=0.05):
        handles = [app.start("hist-child", {"n": n}, idempotency_key=f"k{n}",
                             tags={"batch": "b"}) for n in range(6)]
        for h in handles:
            h.wait(timeout=60)
    eids = [h.id for h in handles]
    aged = eids[0::2]
    with psycopg.connect(db_url) as conn:
        # All created two days ago (their order kept); every other one also finished then, so
        # a move of what finished a day ago takes those and the newest-first order interleaves.
        conn.execute("UPDATE konduit_executions SET"
                     " created_at = created_at - interval '2 days',"
                     " finished_at = finished_at - CASE WHEN id = ANY(%s)"
                     " THEN interval '2 days' ELSE interval '0' END WHERE id = ANY(%s)",
                     (aged, eids))
    before = found_everywhere(app, db_url, tmp_path)
    newest_first = [str(e) for e in reversed(eids)]
    assert before["app.search.tag"] == newest_first
    assert before["app.search.walk"] == newest_first and before["http.walk"] == newest_first
    assert before["app.search.key"] == [str(eids[2])]
    assert before["app.search.until"] == newest_first  # all created two days ago

    async def move_aged() -> int:
        client = await app.client_async()
        return await history.move_finished(client.db, 86400.0)
    assert app._run(move_aged()) == 3
    with psycopg.connect(db_url) as conn:
        moved = {r[0] for r in conn.execute("SELECT id FROM konduit_history_executions")}
    assert moved == set(aged)

    after = found_everywhere(app, db_url, tmp_path)
    differ = sorted(k for k in before if before[k] != after[k])
    assert differ == [], {k: (before[k], after[k]) for k in differ}

    # A bulk action writes: it finds the hot executions only (a moved one takes no write).
    result = app.bulk("cancel", konduit.ExecutionFilter(tags={"batch": "b"}), dry_run=True)
    assert result.matched == 3


def test_a_search_of_the_history_reads_its_indexes(make_app, db_url):
    """Each part of a search (and the list's page) reads the history's partitions through the
    index migration 0044 made for it, as the hot table's (tests/test_search_plans.py); the
    control drops one and sees its partitions scanned."""
    from datetime import UTC, datetime, timedelta

    from konduit.core.search import ExecutionFilter
    from konduit.db.queries import q
    from tests.test_history import nodes

    wf = konduit.Workflow("hist-search", version=1)
    wf.step(name="only")(lambda ctx: 1)
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handles = [app.start("hist-search", {"n": n}, tags={"t": str(n)},
                             idempotency_key=f"s{n}") for n in range(3)]
        for h in handles:
            h.wait(timeout=60)
    assert move(app) == 3
    some = str(handles[1].id)
    filters = {
        "tag": ExecutionFilter(tags={"t": "1"}),
        "key": ExecutionFilter(idempotency_key="s1"),
        "id_start": ExecutionFilter(id_prefix=some[:18]),
        "id_end": ExecutionFilter(id_prefix=some[-12:]),
        "input": ExecutionFilter(input={"n": 1}),
        "since": ExecutionFilter(since=datetime.now(UTC) - timedelta(hours=1)),
        "workflow": ExecutionFilter(workflow="hist-search"),
        "none": ExecutionFilter(),
    }

    def history_scans(conn: psycopg.Connection[Any], where: ExecutionFilter) -> list[str]:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {q('execution_search_with_history')}"
                           .encode(), {**where.params(), "before_at": None, "before_id": None,
                                       "limit": 50}).fetchone()
        assert row is not None
        read = [n for n in nodes(row[0][0]["Plan"]) if n.get("Relation Name") in partitions]
        assert read, "the search does not read the history"
        return [n["Relation Name"] for n in read if n["Node Type"] == "Seq Scan"]

    def indexes(conn: psycopg.Connection[Any], where: ExecutionFilter) -> set[str]:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {q('execution_search_with_history')}"
                           .encode(), {**where.params(), "before_at": None, "before_id": None,
                                       "limit": 50}).fetchone()
        assert row is not None
        return {n["Index Name"] for n in nodes(row[0][0]["Plan"]) if "Index Name" in n}

    with psycopg.connect(db_url) as conn:
        partitions = {r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid")}
        conn.execute("SET enable_seqscan = off")
        scanned = {kind: s for kind, where in filters.items() if (s := history_scans(conn, where))}
        assert scanned == {}
        # Each part by its own index (the partitions' copies are named after their columns).
        expected = {"tag": "_tags_idx", "key": "_idempotency_key_idx", "id_start": "_id_idx",
                    "id_end": "_reverse_idx", "input": "_input_idx",
                    "since": "_created_at_id_idx", "workflow": "_workflow_name_created_at_idx"}
        used = {kind: indexes(conn, filters[kind]) for kind in expected}
        missed = {kind: used[kind] for kind, suffix in expected.items()
                  if not any(i.startswith("konduit_history") and i.endswith(suffix)
                             for i in used[kind])}
        assert missed == {}
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {q('execution_list_older_than_cursor')}"
                           .encode(), {"status": "succeeded", "workflow_name": None,
                                       "before_at": None, "before_id": None,
                                       "limit": 50}).fetchone()
        assert row is not None
        assert not [n for n in nodes(row[0][0]["Plan"])
                    if n.get("Relation Name") in partitions and n["Node Type"] == "Seq Scan"]
        with conn.transaction(force_rollback=True):
            used = {i for i in indexes(conn, filters["tag"]) if i.startswith("konduit_history")}
            assert any("tags" in i for i in used), used
            conn.execute("DROP INDEX konduit_history_executions_tags")
            used = {i for i in indexes(conn, filters["tag"]) if i.startswith("konduit_history")}
            assert not any("tags" in i for i in used), used


def test_a_steps_durations_are_read_from_the_history_too(make_app, db_url):
    """An adaptive deadline's quantile, the steps' spans (``konduit plan``, a window's reserve),
    the workflow's overheads and ``konduit stats`` (attempts, joins, fan-in waits) read the
    history beside the hot tables (migration 0045): what they give is the same before and after
    every run moved. A nightly pipeline's runs are
    mostly in the history once history_after= is set; read from the hot tables alone, its
    adaptive deadline would fall back to its default for want of samples."""
    from datetime import UTC, datetime, timedelta

    from konduit.engine.deadlines import (
        MAX_SAMPLES,
        MIN_SAMPLES,
        OVERHEAD_EXECUTIONS,
        RESERVE_HISTORY,
    )
    from tests.test_history import nodes

    wf = konduit.Workflow("hist-durations", version=1)

    @wf.step(deadline=konduit.Deadline.adaptive())
    def fetch(ctx: konduit.Context) -> int:
        return 1

    @wf.step()
    def side(ctx: konduit.Context) -> int:
        return 3

    @wf.step(after=[fetch, side])
    def store(ctx: konduit.Context) -> int:
        return 2

    app = make_app(wf)
    runs = MIN_SAMPLES + 2
    with running_worker(app, poll_interval=0.05):
        handles = [app.start(wf.name, {"n": n}) for n in range(runs)]
        for h in handles:
            h.wait(timeout=60)
    reads = {
        "step_duration_quantile": {"workflow_name": wf.name, "step": "fetch", "quantile": 0.99,
                                   "window_seconds": 7 * 86400.0, "max_samples": MAX_SAMPLES},
        "step_span_quantiles_by_workflow": {"workflow_name": wf.name,
                                            "history_seconds": RESERVE_HISTORY},
        "workflow_overhead_quantiles": {"workflow_name": wf.name,
                                        "history_seconds": RESERVE_HISTORY,
                                        "max_executions": OVERHEAD_EXECUTIONS},
        # konduit stats and the fan-in alerts: the latency of every branch and every join.
        "step_attempt_stats_by_workflow": {"workflow_name": None, "history_seconds": 86400.0},
        "step_join_stats_by_workflow": {"workflow_name": wf.name, "history_seconds": 86400.0},
        "step_join_waits_recent": {"workflow_name": None, "history_seconds": 86400.0,
                                   "threshold_seconds": 60.0, "per_join": 100},
    }

    def read_all() -> dict[str, Any]:
        from psycopg.rows import dict_row

        from konduit.db.queries import q
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            # How long ago the last success was moves on between two reads: left out.
            return {name: [{k: v for k, v in row.items() if k != "since_last_success"}
                           for row in conn.execute(q(name).encode(), params)]  # type: ignore
                    for name, params in reads.items()}

    before = read_all()
    assert before["step_duration_quantile"][0]["samples"] == runs  # every run a sample
    assert {r["step"]: r["samples"] for r in before["step_span_quantiles_by_workflow"]} \
        == {"fetch": runs, "side": runs, "store": runs}
    assert {r["step"]: r["attempts"] for r in before["step_attempt_stats_by_workflow"]} \
        == {"fetch": runs, "side": runs, "store": runs}
    assert [(r["step"], r["samples"]) for r in before["step_join_stats_by_workflow"]] \
        == [("store", runs)]
    assert len(before["step_join_waits_recent"]) == runs
    assert all(set(r["ends"]) == {"fetch", "side", "store"}
               for r in before["step_join_waits_recent"])
    assert move(app) == runs
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM konduit_tasks").fetchone() == (0,)
    after = read_all()
    assert after == before

    # The quantile reads the history's partitions by their index of a step's successes, and
    # the window prunes the days that ended before it (none here: one day, today's).
    from konduit.db.queries import q
    with psycopg.connect(db_url) as conn:
        conn.execute("SET enable_seqscan = off")
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {q('step_duration_quantile')}".encode(),
                           reads["step_duration_quantile"]).fetchone()  # type: ignore[arg-type]
        assert row is not None
        used = {n.get("Index Name", "") for n in nodes(row[0][0]["Plan"])}
        assert any(i.startswith("konduit_history_tasks_p") and "split_part" in i for i in used), used
        # A day that ended before the window began is not read: a partition 30 days old is
        # pruned from a read over 7 days, and read over 60.
        old = (datetime.now(UTC) - timedelta(days=30)).date()
        conn.execute("SELECT konduit_history_partition(%s)", (old,))
        partition = f"konduit_history_tasks_p{old:%Y%m%d}"

        def reads_partition(days: float) -> bool:
            params = {**reads["step_duration_quantile"], "window_seconds": days * 86400.0}
            row = conn.execute(f"EXPLAIN (FORMAT JSON) {q('step_duration_quantile')}".encode(),
                               params).fetchone()  # type: ignore[arg-type]
            assert row is not None
            return partition in {n.get("Relation Name") for n in nodes(row[0][0]["Plan"])}
        assert not reads_partition(7)
        assert reads_partition(60)


def test_the_answers_of_a_moved_execution_stay_readable(make_app, db_url):
    """Who answered a person's step, what and when is the execution's audit record: it reads the
    same through the App and the clients after the execution moved into the history (its
    events stay where they are, and retention keeps them as long as the execution)."""
    from tests.support.waiting import until
    from tests.test_people_waits import FAST, approval_workflow, waiting_in_inbox

    app = make_app(approval_workflow(name="hist-answers"))
    with running_worker(app, **FAST):
        handle = app.start("hist-answers", input={"claim": 7})
        until(lambda: waiting_in_inbox(app, handle.id), what="the inbox row")
        app.answer(handle.id, "approve", {"decision": "approve", "amount": 40},
                   answered_by="ada")
        handle.wait(timeout=30)

    def answers() -> dict[str, Any]:
        with konduit.Client(db_url) as client:
            read = {"app": app.answers(handle.id), "client": client.answers(handle.id)}

        async def by_async() -> Any:
            async with konduit.AsyncClient(db_url) as client:
                return await client.answers(handle.id)
        return {**read, "async": asyncio.run(by_async())}

    before = answers()
    assert [(a.step, a.answered_by) for a in before["app"]] == [("approve", "ada")]
    assert before["client"] == before["app"] == before["async"]
    assert move(app) == 1
    assert answers() == before
    # Retention keeps the answers as long as their execution, wherever it is kept: an old
    # answer of a moved execution is not pruned.
    with psycopg.connect(db_url) as conn:
        assert conn.execute("UPDATE konduit_events SET created_at = created_at - interval"
                            " '2 days' WHERE execution_id = %s", (handle.id,)).rowcount == 1
    app.prune(older_than="1d")
    assert answers() == before


def test_a_read_of_one_execution_plans_only_the_days_it_can_be_in(make_app, db_url):
    """With many days kept in the history, a read of one execution does not plan (nor probe)
    every day's partition: it reads konduit_<table>_of (migration 0047), which plans only the
    days from the one before its id was made; its parent, children and forks are read in the
    days from its id's. A read through the views, the control, plans every day."""
    import re
    from datetime import UTC, datetime, timedelta

    from konduit.db.queries import all_queries, q
    from tests.test_history import nodes

    wf = konduit.Workflow("hist-days", version=1)
    wf.step(name="only")(lambda ctx: 1)
    app = make_app(wf)
    with running_worker(app, poll_interval=0.05):
        handle = app.start("hist-days", {})
        handle.wait(timeout=60)
    eid = handle.id
    today = datetime.now(UTC).date()
    with psycopg.connect(db_url, autocommit=True) as conn:
        for back in range(60):
            conn.execute("SELECT konduit_history_partition(%s)", (today - timedelta(days=back),))

    values = {"id": eid, "execution_id": eid, "limit": 10, "sealed": False, "steps": ["only"],
              "step": "only", "status": None, "from_index": 0, "name": "s", "from_offset": 0,
              "per_step": 5}
    reading = re.compile(r"\bkonduit_\w+_(of|since)\(")
    names = sorted(n for n, query in all_queries().items()
                   if reading.search(query.sql) and not query.sql.lstrip().startswith(
                       ("INSERT", "UPDATE", "DELETE")))
    assert {"task_list_by_execution", "execution_get_with_history", "execution_parent_of",
            "execution_children_list", "execution_list_forks"} <= set(names)

    def history_plan(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with psycopg.connect(db_url) as conn:
            row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}".encode(),
                               params).fetchone()
        assert row is not None
        return [n for n in nodes(row[0][0]["Plan"])
                if n.get("Relation Name", "").startswith("konduit_history_")]

    wide = {}
    for name in names:
        params = {k: v for k, v in values.items() if f"%({k})s" in q(name)}
        days = {n["Relation Name"].rsplit("_p", 1)[1] for n in history_plan(q(name), params)}
        if len(days) > 2:  # the id's day and the one before (the clocks' margin)
            wide[name] = sorted(days)
    assert wide == {}
    # The control: the views' text plans every day.
    control = "SELECT * FROM konduit_tasks_all WHERE execution_id = %(execution_id)s"
    assert len({n["Relation Name"].rsplit("_p", 1)[1] for n in history_plan(
        control, {"execution_id": eid})}) == 60
