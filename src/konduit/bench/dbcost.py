"""What Konduit costs the database per task (``konduit bench --only db_cost``): WAL bytes and the
server's CPU, beside the bare fan-in protocol run on the same server in the same run.

The **bare protocol** is the least a correct fan-in needs: its executions and tasks are created
(inside the meter, as Konduit's run starts its executions inside it), a ready task is claimed with
``FOR UPDATE SKIP LOCKED``, and in the same transaction completed and counted into its execution
under the execution's row lock; the branch that brings the count to zero inserts the join task.
One transaction per task, no attempts, no outputs table, no history: every figure of Konduit's
is also given as a ratio to it.

Two more baselines run beside it, each a floor a redesign could aim at: the **leased protocol**
(:data:`LEASED_SCHEMA`: a lease committed before the handler runs, fenced completions, an index
of lapsed leases) and the **lean protocol** (:data:`LEAN_SCHEMA`: the leased one with Konduit's
idempotency key, UUID execution ids and outputs, laid out so that every update of a task row is
heap-only).

- **WAL** is the server's WAL position before and after (``pg_current_wal_lsn``): server-wide,
  so run it on a quiet server. With ``pg_walinspect`` (PostgreSQL 15+; the extension is created
  in the scratch database) the WAL of the run is also broken down by relation (PostgreSQL 16+:
  ``pg_get_wal_block_info``) and by resource manager.
- **Server CPU** is read from ``/proc`` when the server runs on this machine: the postmaster's
  own and reaped children's time (``cutime``/``cstime``) plus every live child's, so backends
  that come and go are counted. ``None`` for a remote server.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from konduit.bench.fleet import Json, _check, _r, ratio, throughput_run

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command may hold spaces and parentheses: fields start after the last ')'.
    return text[text.rindex(")") + 2:].split()


def server_cpu_seconds(postmaster: int) -> float | None:
    """The CPU seconds of a local PostgreSQL server so far: the postmaster's own time, its
    reaped children's (``cutime``, ``cstime``) and every live child's (None: not local)."""
    own = _stat(postmaster)
    if own is None:
        return None
    # Fields (after pid and comm): state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14.
    total = sum(int(own[i]) for i in (11, 12, 13, 14))
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields is not None and fields[1] == str(postmaster):
            total += int(fields[11]) + int(fields[12])
    return total / _TICKS


@dataclass
class Reading:
    lsn: str
    cpu: float | None
    at: float


class ServerMeter:
    """Reads a server's WAL position and CPU, and breaks a span of WAL down (``pg_walinspect``)."""

    def __init__(self, url: str):
        self.url = url
        # A connection only while reading: the throughput run waits for the database's other
        # sessions to go before it counts commits.
        with self._connect() as conn:
            self.database = conn.info.dbname
            self.version = conn.info.server_version
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            stat = _stat(int(pid[0])) if pid is not None else None
            self.postmaster = int(stat[1]) if stat is not None else None
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                self.walinspect = True
            except psycopg.Error:
                self.walinspect = False

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)

    def read(self) -> Reading:
        with self._connect() as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        cpu = None if self.postmaster is None else server_cpu_seconds(self.postmaster)
        return Reading(row[0], cpu, time.perf_counter())

    def wal_bytes(self, before: Reading, after: Reading) -> int:
        with self._connect() as conn:
            row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint",
                               (after.lsn, before.lsn)).fetchone()
        assert row is not None
        return int(row[0])

    def breakdown(self, before: Reading, after: Reading, top: int = 15) -> Json | None:
        """The span's WAL by resource manager and (PostgreSQL 16+) by relation of this database:
        bytes of block data and full-page images per table or index, biggest first."""
        if not self.walinspect:
            return None
        try:
            with self._connect() as conn:
                # The span ends at the WAL's insert position; pg_walinspect reads only what is
                # flushed ("cannot accept future end LSN" before PostgreSQL 16): the WAL writer
                # flushes the rest within its delay (200 ms by default), so wait for it.
                for _ in range(100):
                    row = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn",
                                       (after.lsn,)).fetchone()
                    if row is not None and row[0]:
                        break
                    time.sleep(0.05)
                return self._breakdown(conn, before, after, top)
        except psycopg.Error as exc:
            # On a busy server a checkpoint may recycle the span's WAL before it is read
            # ("requested WAL segment ... has already been removed"): the totals stand.
            return {"unavailable": str(exc).strip()}

    def _breakdown(self, conn: psycopg.Connection[Any], before: Reading, after: Reading,
                   top: int) -> Json:
        by_kind = [
            {"resource_manager": r[0], "records": int(r[1]), "bytes": int(r[2]),
             "fpi_bytes": int(r[3])}
            for r in conn.execute(
                'SELECT "resource_manager/record_type", count, combined_size, fpi_size'
                " FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn) WHERE count > 0"
                " ORDER BY combined_size DESC", (before.lsn, after.lsn)).fetchall()]
        out: Json = {"by_resource_manager": by_kind}
        if self.version >= 160000:
            rows = conn.execute("""
                SELECT coalesce(pg_filenode_relation(b.reltablespace, b.relfilenode)::text,
                                'relfilenode ' || b.relfilenode) AS relation,
                       count(*), sum(b.block_data_length + b.block_fpi_length)::bigint,
                       count(*) FILTER (WHERE b.block_fpi_length > 0)
                FROM pg_get_wal_block_info(%s::pg_lsn, %s::pg_lsn, false) b
                WHERE b.reldatabase = (SELECT oid FROM pg_database WHERE datname = %s)
                GROUP BY 1 ORDER BY 3 DESC""", (before.lsn, after.lsn, self.database)).fetchall()
            total = sum(int(r[2]) for r in rows) or 1
            out["by_relation"] = [
                {"relation": r[0], "block_refs": int(r[1]), "bytes": int(r[2]),
                 "share": _r(int(r[2]) / total), "full_page_images": int(r[3])}
                for r in rows[:top]]
            out["by_relation_note"] = (
                "block data and full-page images per relation of the benchmark's database; "
                "record headers and main data are in by_resource_manager only")
        return out

    def close(self) -> None:
        """Nothing is held between readings."""


@contextmanager
def metered(meter: ServerMeter, *, breakdown: bool = True) -> Iterator[dict[str, Any]]:
    """Measure the WAL and server CPU of the block: the dict gets ``wal_bytes``,
    ``server_cpu_seconds`` and (unless ``breakdown=False``) ``breakdown`` on exit."""
    found: dict[str, Any] = {}
    # No CHECKPOINT first: it would make the first write to every page the scratch database
    # was created with (dozens of index roots) a full-page image, a cost a running deployment
    # pays once per checkpoint for its busiest pages, not once per run.
    before = meter.read()
    yield found
    after = meter.read()
    found["wal_bytes"] = meter.wal_bytes(before, after)
    found["server_cpu_seconds"] = (None if before.cpu is None or after.cpu is None
                                   else after.cpu - before.cpu)
    found["breakdown"] = meter.breakdown(before, after) if breakdown else None


BARE_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS bare;
DROP TABLE IF EXISTS bare.tasks, bare.executions;
CREATE TABLE bare.executions (
    id bigint PRIMARY KEY,
    remaining integer NOT NULL,
    status text NOT NULL DEFAULT 'running'
);
CREATE TABLE bare.tasks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id bigint NOT NULL REFERENCES bare.executions (id),
    step text NOT NULL,
    status text NOT NULL DEFAULT 'ready',
    output jsonb
);
CREATE INDEX bare_tasks_ready ON bare.tasks (id) WHERE status = 'ready';
"""

LEASED_SCHEMA = """
ALTER TABLE bare.tasks ADD COLUMN lease_token uuid, ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN worker_id text, ADD COLUMN started_at timestamptz, ADD COLUMN finished_at timestamptz;
CREATE INDEX bare_tasks_running ON bare.tasks (lease_expires_at) WHERE status = 'running';
"""
"""The leased protocol: the bare one with what a worker that may die needs and holds no
transaction open through a handler: the claim commits a lease (token, expiry, worker) on its
own, the rescue finds lapsed leases by an index, and the completion re-checks the lease."""

LEASED_CLAIM = """
UPDATE bare.tasks SET status = 'running', lease_token = %(token)s,
       lease_expires_at = now() + interval '15 seconds', worker_id = %(worker)s, started_at = now()
WHERE id = (SELECT id FROM bare.tasks WHERE status = 'ready'
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING id, execution_id, step
"""

LEAN_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS lean;
DROP TABLE IF EXISTS lean.leases, lean.ready, lean.tasks, lean.executions;
CREATE TABLE lean.executions (
    id uuid PRIMARY KEY,
    remaining integer NOT NULL,
    status text NOT NULL DEFAULT 'running'
) WITH (fillfactor = 50);
CREATE TABLE lean.tasks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id uuid NOT NULL REFERENCES lean.executions (id),
    step text NOT NULL,
    map_index integer NOT NULL DEFAULT -1,
    generation integer NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'ready',
    attempt integer NOT NULL DEFAULT 0,
    worker_id text,
    started_at timestamptz,
    finished_at timestamptz,
    output jsonb,
    UNIQUE (execution_id, step, map_index, generation)
) WITH (fillfactor = 50);
CREATE TABLE lean.ready (task_id bigint PRIMARY KEY);
CREATE TABLE lean.leases (
    task_id bigint PRIMARY KEY,
    attempt integer NOT NULL,
    token uuid NOT NULL,
    worker_id text NOT NULL,
    started_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX lean_leases_expiry ON lean.leases (expires_at);
"""
"""The lean protocol: the leased one laid out for the least WAL a design with Konduit's
guarantees could write per task, the floor for a redesign of Konduit's task row. The task row
keeps Konduit's idempotency key (execution, step, map index, generation), UUID execution ids and
its output; nothing indexed on it ever changes, so its one update (the completion, which also
records the attempt) is heap-only. The ready queue and the leases are rows of their own: the
claim deletes a ready row and inserts a lease (with its attempt, worker and start) and writes
nothing to the task; the completion deletes the lease, fenced by its token, in the statement that
records the outcome. The lapsed-lease index stays (a rescue must find them)."""

LEAN_CLAIM = """
WITH claimed AS (
    DELETE FROM lean.ready
    WHERE task_id = (SELECT task_id FROM lean.ready ORDER BY task_id FOR UPDATE SKIP LOCKED LIMIT 1)
    RETURNING task_id
), leased AS (
    INSERT INTO lean.leases (task_id, attempt, token, worker_id, started_at, expires_at)
    SELECT t.id, t.attempt + 1, %(token)s, %(worker)s, now(), now() + interval '15 seconds'
    FROM claimed JOIN lean.tasks t ON t.id = claimed.task_id
    RETURNING task_id
)
SELECT t.id, t.execution_id, t.step FROM leased JOIN lean.tasks t ON t.id = leased.task_id
"""

LEAN_COMPLETE = """
WITH fenced AS (
    DELETE FROM lean.leases WHERE task_id = %(task)s AND token = %(token)s
    RETURNING task_id, attempt, worker_id, started_at
)
UPDATE lean.tasks t SET status = 'succeeded', output = '1', attempt = fenced.attempt,
       worker_id = fenced.worker_id, started_at = fenced.started_at, finished_at = now()
FROM fenced WHERE t.id = fenced.task_id
"""

LEAN_ENQUEUE = """
WITH made AS (
    INSERT INTO lean.tasks (execution_id, step, map_index)
    SELECT %(execution)s, %(step)s, g FROM generate_series(1, %(count)s) g
    ON CONFLICT DO NOTHING RETURNING id
)
INSERT INTO lean.ready (task_id) SELECT id FROM made
"""

BARE_CLAIM = """
UPDATE bare.tasks SET status = 'running'
WHERE id = (SELECT id FROM bare.tasks WHERE status = 'ready'
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING id, execution_id, step
"""


PROTOCOLS = ("bare", "leased", "lean")


def bare_protocol(url: str, *, executions: int, width: int, concurrency: int,
                  meter: ServerMeter, warm: int = 0, leased: bool = False,
                  protocol: str | None = None) -> Json:
    """``executions`` x ``width`` branches + a join through the bare protocol, on
    ``concurrency`` threads with a connection each; one transaction per task. ``protocol``
    (or ``leased``) picks a baseline of :data:`PROTOCOLS`: ``leased`` (:data:`LEASED_SCHEMA`)
    and ``lean`` (:data:`LEAN_SCHEMA`) take two transactions per task, the claim's and the
    completion's. ``warm`` executions run first, outside the meter, on the same connections
    (as Konduit's warm-up)."""
    kind = protocol or ("leased" if leased else "bare")
    if kind not in PROTOCOLS:
        raise ValueError(f"protocol {kind!r}: expected one of {', '.join(PROTOCOLS)}")
    lean = kind == "lean"
    leased = kind != "bare"
    ids = [uuid.uuid4() for _ in range(warm + executions)] if lean else []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LEAN_SCHEMA if lean else BARE_SCHEMA)
        if kind == "leased":
            conn.execute(LEASED_SCHEMA)

    def create(first: int, count: int) -> None:
        # Inside the meter: Konduit's run pays for starting its executions (their rows and
        # their tasks' rows), so the baseline pays for creating its own.
        with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
            for e in range(first, first + count):
                if lean:
                    conn.execute("INSERT INTO lean.executions (id, remaining) VALUES (%s, %s)",
                                 (ids[e], width))
                    conn.execute(LEAN_ENQUEUE, {"execution": ids[e], "step": "branch",
                                                "count": width})
                    continue
                conn.execute("INSERT INTO bare.executions (id, remaining) VALUES (%s, %s)",
                             (e, width))
                conn.execute("INSERT INTO bare.tasks (execution_id, step)"
                             " SELECT %s, 'branch' FROM generate_series(1, %s)", (e, width))

    done = threading.Event()
    finished = [0]
    reached = threading.Condition()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(url) as c:
                worker = f"bare-{threading.get_ident()}"
                while not done.is_set():
                    token = uuid.uuid4()
                    claimed = None
                    if leased:  # the lease commits before the handler would run
                        with c.transaction():
                            claimed = c.execute(LEAN_CLAIM if lean else LEASED_CLAIM,
                                                {"token": token, "worker": worker}).fetchone()
                    with c.transaction():
                        row = claimed if leased else c.execute(BARE_CLAIM).fetchone()
                        if row is None:
                            idle = True
                        else:
                            idle = False
                            task, execution, step = row
                            schema = "lean" if lean else "bare"
                            c.execute(f"SELECT 1 FROM {schema}.executions WHERE id = %s"
                                      " FOR UPDATE", (execution,))
                            if lean:
                                c.execute(LEAN_COMPLETE, {"task": task, "token": token})
                            elif leased:
                                c.execute("UPDATE bare.tasks SET status = 'succeeded',"
                                          " output = '1', lease_token = NULL,"
                                          " lease_expires_at = NULL, finished_at = now()"
                                          " WHERE id = %s AND lease_token = %s", (task, token))
                            else:
                                c.execute("UPDATE bare.tasks SET status = 'succeeded',"
                                          " output = '1' WHERE id = %s AND status = 'running'",
                                          (task,))
                            if step == "branch":
                                left = c.execute(
                                    f"UPDATE {schema}.executions SET remaining = remaining - 1"
                                    " WHERE id = %s RETURNING remaining", (execution,)).fetchone()
                                if left is not None and left[0] == 0 and lean:
                                    c.execute(LEAN_ENQUEUE, {"execution": execution,
                                                             "step": "join", "count": 1})
                                elif left is not None and left[0] == 0:
                                    c.execute("INSERT INTO bare.tasks (execution_id, step)"
                                              " VALUES (%s, 'join')", (execution,))
                            else:
                                c.execute(f"UPDATE {schema}.executions SET status = 'succeeded'"
                                          " WHERE id = %s", (execution,))
                                with reached:
                                    finished[0] += 1
                                    reached.notify_all()
                    if idle:
                        time.sleep(0.001)
        except BaseException as exc:  # reported below; a thread must not die silently
            errors.append(exc)
            done.set()
            with reached:
                reached.notify_all()

    def wait_for(count: int) -> None:
        with reached:
            reached.wait_for(lambda: finished[0] >= count or done.is_set(),
                             timeout=max(120.0, executions * width / 20))

    threads = [threading.Thread(target=run, name=f"bare-{i}") for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        if warm:
            create(0, warm)
            wait_for(warm)
        with metered(meter) as cost:
            began = time.perf_counter()
            create(warm, executions)
            wait_for(warm + executions)
            seconds = time.perf_counter() - began
    finally:
        done.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    _check(finished[0] == warm + executions,
           f"{kind} protocol: {finished[0] - warm} of {executions} finished")
    return {"seconds": _r(seconds), **cost}


def per_task(cost: Json, branches: int) -> Json:
    cpu = cost.get("server_cpu_seconds")
    return {"wal_bytes_per_branch_task": _r(cost["wal_bytes"] / branches),
            "server_cpu_ms_per_branch_task": None if cpu is None else _r(cpu * 1000 / branches)}


def db_cost(fresh: Callable[[], Any], *, executions: int, repeats: int, width: int = 20,
            concurrency: int = 8, warm: int = 30) -> Json:
    """Konduit's throughput workload (``executions`` x ``width`` branches + a join, one worker
    process x ``concurrency`` slots) and the bare, leased and lean protocols on the same
    server, ``repeats`` times each, alternating; medians per branch task, and their ratios."""
    branches = executions * width
    konduit_runs: list[Json] = []
    bare_runs: list[Json] = []
    leased_runs: list[Json] = []
    lean_runs: list[Json] = []
    breakdown: Json | None = None
    for _ in range(repeats):
        with fresh() as url:
            meter = ServerMeter(url)
            try:
                spans: list[dict[str, Any]] = []

                @contextmanager
                def work(spans: list[dict[str, Any]] = spans,
                         meter: ServerMeter = meter) -> Iterator[None]:
                    with metered(meter) as cost:
                        yield
                    spans.append(cost)

                with metered(meter, breakdown=False) as whole:
                    run = throughput_run(url, executions=executions, width=width,
                                         concurrency=concurrency, label="db-cost",
                                         work_span=work, warm=warm)
                [cost] = spans
                whole_run = per_task(whole, branches)
                konduit_runs.append({
                    **per_task(cost, branches), "wal_bytes": cost["wal_bytes"],
                    "branch_tasks_per_second": run["branch_tasks_per_second"],
                    # The worker process's start and stop and the bench's own reads too.
                    "whole_run": {"wal_bytes_per_branch_task":
                                  whole_run["wal_bytes_per_branch_task"],
                                  "server_cpu_ms_per_branch_task":
                                  whole_run["server_cpu_ms_per_branch_task"]}})
                breakdown = cost["breakdown"]
            finally:
                meter.close()
        for runs, protocol in ((bare_runs, "bare"), (leased_runs, "leased"),
                               (lean_runs, "lean")):
            with fresh() as url:
                meter = ServerMeter(url)
                try:
                    bare = bare_protocol(url, executions=executions, width=width,
                                         concurrency=concurrency, meter=meter, warm=warm,
                                         protocol=protocol)
                    runs.append({**per_task(bare, branches), "wal_bytes": bare["wal_bytes"],
                                 "branch_tasks_per_second": _r(branches / bare["seconds"])})
                finally:
                    meter.close()

    def median(runs: list[Json], key: str) -> float | None:
        values = sorted(r[key] for r in runs if r[key] is not None)
        return values[(len(values) - 1) // 2] if values else None

    keys = ("wal_bytes_per_branch_task", "server_cpu_ms_per_branch_task",
            "branch_tasks_per_second")
    ours = {k: median(konduit_runs, k) for k in keys}
    theirs = {k: median(bare_runs, k) for k in keys}
    floor = {k: median(leased_runs, k) for k in keys}
    lean = {k: median(lean_runs, k) for k in keys}
    return {
        "parameters": {"executions": executions, "width": width, "processes": 1,
                       "concurrency": concurrency, "repeats": repeats,
                       "bare_protocol": "its executions and tasks created (in one transaction), "
                                        "then claim with SKIP LOCKED, complete and fan in under "
                                        "the execution's row lock, one transaction per task",
                       "leased_protocol": "the bare protocol with a lease: the claim commits "
                                          "a lease (token, expiry, worker) in a transaction "
                                          "of its own, lapsed leases are found by an index, "
                                          "the completion re-checks the lease: the least a "
                                          "worker that holds no transaction through a "
                                          "handler writes",
                       "lean_protocol": "the leased protocol laid out for the least WAL with "
                                        "Konduit's guarantees: its idempotency key and UUID "
                                        "execution ids on the task row, the output on it, the "
                                        "ready queue and the leases in tables of their own, "
                                        "nothing indexed on the task row ever changed (its one "
                                        "update, the completion, is heap-only): the floor for "
                                        "a redesign of Konduit's task row",
                       "wal": "server-wide WAL position before and after each run: run on a "
                              "quiet server",
                       "span": "Konduit: from the start of its executions to the last one "
                               "finished, its worker process up and idle before (as the bare "
                               "protocol's threads are); whole_run: also the worker's start and "
                               "stop and the bench's own reads",
                       "warm_executions": warm,
                       "warm": "both sides first run this many executions to the end on the "
                               "same connections, outside the meter: a long-running worker's "
                               "statements are prepared (PostgreSQL plans a prepared statement "
                               "5 times per connection before it keeps a plan)"},
        "results": {"konduit": ours, "bare_protocol": theirs, "leased_protocol": floor,
                    "lean_protocol": lean,
                    "konduit_runs": konduit_runs, "bare_runs": bare_runs,
                    "leased_runs": leased_runs, "lean_runs": lean_runs,
                    "konduit_wal_breakdown": breakdown},
        "ratios": {
            "wal_per_task_over_bare": ratio(ours["wal_bytes_per_branch_task"],
                                            theirs["wal_bytes_per_branch_task"]),
            "server_cpu_per_task_over_bare": ratio(ours["server_cpu_ms_per_branch_task"],
                                                   theirs["server_cpu_ms_per_branch_task"]),
            "leased_wal_per_task_over_bare": ratio(floor["wal_bytes_per_branch_task"],
                                                   theirs["wal_bytes_per_branch_task"]),
            "wal_per_task_over_leased": ratio(ours["wal_bytes_per_branch_task"],
                                              floor["wal_bytes_per_branch_task"]),
            "lean_wal_per_task_over_bare": ratio(lean["wal_bytes_per_branch_task"],
                                                 theirs["wal_bytes_per_branch_task"]),
            "wal_per_task_over_lean": ratio(ours["wal_bytes_per_branch_task"],
                                            lean["wal_bytes_per_branch_task"]),
        },
    }
