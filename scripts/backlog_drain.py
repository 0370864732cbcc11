"""Backlog drain: N executions x 9 no-op tasks queued before two worker processes start.

When does the first execution finish, and how do executions finish over time? Issue 8 measured
"no execution finished in 65 s" with 10,000 queued: the claim took ready tasks first in, first
out across executions, so every root ran before any join. Run it from the repository:

    python scripts/backlog_drain.py                         # 10,000 x (8 branches + join), 2 x 8
    python scripts/backlog_drain.py --shape chain           # root -> 7 branches -> join
    PYTHONPATH=/other/checkout/src python scripts/backlog_drain.py   # another konduit

It makes a fresh database on the embedded server (``KONDUIT_HOME``) or the server of
``--admin-url``, queues the backlog (one real ``App.start``, then copies of its rows, so queueing
takes seconds and is the same for any konduit version), starts ``--workers`` processes of
``python -m konduit.cli worker``, waits until all executions finished (or ``--max-seconds``),
stops them and prints JSON. Times are on the database's clock, from the workers' launch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

import konduit
from konduit.core.ids import uuid7
from konduit.db.database import Database
from konduit.db.embedded import server_url, with_database
from konduit.db.migrate import migrate

HERE = Path(__file__).resolve().parent
MARKS = (1, 2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300)


def _noop(value: int) -> Any:
    async def handler(ctx: konduit.Context) -> int:
        return value

    return handler


def roots_workflow() -> konduit.Workflow:
    """8 root branches and their join: 80,000 ready roots at start for 10,000 executions."""
    wf = konduit.Workflow("backlog-roots", version=1)
    branches = [wf.step(name=f"b{i}")(_noop(i)) for i in range(8)]
    wf.step(name="join", after=branches)(_noop(8))
    return wf


def chain_workflow() -> konduit.Workflow:
    """root -> 7 branches -> join (the shape of ``konduit bench``'s backlog)."""
    wf = konduit.Workflow("backlog-chain", version=1)
    root = wf.step(name="root")(_noop(0))
    branches = [wf.step(name=f"b{i}", after=[root])(_noop(i)) for i in range(7)]
    wf.step(name="join", after=branches)(_noop(8))
    return wf


app = konduit.App([roots_workflow(), chain_workflow()])


def _columns(conn: psycopg.Connection[Any], table: str, skip: set[str]) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
        " AND is_generated = 'NEVER' AND identity_generation IS NULL ORDER BY ordinal_position",
        (table,)).fetchall()
    return [r[0] for r in rows if r[0] not in skip]


def queue_backlog(url: str, workflow: str, executions: int) -> float:
    """One execution started by the engine, then ``executions - 1`` copies of its rows with
    later UUIDv7 ids (tasks numbered execution by execution, as sequential starts make them)."""
    began = time.perf_counter()
    with konduit.App([roots_workflow(), chain_workflow()], database_url=url) as starter:
        template = starter.start(workflow).id
    ids = [uuid7() for _ in range(executions - 1)]
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        new = "ids.id"
        for table, key, order in (("konduit_executions", "id", "ids.ord"),
                                  ("konduit_steps", "execution_id", "ids.ord, s.step"),
                                  ("konduit_tasks", "execution_id", "ids.ord, s.id")):
            cols = _columns(conn, table, {key, "id"} if table == "konduit_tasks" else {key})
            conn.execute(
                f"INSERT INTO {table} ({key}, {', '.join(cols)})"  # names from the catalog
                f" SELECT {new}, {', '.join('s.' + c for c in cols)}"
                f" FROM unnest(%s::uuid[]) WITH ORDINALITY AS ids(id, ord), {table} s"
                f" WHERE s.{key} = %s ORDER BY {order}".encode(),
                (ids, template))
        conn.execute("ANALYZE")
    return time.perf_counter() - began


def run(args: argparse.Namespace) -> dict[str, Any]:
    admin = args.admin_url or server_url("postgres")
    name = f"konduit_backlog_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(admin, name)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        async def migrated() -> None:
            db = Database(url, min_size=1, max_size=2)
            await db.open()
            try:
                await migrate(db)
            finally:
                await db.close()

        asyncio.run(migrated())
        workflow = f"backlog-{args.shape}"
        queued = queue_backlog(url, workflow, args.executions)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(HERE)) if p)
        with psycopg.connect(url, autocommit=True) as obs:
            launched = obs.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            for _ in range(args.workers):
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "konduit.cli", "worker", "backlog_drain:app",
                     "--concurrency", str(args.concurrency), "--database-url", url,
                     "--log-level", "WARNING"],
                    cwd=HERE, env=env))
            until = time.monotonic() + args.max_seconds
            while time.monotonic() < until:
                (left,) = obs.execute(  # type: ignore[misc]
                    "SELECT count(*) FROM konduit_executions WHERE finished_at IS NULL").fetchone()
                if left == 0:
                    break
                assert all(w.poll() is None for w in workers), "a worker exited"
                time.sleep(0.25)
            stopped = obs.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
            (first_claim, first_finish, finished, last_finish, tasks) = obs.execute("""
                SELECT extract(epoch FROM (SELECT min(started_at) FROM konduit_attempts) - %(t0)s),
                       extract(epoch FROM min(finished_at) - %(t0)s),
                       count(finished_at),
                       extract(epoch FROM max(finished_at) - %(t0)s),
                       (SELECT count(*) FROM konduit_tasks WHERE finished_at IS NOT NULL)
                FROM konduit_executions""", {"t0": launched}).fetchone()  # type: ignore[misc]
            offsets = [float(r[0]) for r in obs.execute(
                "SELECT extract(epoch FROM finished_at - %s) FROM konduit_executions"
                " WHERE finished_at IS NOT NULL ORDER BY finished_at", (launched,)).fetchall()]
            # Executions finished in start order? Spearman-like: how far each one's finishing
            # rank is from its starting rank, in executions.
            displacement = obs.execute("""
                SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d),
                       percentile_cont(0.95) WITHIN GROUP (ORDER BY d)
                FROM (SELECT abs(row_number() OVER (ORDER BY id)
                                 - row_number() OVER (ORDER BY finished_at, id)) AS d
                      FROM konduit_executions WHERE finished_at IS NOT NULL) x""").fetchone()
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    observed = (stopped - launched).total_seconds()
    by_mark = {str(m): sum(1 for o in offsets if o <= m) for m in MARKS if m <= observed + 1}
    window = 5
    rates = [round(sum(1 for o in offsets if i * window < o <= (i + 1) * window) / window, 1)
             for i in range(int(observed // window) + 1)]

    def r(x: Any) -> float | None:
        return None if x is None else round(float(x), 3)

    return {
        "parameters": {"executions": args.executions, "tasks_each": 9, "workflow": workflow,
                       "workers": args.workers, "concurrency_each": args.concurrency,
                       "konduit": konduit.__file__, "database": name},
        "results": {
            "seconds_to_queue": r(queued),
            "launch_to_first_claim_s": r(first_claim),
            "launch_to_first_finish_s": r(first_finish),
            "first_finish_after_first_claim_s": r(
                None if first_finish is None or first_claim is None
                else float(first_finish) - float(first_claim)),
            "executions_finished": int(finished),
            "tasks_finished": int(tasks),
            "tasks_per_second": r(int(tasks) / (observed - float(first_claim or 0))),
            "launch_to_all_finished_s": r(last_finish) if finished == args.executions else None,
            "observed_s": r(observed),
            "finished_by_second": by_mark,
            f"finishes_per_second_by_{window}s": rates,
            "order_displacement_median": r(displacement[0]) if displacement else None,
            "order_displacement_p95": r(displacement[1]) if displacement else None,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--shape", choices=("roots", "chain"), default="roots")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=180.0)
    parser.add_argument("--admin-url", help="a URL on the server to create the database on")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
