"""``konduit bench --only history_load``: does a large history slow the workers down, once it is
out of the hot tables (migration 0041)?

Three databases, run side by side:

- **empty**: migrated, nothing in it;
- **hot**: ``executions`` finished executions (``width`` root steps each, every step a task with
  an attempt and an output: :func:`konduit.bench.prune.fill_day`), finished over the 30 UTC
  days before today, left in the hot tables (as without ``history_after``);
- **history**: a copy of *hot* whose executions were moved into the history partitions (one a
  day): every row copied into ``konduit_history_<table>`` as ``konduit_history_move`` copies it
  (the same columns, the execution's finished_at), then the hot tables emptied (a TRUNCATE,
  not the move's row deletes: the fill is a fixture, and a database the leader moved a month
  of history out of has had its dead tuples vacuumed long since), then VACUUM ANALYZE.

Then the throughput load (``executions`` 50 x 20 no-op root branches + a join, one worker
process x 8 slots, each run warmed first as db_cost's are: the worker's statements prepared,
its caches full) runs ``repeats`` times on each, the three taking turns (the order rotated each
round, so the machine's drift hits them alike). Reported: every run's tasks/s, the median per
database, and the ratios history/empty and hot/empty (the issue's criterion: history/empty
>= 0.95 with 1,000,000 executions of history).

Not part of the API.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import date

import psycopg

from konduit.bench.fleet import Json, _check, _r, ratio, throughput_run
from konduit.bench.prune import fill_day
from konduit.errors import BenchError

VARIANTS = ("empty", "history", "hot")
TAG = "history-load"

# Where each history table's rows come from, and the execution they hang off (``e``): as in
# konduit_history_move (migration 0041), for every execution the database holds.
_SOURCES = {
    "executions": "konduit_executions x JOIN konduit_executions e ON e.id = x.id",
    "attempts": "konduit_attempts x JOIN konduit_tasks k ON k.id = x.task_id "
                "JOIN konduit_executions e ON e.id = k.execution_id",
    "attempt_logs": "konduit_attempt_logs x JOIN konduit_attempts a "
                    "ON a.lease_token = x.lease_token JOIN konduit_tasks k ON k.id = a.task_id "
                    "JOIN konduit_executions e ON e.id = k.execution_id",
}


def fill_hot(url: str, *, executions: int, width: int, days: int) -> float:
    """``executions`` finished executions over the ``days`` UTC days before today, in the hot
    tables; seconds it took (with VACUUM ANALYZE)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT ((now() AT TIME ZONE 'UTC')::date - 1)").fetchone()
    assert row is not None
    yesterday: date = row[0]
    return fill_day(url, executions=executions, width=width, day=yesterday, days=days, tag=TAG)


def move_all(url: str) -> float:
    """Every execution of the database (all of them finished: the fill's) and its rows into the
    history partitions of the days they finished, as ``konduit_history_move`` copies them, in
    one statement per table; then the hot tables emptied and the database vacuumed. Seconds it
    took."""
    began = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            unfinished = conn.execute(
                "SELECT count(*) FROM konduit_executions WHERE finished_at IS NULL").fetchone()
            _check(unfinished == (0,), f"history_load: {unfinished} unfinished executions")
            conn.execute("""
                SELECT konduit_history_partition(d)
                FROM (SELECT DISTINCT (finished_at AT TIME ZONE 'UTC')::date AS d
                      FROM konduit_executions) days""")
            tables = conn.execute("SELECT unnest(konduit_history_tables())").fetchall()
            for (table,) in tables:
                names = [n for (n,) in conn.execute("""
                    SELECT a.attname::text FROM pg_attribute a
                    WHERE a.attrelid = ('konduit_' || %s)::regclass AND a.attnum > 0
                      AND NOT a.attisdropped ORDER BY a.attnum""", (table,)).fetchall()]
                cols = ", ".join(f'"{n}"' for n in names)
                xcols = ", ".join(f'x."{n}"' for n in names)
                source = _SOURCES.get(
                    table, f"konduit_{table} x JOIN konduit_executions e ON e.id = x.execution_id")
                conn.execute(f"INSERT INTO konduit_history_{table} ({cols}, history_finished_at)"
                             f" SELECT {xcols}, e.finished_at FROM {source}")
            # Every hot table the move empties (steps, tasks and attempts hang off their
            # execution by a trigger, not a foreign key: a TRUNCATE of konduit_executions alone
            # leaves them), and what refers to them (CASCADE: a scratch database's).
            conn.execute("TRUNCATE " + ", ".join(f"konduit_{t}" for (t,) in tables)
                         + " CASCADE")
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - began


def counts(url: str) -> Json:
    """Executions in the hot tables and in the history, and the history's days."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("""
            SELECT (SELECT count(*) FROM konduit_executions),
                   (SELECT count(*) FROM konduit_tasks),
                   (SELECT count(*) FROM konduit_history_executions),
                   (SELECT count(*) FROM konduit_history_tasks),
                   (SELECT count(*) FROM konduit_history_days()),
                   pg_database_size(current_database())""").fetchone()
    assert row is not None
    return {"executions_hot": int(row[0]), "tasks_hot": int(row[1]),
            "executions_history": int(row[2]), "tasks_history": int(row[3]),
            "history_days": int(row[4]), "database_mb": _r(int(row[5]) / 2**20)}


def history_load(fresh: Callable[[], AbstractContextManager[str]],
                 copy: Callable[[str], AbstractContextManager[str]], *,
                 history: int, executions: int = 50, width: int = 20, fill_width: int = 4,
                 days: int = 30, repeats: int = 3, warm: int = 30,
                 progress: Callable[[str], None] = lambda _: None) -> Json:
    """The throughput load on an empty database, on one holding ``history`` finished
    executions in the history partitions and on one holding them in the hot tables;
    ``fresh()`` makes a migrated scratch database, ``copy(url)`` a copy of one."""
    with fresh() as empty, fresh() as hot:
        progress(f"bench: history_load: writing {history:,} finished executions ...")
        filled = fill_hot(hot, executions=history, width=fill_width, days=days)
        progress(f"bench: history_load: written in {filled:.0f} s; copying the database ...")
        began = time.perf_counter()
        with copy(hot) as moved:
            copied = time.perf_counter() - began
            progress(f"bench: history_load: copied in {copied:.0f} s; moving into the history ...")
            moving = move_all(moved)
            progress(f"bench: history_load: moved in {moving:.0f} s")
            urls = {"empty": empty, "history": moved, "hot": hot}
            shape = {name: counts(url) for name, url in urls.items()}
            _check(shape["history"]["executions_history"] == history
                   and shape["history"]["executions_hot"] == 0
                   and shape["history"]["tasks_hot"] == 0
                   and shape["history"]["tasks_history"] == history * fill_width
                   and shape["hot"]["executions_hot"] == history
                   and shape["empty"]["executions_hot"] == 0,
                   f"history_load: the databases are not what they should be: {shape}")
            runs: dict[str, list[Json]] = {name: [] for name in VARIANTS}
            failed: dict[str, list[str]] = {name: [] for name in VARIANTS}
            for r in range(repeats):
                order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
                for name in order:
                    try:
                        run = throughput_run(urls[name], executions=executions, width=width,
                                             warm=warm, label=f"history-load-{name}")
                    except BenchError as exc:
                        # Kept in the report (a database the load stalls on is the finding),
                        # and the other runs go on.
                        failed[name].append(str(exc))
                        progress(f"bench: history_load: round {r + 1}/{repeats}, {name}: {exc}")
                        continue
                    runs[name].append(run)
                    progress(f"bench: history_load: round {r + 1}/{repeats}, {name}: "
                             f"{run['tasks_per_second']} tasks/s")
    median = {name: _r(statistics.median(r["tasks_per_second"] for r in runs[name]))
              if runs[name] else None for name in VARIANTS}
    branches = {name: _r(statistics.median(r["branch_tasks_per_second"] for r in runs[name]))
                if runs[name] else None for name in VARIANTS}
    rows_each = 1 + 4 * fill_width
    return {
        "parameters": {
            "history_executions": history, "fill_width": fill_width,
            "history_rows": history * rows_each, "history_days": days,
            "fill": f"{history:,} finished executions of {fill_width} root steps (an execution, "
                    f"and per step a step, a task, an attempt and an output: {rows_each} rows "
                    f"each) over the {days} UTC days before today, written with SQL",
            "history": "a copy of the hot database, every row copied into the history "
                       "partitions as konduit_history_move copies it, the hot tables truncated, "
                       "VACUUM ANALYZE",
            "executions": executions, "workflow": f"bench-roots-{width}: {width} no-op root "
            "branches + a join", "processes": 1, "concurrency": 8, "warm_executions": warm,
            "repeats": repeats,
            "order": "the three databases take turns, the order rotated each round"},
        "results": {
            "seconds_to_fill": _r(filled), "seconds_to_copy": _r(copied),
            "seconds_to_move": _r(moving), "databases": shape,
            **{f"{name}_tasks_per_second": median[name] for name in VARIANTS},
            **{f"{name}_branch_tasks_per_second": branches[name] for name in VARIANTS},
            "runs_tasks_per_second": {name: [r["tasks_per_second"] for r in runs[name]]
                                      for name in VARIANTS},
            "runs_failed": failed,
            "runs_commits_per_task": {name: [r["commits_per_task"] for r in runs[name]]
                                      for name in VARIANTS},
            "join_dispatch_p99_ms": {name: [r["join_dispatch_latency"].get("p99_ms")
                                            for r in runs[name]] for name in VARIANTS}},
        "ratios": {"history_over_empty": ratio(median["history"], median["empty"]),
                   "hot_over_empty": ratio(median["hot"], median["empty"]),
                   "history_over_hot": ratio(median["history"], median["hot"])},
    }
