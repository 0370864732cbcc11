"""Commits per task and branch tasks/s: 50 executions x 20 no-op branches + a join, started
while no worker runs, then one worker process x 8 slots drains them (issue 8).

    KONDUIT_HOME=/tmp/somewhere python scripts/commits_per_task.py     # embedded server

MEASURE_EXECUTIONS, MEASURE_WIDTH, MEASURE_CONCURRENCY change the load. MEASURE_SHAPE=map runs
one execution of a map of MEASURE_EXECUTIONS x MEASURE_WIDTH items instead (seed -> map -> a join
reading every item): its items are the "branch tasks", so the two shapes compare per task.
Prints one JSON line.

xact_commit is read from the admin database after every backend of the measured database has
exited (a backend flushes its statistics at exit), so the count is complete; the polls this
script makes are counted and subtracted."""

import asyncio
import json
import resource
import os
import signal
import subprocess
import sys
import time
import uuid

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
APP = "commits_per_task_app"
EXECUTIONS = int(os.environ.get("MEASURE_EXECUTIONS", "50"))
WIDTH = int(os.environ.get("MEASURE_WIDTH", "20"))
CONCURRENCY = int(os.environ.get("MEASURE_CONCURRENCY", "8"))
SHAPE = os.environ.get("MEASURE_SHAPE", "static")


def commits(admin: str, name: str) -> int:
    last = -1
    for _ in range(50):
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                               (name,)).fetchone()
            busy = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                (name,)).fetchone()
        value = row[0]
        if value == last and busy[0] == 0:
            return value
        last = value
        time.sleep(0.2)
    raise RuntimeError("xact_commit never settled")


def server_cpu_seconds() -> float | None:
    """CPU time of the embedded server: its postmaster's reaped children plus the live ones.
    None when the server is not the embedded one of this KONDUIT_HOME."""
    from konduit.db.embedded import data_directory

    try:
        with open(os.path.join(data_directory(), "postmaster.pid")) as f:
            postmaster = int(f.readline())
    except (OSError, ValueError, ImportError):
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def fields(pid: int) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()

    own = fields(postmaster)
    total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = fields(int(entry))
            except OSError:
                continue
            if int(stat[1]) == postmaster:  # ppid
                total += int(stat[11]) + int(stat[12])
    return total / tick


def main() -> None:
    from konduit.db.database import Database
    from konduit.db.embedded import server_url, with_database
    from konduit.db.migrate import migrate

    admin = server_url("postgres")
    name = f"measure_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(admin, name)

    async def mig() -> None:
        db = Database(url, min_size=1, max_size=2)
        await db.open()
        await migrate(db)
        await db.close()

    asyncio.run(mig())
    env = dict(os.environ, MEASURE_URL=url, MEASURE_WIDTH=str(WIDTH),
               PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    sys.path.insert(0, HERE)
    os.environ["MEASURE_URL"] = url
    app = __import__(APP).app

    began = time.perf_counter()
    if SHAPE == "map":
        app.start("measure-map", input=EXECUTIONS * WIDTH)
    else:
        for _ in range(EXECUTIONS):
            app.start("measure-fan")
    branch = "item" if SHAPE == "map" else "b%%"
    start_seconds = time.perf_counter() - began
    app.close()
    before = commits(admin, name)
    server_before = server_cpu_seconds()
    # MEASURE_PROFILE=SCRIPT: the worker runs as `python SCRIPT worker ...` (a profiling wrapper).
    profile = os.environ.get("MEASURE_PROFILE")
    worker = subprocess.Popen(
        [sys.executable, *([profile] if profile else ["-m", "konduit.cli"]), "worker", f"{APP}:app", "-c", str(CONCURRENCY),
         "--poll-interval", "0.1", "--log-level", os.environ.get("MEASURE_LOG", "WARNING")],
        env=env, cwd=HERE)
    polls = 0
    deadline = time.monotonic() + float(os.environ.get("MEASURE_TIMEOUT", "300"))
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            polls += 1
            (left,) = conn.execute(
                "SELECT count(*) FROM konduit_executions WHERE status = 'running'").fetchone()
            if left == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("executions did not finish")
            time.sleep(0.05)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    # The worker's CPU time (user + system): unlike tasks/s, barely moved by other load.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = usage.ru_utime + usage.ru_stime
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FILTER (WHERE step LIKE '{branch}'),"
            " count(*),"
            f" extract(epoch FROM max(finished_at) FILTER (WHERE step LIKE '{branch}')"
            "        - min(started_at)),"
            " extract(epoch FROM max(finished_at) - min(started_at)),"
            " count(*) FILTER (WHERE status <> 'succeeded')"
            " FROM konduit_tasks").fetchone()
        (ok,) = conn.execute(
            "SELECT count(*) FROM konduit_executions WHERE status = 'succeeded'").fetchone()
    extra = 1  # the connection above
    after = commits(admin, name)
    server_after = server_cpu_seconds()
    branch_tasks, tasks, branch_span, span, bad = row
    delta = after - before - polls - extra
    print(json.dumps({
        "worker_cpu_ms_per_task": round(1000 * worker_cpu / max(1, tasks), 3),
        "worker_system_cpu_ms_per_task": round(1000 * usage.ru_stime / max(1, tasks), 3),
        # Every process of the embedded server (backends, WAL writer, checkpointer) in the run.
        "server_cpu_ms_per_task": None if server_before is None or server_after is None
        else round(1000 * (server_after - server_before) / max(1, tasks), 3),
        "shape": SHAPE, "executions": EXECUTIONS, "width": WIDTH, "concurrency": CONCURRENCY,
        "succeeded_executions": ok, "tasks": tasks, "not_succeeded_tasks": bad,
        "commits": delta, "commits_per_task": round(delta / tasks, 3),
        "branch_tasks_per_second": round(branch_tasks / float(branch_span), 1),
        "tasks_per_second": round(tasks / float(span), 1),
        "client_start_seconds": round(start_seconds, 2),
    }))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
