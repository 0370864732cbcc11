"""What retention costs (``konduit bench --only prune_day``): the time to prune a day of history,
and what the prune leaves behind in the tables the workers write.

A day of finished executions (``executions`` of them, ``width`` root steps each, every step a
task with one attempt and one output: the rows a real run keeps) is written with SQL, spread
over the day that ended 25 hours ago, then ``App.prune(older_than="1d")`` deletes them (in its
batches of 500 executions, each cascading to the execution's rows). Reported: the seconds the
prune took, the executions deleted per second, and the dead tuples it left in
``konduit_executions``, ``konduit_steps``, ``konduit_tasks``, ``konduit_attempts`` and
``konduit_outputs`` (work for vacuum: until it runs, every scan of those tables walks past them).
"""

from __future__ import annotations

import time

import psycopg

import konduit
from konduit.bench.fleet import Json, _check, _r

HOT = ("konduit_executions", "konduit_steps", "konduit_tasks", "konduit_attempts",
       "konduit_outputs")


def fill_day(url: str, *, executions: int, width: int) -> float:
    """``executions`` finished executions of ``width`` root steps, finished over the day that
    ended 25 hours ago, with their steps, tasks, attempts and outputs; seconds it took."""
    began = time.perf_counter()
    spacing = 86400.0 / executions
    with psycopg.connect(url, autocommit=True) as conn:
        version = int(conn.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
        # Execution ids sort by creation time (UUIDv7): the day gets ids from its own time.
        make_id = ("uuidv7(- make_interval(secs => 90000 + g * %(spacing)s))"
                   if version >= 180000 else "gen_random_uuid()")
        with conn.transaction():
            # The executions' workflow: a row to refer to (nothing here runs it).
            conn.execute("""
                INSERT INTO konduit_workflows (name, version, spec_hash, spec)
                VALUES ('bench-prune', 1, 'bench-prune', '{"name": "bench-prune"}')
                ON CONFLICT DO NOTHING""")
            conn.execute(f"""
                INSERT INTO konduit_executions (id, workflow_name, workflow_version, status,
                    input_hash, steps_pending, output, created_at, finished_at)
                SELECT {make_id}, 'bench-prune', 1, 'succeeded', 'prune-day', 0, '1',
                       now() - make_interval(secs => 90000 + g * %(spacing)s + 1),
                       now() - make_interval(secs => 90000 + g * %(spacing)s)
                FROM generate_series(1, %(executions)s) g""",
                         {"spacing": spacing, "executions": executions})
            conn.execute("""
                INSERT INTO konduit_steps (execution_id, step, status, up_total, up_pending,
                    tasks_total, tasks_ok, fired_at, ended_at)
                SELECT e.id, 's' || i, 'succeeded', 0, 0, 1, 1, e.created_at, e.finished_at
                FROM konduit_executions e, generate_series(1, %(width)s) i
                WHERE e.input_hash = 'prune-day'""", {"width": width})
            conn.execute("""
                INSERT INTO konduit_tasks (execution_id, workflow, step, status, attempt,
                    max_attempts, output_hash, created_at, started_at, finished_at, worker_id)
                SELECT e.id, 'bench-prune@1', 's' || i, 'succeeded', 1, 3, 'h' || i,
                       e.created_at, e.created_at, e.finished_at, 'prune-day'
                FROM konduit_executions e, generate_series(1, %(width)s) i
                WHERE e.input_hash = 'prune-day'""", {"width": width})
            conn.execute("""
                INSERT INTO konduit_attempts (task_id, attempt, worker_id, lease_token,
                    started_at, finished_at, outcome)
                SELECT id, 1, 'prune-day', gen_random_uuid(), started_at, finished_at,
                       'succeeded'
                FROM konduit_tasks WHERE worker_id = 'prune-day'""")
            conn.execute("""
                INSERT INTO konduit_outputs (execution_id, step, map_index, content_hash,
                    payload)
                SELECT execution_id, step, 0, output_hash, '{"ok": true}'
                FROM konduit_tasks WHERE worker_id = 'prune-day'""")
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


def dead_tuples(url: str) -> dict[str, int]:
    """n_dead_tup of the hot tables, once the statistics collector has the prune's deletes."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute("SELECT relname::text, n_dead_tup FROM pg_stat_user_tables"
                            " WHERE relname = ANY(%s)", (list(HOT),)).fetchall()
    return {name: int(n) for name, n in rows}


def prune_day(url: str, *, executions: int, width: int = 10) -> Json:
    """Fill a day of history (:func:`fill_day`), prune it with ``App.prune(older_than="1d")``
    and report the time it took and the dead tuples it left."""
    filled = fill_day(url, executions=executions, width=width)
    with konduit.App([], database_url=url) as app:
        app.migrate()  # opens the pool: the prune below is warm
        began = time.perf_counter()
        deleted = app.prune("1d")
        seconds = time.perf_counter() - began
    _check(deleted == executions, f"prune_day: {deleted} of {executions} deleted")
    dead = dead_tuples(url)
    return {
        "parameters": {"executions": executions, "width": width,
                       "rows": {"executions": executions, "steps": executions * width,
                                "tasks": executions * width, "attempts": executions * width,
                                "outputs": executions * width},
                       "how": "App.prune(older_than='1d'): batches of 500 executions, each a "
                              "DELETE cascading to the execution's rows"},
        "results": {"seconds_to_fill": _r(filled), "prune_seconds": _r(seconds),
                    "executions_pruned_per_second": _r(executions / seconds),
                    "dead_tuples_left": dead,
                    "dead_tuples_left_total": sum(dead.values())},
    }
